"""The llama-server cost profile (specaudit/audit/llamacpp_cost.py) on made-up streams.

The live test (tests/test_llama_live.py::test_estimate_...) measures it on real servers;
here the arithmetic: forwards counted from the streamed predicted_ms, r from the
unstreamed twins, and the refusals.
"""
from __future__ import annotations

import pytest

from specaudit.audit.llamacpp_cost import forwards, profile_from_runs


def chunks(per_step: list, step_ms: float) -> list:
    """A timings_per_token stream: the first token (prefill), then per verify step its
    tokens sharing one predicted_ms, then the final response repeating the last."""
    out, n, t = [(1, 0.001)], 1, 0.0
    for k in per_step:
        t += step_ms
        for _ in range(k):
            n += 1
            out.append((n, t))
    return out + [out[-1]]


def test_forwards_counts_distinct_clock_values_after_the_first_token():
    assert forwards(chunks([3, 4, 1, 2], 3.0)) == (4, 12.0, 10)
    with pytest.raises(ValueError, match="timings_per_token"):
        forwards([(1, 0.001)])


def test_r_is_the_step_time_over_the_plain_token_time():
    spec = [(chunks([4] * 50, 3.0), "abc", {"content": "abc", "timings": {"predicted_ms": 160.0}})]
    plain = [{"timings": {"predicted_n": 201, "predicted_ms": 100.0}}]      # 0.5 ms per plain token
    prof = profile_from_runs(spec, plain, k=6)
    (e,) = prof.entries
    # 160 ms over the stream's 50 forwards = 3.2 ms a step, against 0.5 ms: r = 6.4
    assert e.r == pytest.approx(6.4) and (e.n_nodes, e.concurrency) == (7, 1)
    assert prof.meta["spec_forwards"] == 50 and prof.source == "measured"
    assert prof.lookup(7, 1)[0] == pytest.approx(6.4)


def test_a_twin_that_decoded_differently_is_refused():
    spec = [(chunks([4] * 5, 3.0), "abc", {"content": "abd", "timings": {"predicted_ms": 16.0}})]
    with pytest.raises(ValueError, match="different text"):
        profile_from_runs(spec, [{"timings": {"predicted_n": 21, "predicted_ms": 10.0}}], k=6)
    with pytest.raises(ValueError, match="both servers"):
        profile_from_runs([], [], k=6)


def test_the_script_refuses_a_remote_url_in_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    p = tmp_path / "p.txt"
    p.write_text("def f():\n")
    r = subprocess.run([sys.executable, str(repo / "scripts" / "llama_cost_profile.py"), "--spec",
                        "http://example.com:8080", "--plain", "http://127.0.0.1:9", "--k", "6", "--prompts", p,
                        "--out", tmp_path / "c.json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "loopback" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([sys.executable, str(repo / "scripts" / "llama_cost_profile.py"), "--spec",
                        "http://127.0.0.1:9", "--plain", "http://127.0.0.1:9", "--k", "6", "--prompts", p,
                        "--out", tmp_path / "c.json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "error" in r.stderr and "Traceback" not in r.stderr, r.stderr
