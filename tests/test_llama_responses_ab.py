"""`specaudit ab` from llama-server response exports (specaudit/audit/sources/llamacpp_responses.py).

Synthetic exports in the shape the live tests save (tests/test_llama_live.py runs the real
servers): one /completion response per line with its timings, plus the concurrency the
client ran at. Speculation off writes no draft_n: tokens/s are compared, the acceptance is
stated on the one side that has it.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def export(path: Path, tps: list, spec: bool, concurrency=1) -> Path:
    rows = []
    for i, v in enumerate(tps):
        t = {"predicted_n": 400, "predicted_ms": 400 / v * 1000, "predicted_per_second": v}
        if spec:
            t.update(draft_n=1200, draft_n_accepted=150 + 10 * (i % 5))
        rows.append({"prompt": f"p{i}", "content": "x", "concurrency": concurrency, "timings": t})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def ab(*args):
    return subprocess.run([sys.executable, "-m", "specaudit", "ab", *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def test_reader_one_window_per_response(tmp_path):
    from specaudit.audit.sources.llamacpp_responses import looks_like, read_responses
    on = export(tmp_path / "on.jsonl", [900.0, 1100.0], True)
    off = export(tmp_path / "off.jsonl", [2600.0], False)
    assert looks_like(on) and looks_like(off) and not looks_like(tmp_path / "missing.jsonl")
    r = read_responses(on)
    assert [w.gen_tps for w in r.windows] == [900.0, 1100.0] and r.config["speculation"] == "on"
    assert r.windows[0].accepted_tokens == 150 and r.windows[0].draft_tokens == 1200
    assert r.windows[0].accept_len is None          # no verify-step count in timings: none made up
    r = read_responses(off)
    assert r.config["speculation"] == "off" and r.windows[0].draft_tokens is None and r.windows[0].concurrency == 1


@pytest.mark.parametrize("faster", ["off", "on"])
def test_off_vs_on_decided_on_tokens_per_s_acceptance_on_one_side(tmp_path, faster):
    slow, fast = [900.0 + 20 * (i % 7) for i in range(20)], [2600.0 + 40 * (i % 5) for i in range(20)]
    off = export(tmp_path / "off.jsonl", fast if faster == "off" else slow, False)
    on = export(tmp_path / "on.jsonl", slow if faster == "off" else fast, True)
    out = tmp_path / "ab.json"
    res = ab(off, on, "--primary", "tokens_per_s", "--output-format", "json", "-o", out)
    assert res.returncode == 0, res.stdout + res.stderr
    d = json.loads(out.read_text())
    assert d["matched"]["tokens_per_s"]["verdict"] == ("A better" if faster == "off" else "B better")
    assert list(d["matched"]) == ["tokens_per_s"]                  # nothing compared with nothing
    assert d["one_sided_metrics"]["accept_rate"]["side"] == "B"
    assert abs(d["one_sided_metrics"]["accept_rate"]["mean"] - 0.15) < 0.01
    assert any("exists on side B only" in w for w in d["warnings"])
    assert any("speculation off" in w for w in d["warnings"])
    text = ab(off, on, "--primary", "tokens_per_s")
    assert "accept rate exists on side B only" in text.stdout, text.stdout


def test_bad_export_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timings": {"predicted_n": 4, "predicted_per_second": 10}}\n{"timings": {"predicted_n": 4, '
                   '"predicted_per_second": "fast"}}\n')
    on = export(tmp_path / "on.jsonl", [900.0] * 5, True)
    res = ab(bad, on, "--primary", "tokens_per_s")
    assert res.returncode == 2 and "line 2" in res.stderr and "predicted_per_second" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    # no concurrency saved by the client: said, not guessed
    nc = tmp_path / "nc.jsonl"
    nc.write_text("".join(json.dumps({"timings": {"predicted_n": 4, "predicted_per_second": 10.0 + i}}) + "\n"
                          for i in range(5)))
    res = ab(nc, on, "--primary", "tokens_per_s")
    assert res.returncode == 2 and "running" in res.stderr, res.stderr
