"""`specaudit ab`: arm parsing, confounder warnings, bootstrap verdicts, and a real interleaved run."""
from __future__ import annotations

import json

import numpy as np
import pytest

from specaudit.ab_verdict import verdict
from specaudit.audit.diff import diff_runs
from specaudit.cli import main
from specaudit.tokenizer import default_prompts
from specaudit.trace.schema import discover
from specaudit.traced_ab import (
    confounding_warnings,
    format_text,
    parse_arm,
    run_ab,
    settings_differ,
    summarize,
)


def test_parse_arm_uses_run_options():
    a = parse_arm("--algo tree --budget 12", "a")
    assert (a["algo"], a["budget"], a["topk"], a["concurrency"]) == ("tree", 12, 4, 1)  # run's topk default
    assert parse_arm("--algo tree --budget 2", "a")["topk"] == 2
    c = parse_arm("", "b")
    assert (c["algo"], c["budget"], c["topk"], c["eos_id"], c["dtype"]) == ("chain", 7, 1, 0, "float32")
    assert parse_arm("--inject stale-draft --max-new-tokens 16", "b")["inject"] == "stale-draft"


@pytest.mark.parametrize("text,needle", [
    ("--num-prompts 3", "--a: unrecognized arguments: --num-prompts 3"),
    ("--algo beam", "--a: argument --algo: invalid choice"),
    ("--budget seven", "invalid int value"),
    ("--algo 'tree", "cannot split"),
])
def test_parse_arm_bad(text, needle):
    with pytest.raises(ValueError, match=None) as e:
        parse_arm(text, "a")
    assert needle in str(e.value)


def test_settings_and_confounders():
    chain = parse_arm("--algo chain --budget 7")
    tree1 = parse_arm("--algo tree --budget 7 --topk 1")
    assert settings_differ(chain, tree1) == {"algo": ["chain", "tree"]}
    assert confounding_warnings(settings_differ(chain, tree1), None) == []
    assert confounding_warnings(settings_differ(chain, tree1), ["algo"]) == []
    # the seed case's trap: the tree also ran at another concurrency and dtype
    conf = parse_arm("--algo tree --budget 7 --topk 1 --concurrency 4 --dtype bfloat16")
    d = settings_differ(chain, conf)
    assert list(d) == ["algo", "concurrency", "dtype"]
    w = confounding_warnings(d, ["algo"])
    assert len(w) == 1 and "concurrency, dtype" in w[0] and "confounded" in w[0]
    w = confounding_warnings(d, None)
    assert len(w) == 1 and "differ in 3 settings" in w[0] and "--vary" in w[0]
    w = confounding_warnings(settings_differ(chain, tree1), ["algo", "topk"])
    assert w == ["--vary topk: A and B have the same topk"]


@pytest.mark.parametrize("ci,base,expect", [
    ([0.0, 0.0], 3.0, "same"),
    ([-0.05, 0.05], 3.0, "same"),        # within 2% of 3.0
    ([0.5, 1.0], 3.0, "B better"),
    ([-1.0, -0.2], 3.0, "A better"),
    ([-0.5, 1.0], 3.0, "undecided"),
    ([float("nan"), 1.0], 3.0, "undecided"),
])
def test_verdict(ci, base, expect):
    assert verdict(ci, base, 0.02) == expect


def _cells(a_depth, b_depth, steps=10.0, a_cost=None, b_cost=None):
    """[R, P] cells; depth arrays are [P] (one repeat) or [R, P]."""
    a_depth, b_depth = np.atleast_2d(a_depth), np.atleast_2d(b_depth)
    one = np.full(a_depth.shape, steps)
    return {"a_depth": a_depth * steps, "b_depth": b_depth * steps,
            "a_commit": (a_depth + 1) * steps, "b_commit": (b_depth + 1) * steps,
            "a_steps": one, "b_steps": one, "a_tokens": one * 30, "b_tokens": one * 30,
            "a_cost": one if a_cost is None else a_cost, "b_cost": one if b_cost is None else b_cost}


def test_summarize_bootstrap():
    rng = np.random.default_rng(1)
    base = rng.uniform(1, 4, size=12)
    # identical arms: the paired difference is exactly zero in every resample
    s = summarize(_cells(base, base), 0.02, 500)
    assert s["accepted_depth"]["diff_b_minus_a"]["ci95"] == [0.0, 0.0]
    assert all(s[m]["verdict"] == "same" for m in s)
    lo, hi = s["accepted_depth"]["a"]["ci95"]
    assert lo < s["accepted_depth"]["a"]["mean"] < hi  # spread over prompts gives a real interval
    # B accepts one more draft on every prompt: B better on depth and commit, tokens/s the same
    s = summarize(_cells(base, base + 1), 0.02, 500)
    assert s["accepted_depth"]["verdict"] == "B better" and s["commit_len"]["verdict"] == "B better"
    assert s["accepted_depth"]["diff_b_minus_a"]["mean"] == pytest.approx(1.0)
    assert s["tokens_per_s"]["verdict"] == "same"
    # a noisy difference of zero mean on few prompts: undecided
    noise = np.array([1.0, -1.0, 0.8, -0.9])
    s = summarize(_cells(base[:4], base[:4] + noise), 0.02, 500)
    assert s["accepted_depth"]["verdict"] == "undecided"


def test_run_level_shift_is_not_certainty():
    """B's first run was slow on every request (the machine was busy), its second fast:
    resampling requests alone would call it; resampling repeats too leaves it undecided."""
    P = 10
    rng = np.random.default_rng(3)
    jitter = rng.uniform(0.95, 1.05, size=(2, P))
    a_cost = np.ones((2, P)) * jitter
    b_cost = np.vstack([np.full(P, 2.0), np.full(P, 0.8)]) * jitter[::-1]
    depth = np.full((2, P), 2.0)
    s = summarize(_cells(depth, depth, a_cost=a_cost, b_cost=b_cost), 0.02, 1000)
    assert s["tokens_per_s"]["verdict"] == "undecided"
    lo, hi = s["tokens_per_s"]["diff_b_minus_a"]["ci95"]
    assert lo < 0 < hi
    # the same per-request numbers as if from one run each: requests alone look decisive
    one = {k: v.sum(axis=0, keepdims=True) for k, v in _cells(depth, depth, a_cost=a_cost, b_cost=b_cost).items()}
    assert summarize(one, 0.02, 1000)["tokens_per_s"]["verdict"] != "undecided"


def cli(capsys, *argv):
    code = main(["ab", *map(str, argv)])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize("extra,needle", [
    (["--a=--num-prompts 2"], "--a: unrecognized arguments"),
    (["--a=--device tpu"], "--a: --device 'tpu' is not a device torch knows"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--vary", "colour"], "--vary colour: not a setting"),
    (["--num-prompts", "0"], "--num-prompts"),
    (["--prompts", "/nonexistent.jsonl"], "not found"),
    (["--same-within", "2"], "--same-within"),
])
def test_cli_bad_input(capsys, tmp_path, extra, needle):
    argv = ["--a=--algo chain", "--b=--algo tree --topk 1", "--out", tmp_path / "ab"]
    if extra[0].startswith("--a="):
        argv[0] = extra[0]
        extra = []
    code, _, err = cli(capsys, *argv, *extra)
    assert code == 2 and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_cli_refuses_existing_result(capsys, tmp_path):
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "ab.json").write_text("{}")
    code, _, err = cli(capsys, "--a=", "--b=--algo tree --topk 1", "--out", tmp_path / "ab")
    assert code == 2 and "already holds an A/B result" in err


# ------------------------------------------------------------------ real runs

def _verdict_follows_its_interval(m: dict, same_within: float = 0.02) -> None:
    """The documented rule, spelled out: `same` when the 95% interval of B - A lies within
    +-2% of A, `B better` / `A better` when it excludes 0 on that side, else `undecided`."""
    lo, hi = m["diff_b_minus_a"]["ci95"]
    band = abs(m["a"]["mean"]) * same_within
    want = ("same" if -band <= lo and hi <= band else "B better" if lo > 0 else "A better" if hi < 0
            else "undecided")
    assert m["verdict"] == want, m



def test_chain_vs_topk1_tree_same_acceptance(tmp_path, models):
    """The seed case done right: a topk=1 tree is the chain, so acceptance is the same."""
    prompts = default_prompts()[:3]
    res = run_ab(parse_arm("--algo chain --budget 7 --max-new-tokens 24"),
                 parse_arm("--algo tree --budget 7 --topk 1 --max-new-tokens 24"),
                 prompts=prompts, repeats=2, out=tmp_path / "ab", n_boot=400,
                 load_models=lambda device, dtype: models)
    assert res["order"] == ["A", "B", "B", "A"]
    assert res["settings_differ"] == {"algo": ["chain", "tree"]}
    assert not [w for w in res["warnings"] if "differ" in w]
    for m in ("accepted_depth", "commit_len"):
        x = res["metrics"][m]
        assert x["a"]["mean"] == x["b"]["mean"] and x["diff_b_minus_a"]["ci95"] == [0.0, 0.0]
        assert x["verdict"] == "same"
    assert res["metrics"]["commit_len"]["a"]["mean"] > 1.0  # the drafter really is accepted
    assert res["outputs_identical"] == {"prompts": 3, "of": 3}
    tps = res["metrics"]["tokens_per_s"]
    assert tps["a"]["mean"] > 0 and tps["a"]["ci95"][0] <= tps["a"]["mean"] <= tps["a"]["ci95"][1]
    _verdict_follows_its_interval(tps)     # timing noise may decide either way; the rule may not
    saved = json.loads((tmp_path / "ab" / "ab.json").read_text())
    assert saved["metrics"] == json.loads(json.dumps(res["metrics"]))
    # both datasets hold one traced run per repeat, and each pair diffs clean
    ra = sorted(discover([tmp_path / "ab" / "a"]), key=lambda r: r.run_id)
    rb = sorted(discover([tmp_path / "ab" / "b"]), key=lambda r: r.run_id)
    assert [r.run_id for r in ra] == res["a"]["runs"] and len(rb) == 2
    assert all(r.complete for r in ra + rb)
    assert diff_runs(ra[0].run_dir, rb[1].run_dir).clean
    text = format_text(res)
    assert "order A B B A" in text and "algo 'chain' -> 'tree'" in text
    assert "mean accepted depth" in text and text.count("same") >= 2


def test_stale_draft_is_worse_and_confounders_warned(tmp_path, models):
    prompts = default_prompts()[3:7]
    res = run_ab(parse_arm("--algo chain --max-new-tokens 24"),
                 parse_arm("--algo chain --max-new-tokens 24 --inject stale-draft --concurrency 2"),
                 prompts=prompts, repeats=1, out=tmp_path / "ab", n_boot=400, vary=["inject"],
                 primary="accepted_depth", load_models=lambda device, dtype: models, warmup=False)
    assert res["order"] == ["A", "B"]
    assert set(res["settings_differ"]) == {"inject", "concurrency", "batch"}
    assert res["settings_differ"]["batch"] == [1.0, pytest.approx(res["b"]["mean_batch"], abs=1e-3)]
    assert 1.0 < res["b"]["mean_batch"] <= 2.0
    assert any("concurrency" in w and "confounded" in w for w in res["warnings"])
    assert any("observed batch differs" in w for w in res["warnings"])
    d = res["metrics"]["accepted_depth"]
    assert d["b"]["mean"] < d["a"]["mean"] and d["diff_b_minus_a"]["ci95"][1] < 0
    assert res["verdict"] == d["verdict"] == "A better"


def test_cli_ab_end_to_end(capsys, tmp_path, monkeypatch, models):
    """The CLI wiring, with the session's models instead of a second load."""
    from specaudit import traced_ab as ab_arms
    monkeypatch.setattr(ab_arms, "_default_loader", lambda: (lambda device, dtype: models))
    code, out, err = cli(capsys, "--a=--max-new-tokens 12", "--b=--max-new-tokens 12 --algo tree --topk 1",
                         "--num-prompts", "2", "--repeats", "1", "--bootstrap", "200", "--out", tmp_path / "ab",
                         "--no-progress", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["prompts"] == 2 and res["repeats"] == 1
    assert res["verdict"] == res["metrics"]["tokens_per_s"]["verdict"]      # the primary metric's
    _verdict_follows_its_interval(res["metrics"]["tokens_per_s"])
    assert res["metrics"]["accepted_depth"]["verdict"] == "same"
    assert (tmp_path / "ab" / "ab.json").exists()
    # a bad arm is refused before anything runs
    code, _, err = cli(capsys, "--a=--budget 0", "--b=", "--out", tmp_path / "ab2", "--no-progress")
    assert code == 2 and "--a: --budget must be at least 1" in err
    assert not (tmp_path / "ab2").exists()
