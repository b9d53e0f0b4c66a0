"""AIPerf, NVIDIA's benchmark client, against `specaudit serve`, audited by the trace.

AIPerf runs from its own virtual environment (scripts/test.sh installs it into
.venv-aiperf: it pins its own versions of shared packages, and it must not see our
torch); SPECAUDIT_AIPERF names another `aiperf` executable. Its tokenizer is the byte
tokenizer written by specaudit.serve.hf_tokenizer, so nothing is downloaded.

Healthy server: AIPerf's per-request and run-level acceptance length and draft acceptance
rate equal the figures re-derived from the same run's trace (the accepted paths), for
completions and chat, streaming and not, at concurrency 2-4. With --inject
bonus-double-count AIPerf reports the inflated figures, and `specaudit check EXPORT
TRACE` names the disagreement (SA590).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ci import module_needs
from live_procs import run_aiperf

REPO = Path(__file__).resolve().parents[1]
AIPERF = Path(os.environ.get("SPECAUDIT_AIPERF") or REPO / ".venv-aiperf" / "bin" / "aiperf")

pytestmark = pytest.mark.slow
module_needs(AIPERF.exists(), f"AIPerf not installed at {AIPERF}")

N_REQUESTS = 6


@pytest.fixture(scope="module")
def client_files(tmp_path_factory):
    from specaudit.serve.hf_tokenizer import write
    from specaudit.tokenizer import default_prompts
    d = tmp_path_factory.mktemp("aiperf-inputs")
    tok = write(d / "tokenizer")
    prompts = d / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": p[:160]}) + "\n" for p in default_prompts()[:N_REQUESTS]))
    return tok, prompts


def aiperf(srv, files, out: Path, endpoint: str, streaming: bool, concurrency: int) -> Path:
    """One `aiperf profile` run; returns its artifact folder."""
    tok, prompts = files
    cmd = [str(AIPERF), "profile", "--model", srv.model, "--url", srv.url, "--endpoint-type", endpoint,
           "--concurrency", str(concurrency), "--request-count", str(N_REQUESTS), "--tokenizer", str(tok),
           "--input-file", str(prompts), "--custom-dataset-type", "single_turn", "--osl", "24",
           "--artifact-dir", str(out), "--ui", "none", "--random-seed", "7"] + (["--streaming"] if streaming else [])
    run_aiperf(cmd, out)
    return out


def match(srv, art: Path, every: bool = True) -> tuple[dict, dict]:
    """AIPerf's records by x_request_id, and the trace's figures of the same requests
    (the server names them cmpl-<X-Request-ID> / chatcmpl-<X-Request-ID>). The server is
    closed first: its last step rows are on disk."""
    from specaudit.audit.client_vs_trace import aiperf_records, trace_figures
    srv.close()
    recs = aiperf_records(art / "profile_export.jsonl")
    assert len(recs) == N_REQUESTS or not every
    traced = trace_figures([srv.run_dir])
    pairs = {x: traced.get("cmpl-" + x) or traced.get("chatcmpl-" + x) for x in recs}
    assert all(pairs.values()), "every AIPerf request is in the trace under its X-Request-ID"
    match.traced = traced
    return recs, pairs


def run_level(art: Path) -> dict:
    d = json.loads((art / "profile_export_aiperf.json").read_text())
    return {k: d[k]["avg"] for k in ("spec_decode_acceptance_length", "spec_decode_draft_acceptance_rate",
                                     "spec_decode_token_weighted_acceptance_length",
                                     "spec_decode_overall_draft_acceptance_rate")}


@pytest.fixture
def healthy(models, tmp_path):
    from specaudit.serve.server import SpecServer
    srv = SpecServer(trace_dir=tmp_path / "traces", models=models, port=0, concurrency=4, max_new_tokens=64)
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.mark.parametrize("endpoint,streaming,concurrency", [
    ("completions", True, 2), ("chat", False, 4), ("chat", True, 3)])
def test_aiperf_reports_what_the_trace_derives(healthy, client_files, tmp_path, endpoint, streaming, concurrency):
    art = aiperf(healthy, client_files, tmp_path / "art", endpoint, streaming, concurrency)
    recs, pairs = match(healthy, art)
    for xid, rec in recs.items():                           # per request: the same figures
        t = pairs[xid]
        assert (rec["steps"], rec["drafted"], rec["accepted"]) == (t.steps, t.drafted, t.accepted), xid
        assert rec["accept_len"] == pytest.approx(t.accept_len, rel=1e-12)
        assert rec["accept_rate"] == pytest.approx(t.accept_rate, rel=1e-12)
    run = run_level(art)                                    # run level: per-request mean and pooled
    steps = sum(t.steps for t in pairs.values())
    acc = sum(t.accepted for t in pairs.values())
    drafted = sum(t.drafted for t in pairs.values())
    assert run["spec_decode_acceptance_length"] == pytest.approx(
        sum(t.accept_len for t in pairs.values()) / len(pairs), rel=1e-12)
    assert run["spec_decode_draft_acceptance_rate"] == pytest.approx(
        100 * sum(t.accept_rate for t in pairs.values()) / len(pairs), rel=1e-12)
    assert run["spec_decode_token_weighted_acceptance_length"] == pytest.approx(1 + acc / steps, rel=1e-12)
    assert run["spec_decode_overall_draft_acceptance_rate"] == pytest.approx(100 * acc / drafted, rel=1e-12)
    assert 1 < run["spec_decode_token_weighted_acceptance_length"] <= healthy.budget + 1
    from specaudit.audit.client_vs_trace import compare_paths
    assert [f for f in compare_paths([art / "profile_export.jsonl"], [healthy.run_dir]) if f.severity == "error"] == []


def test_aiperf_shows_the_inflated_figure_and_check_names_it(models, client_files, tmp_path, capsys):
    from specaudit.cli import main
    from specaudit.serve.server import SpecServer
    srv = SpecServer(trace_dir=tmp_path / "traces", models=models, port=0, concurrency=3, max_new_tokens=64,
                     inject="bonus-double-count").start()
    try:
        art = aiperf(srv, client_files, tmp_path / "art", "completions", False, 3)
        recs, pairs = match(srv, art, every=False)
    finally:
        srv.close()
    for xid, rec in recs.items():     # the bonus counted as a draft: one more accepted per step
        t = pairs[xid]
        assert rec["accepted"] == t.accepted + t.steps and rec["accept_len"] == pytest.approx(t.accept_len + 1)
    # AIPerf drops a record whose accepted count exceeds its drafted count (a request whose
    # every draft was accepted, inflated by one per step): exactly those are missing
    inflated_past_drafted = {rid for rid, t in match.traced.items() if t.accepted + t.steps > t.drafted}
    missing = {rid for rid in match.traced if rid.split("-", 1)[1] not in recs}
    assert missing == inflated_past_drafted and len(recs) >= 1
    steps = sum(t.steps for t in pairs.values())
    acc = sum(t.accepted for t in pairs.values())
    assert run_level(art)["spec_decode_token_weighted_acceptance_length"] == pytest.approx(1 + (acc + steps) / steps)
    capsys.readouterr()
    code = main(["check", str(art / "profile_export.jsonl"), str(srv.run_dir), "--output-format", "json"])
    out = capsys.readouterr().out
    assert code == 1
    found = json.loads(out)
    items = found["findings"] if isinstance(found, dict) else found
    mine = [f for f in items if f["code"] == "SA590"]
    assert {f["values"]["figure"] for f in mine} >= {"accepted", "accept_len", "accept_rate"}
    some = next(f for f in mine if f["values"]["figure"] == "accept_len")
    assert some["values"]["reported"] == pytest.approx(some["values"]["derived"] + 1)
