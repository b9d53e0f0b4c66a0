"""The seed bug inside a real engine: llama.cpp patched to miscount, caught from its own outputs.

Each diff under tests/fixtures/llamacpp_patches/ reproduces one real bug class in a copy of
the pinned llama.cpp source; scripts/llama_server_build.py --patch applies it, rebuilds
incrementally (only the touched files), caches the binary by the diff's hash and restores
the tree (the pristine binary is a separate copy). The patched server runs the same greedy
requests as a pristine one with the same settings, and specaudit, reading only what the
engine itself gives (its log, the responses' timings, /metrics, the greedy tokens), must
report the class on the patched run and nothing on the pristine one.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from test_llama_live import Recorded, cli, gguf_pair, llama_bin, server_args  # noqa: E402,F401  (fixtures)

sys.path.insert(0, str(REPO / "scripts"))
import llama_server_build as B  # noqa: E402

PATCHES = REPO / "tests" / "fixtures" / "llamacpp_patches"
MIN_ARGS = ("--spec-draft-p-min", "0.5", "--spec-draft-n-min", "3")   # short drafts happen and are dropped
CASES = {   # diff -> (extra server arguments, the codes specaudit must report from the engine's outputs)
    "bonus-counted-as-accepted.diff": ((), {"SA596"}),
    "draft-below-min-counted-as-generated.diff": (MIN_ARGS + ("-v",), {"SA595"}),
}


def patched_bin(name: str) -> Path:
    try:
        return Path(B.ensure_patched(PATCHES / name)["binary"])
    except B.StepError as e:
        pytest.fail(str(e), pytrace=False)


def codes_of(run: Recorded) -> tuple[set, dict]:
    res = cli("check", run.log, run.resp_path, run.before, run.after, "--select", "SA59,SA7",
              "--output-format", "json")
    assert res.returncode in (0, 1), res.stdout + res.stderr
    rep = json.loads(res.stdout)
    return {f["code"] for f in rep["findings"] if f["severity"] == "error"}, rep


def test_every_patch_is_a_small_named_diff_of_the_pinned_tree():
    names = sorted(p.name for p in PATCHES.glob("*.diff"))
    assert names == sorted([*CASES, "unverified-draft-accepted.diff"])
    for n in names:
        text = (PATCHES / n).read_text()
        files = B.touched_files(text)
        assert files and all((B.Layout().tree / f).exists() for f in files), (n, files)
        assert sum(ln.startswith(("+", "-")) and not ln.startswith(("+++", "---")) for ln in text.splitlines()) <= 16


@pytest.mark.parametrize("patch", sorted(CASES))
def test_the_patched_engine_is_caught_and_the_pristine_one_is_not(patch, llama_bin, gguf_pair, tmp_path):  # noqa: F811
    extra, expect = CASES[patch]
    args = server_args(gguf_pair, 6, *extra)
    bad = Recorded(patched_bin(patch), args, tmp_path / "patched")
    got, rep = codes_of(bad)
    assert expect <= got, (patch, got, [f["message"] for f in rep["findings"]][:5])
    good = Recorded(llama_bin, args, tmp_path / "pristine")
    got, rep = codes_of(good)
    assert got == set(), (patch, [f["message"] for f in rep["findings"] if f["severity"] == "error"][:5])


def test_an_unverified_draft_accepted_breaks_the_greedy_output(llama_bin, gguf_pair, tmp_path):  # noqa: F811
    off = Recorded(llama_bin, server_args(gguf_pair, None), tmp_path / "off")
    bad = Recorded(patched_bin("unverified-draft-accepted.diff"), server_args(gguf_pair, 6), tmp_path / "patched")
    res = cli("lossless", "--greedy", off.resp_path, bad.resp_path, "--output-format", "json")
    assert res.returncode == 1, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert not out["identical"] and out["diffs"]
    # its counters stay self-consistent: only the output tells
    got, _ = codes_of(bad)
    print(json.dumps({"unverified_draft_counter_codes": sorted(got), "diffs": len(out["diffs"])}))
