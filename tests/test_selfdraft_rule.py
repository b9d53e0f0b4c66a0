"""SA735 (a self-draft rejected) and the vLLM start-up lines it reads (issue 37)."""
from __future__ import annotations

from pathlib import Path

import pytest
from specaudit.invariants import get_rule

from specaudit.audit.sources import audit_file, read_source
from specaudit.audit.sources.vllm_startup import self_draft, startup

FIX = Path(__file__).parent / "fixtures" / "engines"

ARGS = ("(APIServer pid=7) INFO 12-02 06:40:01 [api_utils.py:286] non-default args: {'host': '127.0.0.1', "
        "'model': '{t}', 'enforce_eager': True, 'speculative_config': {'model': '{d}', 'num_speculative_tokens': 4}}")
ENGINE = ("(EngineCore pid=9) INFO 12-02 06:40:09 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
          "model='{t}', speculative_config=SpeculativeConfig(method='{m}', model='{d}', num_spec_tokens=4), "
          "tokenizer='{t}', skip_tokenizer_init=False, dtype=torch.float32, device_config=cpu, seed=0")


def head(t="/m/t", d="/m/t", m="draft_model"):
    return (ARGS.replace("{t}", t).replace("{d}", d) + "\n"
            + ENGINE.replace("{t}", t).replace("{d}", d).replace("{m}", m) + "\n")


def spec_line(steps, counts, k=4):
    A, D = sum(counts), steps * k
    rates = ", ".join(f"{c / steps:.3f}" for c in counts)
    return (f"(APIServer pid=7) INFO 12-02 06:41:10 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: "
            f"{1 + A / steps:.2f}, Accepted throughput: {A / 10:.2f} tokens/s, Drafted throughput: {D / 10:.2f} "
            f"tokens/s, Accepted: {A} tokens, Drafted: {D} tokens, Per-position acceptance rate: {rates}, "
            f"Avg Draft acceptance rate: {100 * A / D:.1f}%\n")


def sa735(tmp_path, text):
    f = tmp_path / "server.log"
    f.write_text(text)
    return [x for x in audit_file(f) if x.code == "SA735"]


def test_startup_lines():
    cfg = {}
    for i, ln in enumerate(head().splitlines(), 1):
        cfg.update(startup(ln, i))
    assert cfg["target_model"] == "/m/t" and cfg["draft_model"] == "/m/t"
    assert cfg["spec_method"] == "draft_model" and cfg["engine_version"] == "0.32.0" and cfg["device"] == "cpu"
    assert cfg["draft_sample_method"] == "greedy" and cfg["num_spec_tokens"] == 4
    assert self_draft(cfg)
    # MTP / EAGLE may name the target's own folder: their heads draft, not the target
    assert not self_draft({"target_model": "/m/t", "draft_model": "/m/t", "spec_method": "mtp"})
    assert not self_draft({"target_model": "/m/t", "draft_model": "/m/d", "spec_method": "draft_model"})
    assert self_draft({"target_model": "/m/t/", "draft_model": "/m/t", "spec_method": "draft_model"})
    # a line that is not a dict literal (or a call in it) is ignored, never evaluated
    assert startup("INFO non-default args: {'model': __import__('os').getcwd()}", 1) == {}
    assert startup("INFO non-default args: {'model': 'x'", 1) == {}


def test_reader_keeps_startup(tmp_path):
    f = tmp_path / "server.log"
    f.write_text(head() + spec_line(381, [189, 0, 0, 0]))
    r = read_source(f)
    assert r.config["spec_method"] == "draft_model" and self_draft(r.config)


def test_stops_at_position_0(tmp_path):
    # the seeded run: 0.496, 0.000, 0.000, 0.000 over 381 steps
    fs = sa735(tmp_path, head() + spec_line(381, [189, 0, 0, 0]))
    assert len(fs) == 1 and fs[0].severity == "warning"
    m = fs[0].message
    assert "stops at position 0" in m and "189 of 381" in m and "0 of the 189" in m, m
    assert "vLLM 0.32.0 on cpu" in m and "every draft at temperature 0" in m, m


def test_collapse(tmp_path):
    # the unseeded run: Accepted 1 of 2252 drafted
    fs = sa735(tmp_path, head() + spec_line(563, [1, 0, 0, 0]))
    assert len(fs) == 1 and "1 of 2252 drafted tokens accepted (0.04%)" in fs[0].message, fs[0].message


def test_summed_over_windows(tmp_path):
    # each 10 s window alone is too small to judge; the file is not
    lines = "".join(spec_line(20, [10, 0, 0, 0]) for _ in range(8))
    fs = sa735(tmp_path, head() + lines)
    assert len(fs) == 1 and "80 of 160" in fs[0].message, fs[0].message


@pytest.mark.parametrize("counts", [
    [381, 381, 381, 381],        # temperature 0: every draft accepted
    [200, 110, 70, 45],          # a sampled self-draft whose positions decay slowly
    [189, 30, 5, 1],             # position 1 at 0.16 of position 0's 0.5: above a quarter
    [3, 0, 0, 0],                # too few drafts reached position 1 to judge (and 12 drafted)
])
def test_healthy_self_draft_is_quiet(tmp_path, counts):
    steps = 3 if counts[0] == 3 else 381
    assert sa735(tmp_path, head() + spec_line(steps, counts)) == []


def test_other_drafter_is_quiet(tmp_path):
    # the same numbers from a different draft model, or an MTP head, prove nothing
    assert sa735(tmp_path, head(d="/m/d") + spec_line(381, [189, 0, 0, 0])) == []
    assert sa735(tmp_path, head(m="mtp") + spec_line(381, [189, 0, 0, 0])) == []
    assert sa735(tmp_path, spec_line(381, [189, 0, 0, 0])) == []   # no start-up lines: unknown drafter


def test_fixtures():
    r = get_rule("SA735")
    assert "SA735" in {f.code for f in audit_file(FIX / r.fail_fixture)}
    assert audit_file(FIX / r.pass_fixture) == []


DATA = Path(__file__).parent / "data" / "vllm_anomaly"


def _live(d):
    """(verify steps, accepted at each position) of a live run (scripts/vllm_selfdraft_live.py):
    from the responses' per_step_accepted, the counts vLLM's own log line sums."""
    return d["verify_steps"], d["accepted_at_position"]


def test_measured_runs(tmp_path):
    import json
    # vLLM as shipped on a live server, as measured here (seeded and not): fires
    for name in ("live_seed.json", "live_noseed.json"):
        steps, counts = _live(json.loads((DATA / name).read_text()))
        assert sa735(tmp_path, head() + spec_line(steps, counts)), (name, counts)
    # healthy: temperature 0, and the live server with the control patch at temperature 0.8
    for name in ("live_greedy.json", "live_fix.json"):
        steps, counts = _live(json.loads((DATA / name).read_text()))
        assert sa735(tmp_path, head() + spec_line(steps, counts)) == [], (name, counts)
    # the control pass of the probe (the same requests, the temperature expanded correctly):
    # its per-position acceptance as a log line stays quiet
    pp = json.loads((DATA / "probe_seed.json").read_text())["control"]["summary"]["per_position"]
    steps, counts = pp[0]["tested"], [p["accepted"] for p in pp]
    assert sa735(tmp_path, head() + spec_line(steps, counts)) == [], counts
