"""The vLLM plugin without vLLM: version refusal, rows, the recorder's failure path.

The recorder is driven with the same dicts hooks.py captures from vLLM (a fake scheduler
config and fake requests), so the row building, the sink wiring and the incomplete
marking are checked in seconds; tests/test_vllm_live.py runs the real thing.
"""
from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from specaudit.integrations.vllm import plugin
from specaudit.integrations.vllm.rows import classify, finish_reason, step_row
from specaudit.integrations.vllm.sink import Recorder
from specaudit.integrations.vllm.versions import SUPPORTED, refusal

REPO = Path(__file__).resolve().parents[1]
NS = types.SimpleNamespace


def test_known_versions_pass_and_unknown_ones_are_refused_naming_the_supported():
    assert refusal("0.32.0") is None and refusal("0.32.0+cpu") is None
    why = refusal("0.31.2")
    assert "0.31.2" in why and all(v in why for v in SUPPORTED) and "\n" not in why


def test_register_refuses_an_unknown_vllm_only_when_tracing_is_asked(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", NS(__version__="0.40.0"))
    monkeypatch.setattr(plugin, "_recorder", None)
    monkeypatch.delenv(plugin.ENV, raising=False)
    plugin.register()                                   # off: nothing checked, nothing raised
    monkeypatch.setenv(plugin.ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match=r"vLLM 0\.40\.0 is not supported \(supported: 0\.32\.0\)"):
        plugin.register()


def _cfg():
    return NS(speculative_config=NS(num_speculative_tokens=3, method="ngram", draft_model_config=None, model=None),
              model_config=NS(model="/nonexistent", dtype="float32", seed=0, enforce_eager=True, max_model_len=512),
              scheduler_config=NS(max_num_seqs=4, async_scheduling=False),
              parallel_config=NS(data_parallel_size=1))


class _Req:
    def __init__(self, prompt, limit):
        self.prompt_token_ids, self.num_prompt_tokens = prompt, len(prompt)
        self.output_token_ids, self.limit = [], limit
        self.eos_token_id, self.arrival_time = 257, 1.0e9
        self.status = NS(name="RUNNING")

    def is_finished(self):
        return self.status.name != "RUNNING"


def _drive(rec, steps, miscount=False, drop_worker_at=None, rid="r0"):
    """One request: prefill (first token 10), then verify steps given as (drafts, argmax
    over root+drafts). Accepts the greedy prefix and commits it plus the bonus, as vLLM."""
    sched = NS(vllm_config=_cfg())
    req = _Req([1, 2, 3], limit=1 + sum(1 for _ in steps) * 4)
    kv = 0
    req.output_token_ids.append(10)
    rec.on_update(sched, {rid: {"req": req, "worker": None, "kv_before": 0, "n_sched": 3, "out_before": 0,
                                 "drafts": [], "sampled": [10]}}, {}, 1.0e9 + 1)
    kv = 3
    for i, (drafts, argmax) in enumerate(steps):
        n = 0
        while n < len(drafts) and drafts[n] == argmax[n]:
            n += 1
        sampled = drafts[:n] + [argmax[n]]
        root = req.output_token_ids[-1]
        N = len(drafts) + 1
        worker = {"node_tokens": [root, *drafts], "positions": list(range(kv, kv + N)), "target_argmax": argmax,
                  "target_margin": [1.0] * N, "batch_size": 1, "t_exec": 1.0e9 + i, "t_sample": 1.0e9 + i + 0.1}
        before = {"req": req, "worker": None if i == drop_worker_at else worker, "kv_before": kv, "n_sched": N,
                  "out_before": len(req.output_token_ids), "drafts": drafts, "sampled": sampled}
        req.output_token_ids += sampled
        if i == len(steps) - 1:
            req.status = NS(name="FINISHED_LENGTH_CAPPED")
        counters = {rid: (len(drafts), n + (1 if miscount and n else 0))} if drafts else {}
        rec.on_update(sched, {rid: before}, counters, 1.0e9 + i + 0.5)
        kv += len(sampled)
    return req


STEPS = [([5, 6, 7], [5, 6, 9, 4]), ([4, 4, 4], [4, 1, 2, 3]), ([], [8]), ([8, 8, 8], [8, 8, 8, 11])]


def _check(run_dir):
    p = subprocess.run([sys.executable, "-m", "specaudit", "check", str(run_dir), "--output-format", "json"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    return p.returncode, json.loads(p.stdout)


def test_recorded_steps_pass_the_catalog_and_carry_vllms_counters(tmp_path):
    rec = Recorder(str(tmp_path), "ok", flush_s=0.1, vllm_version="0.32.0")
    req = _drive(rec, STEPS)
    rec.close()
    rc, rep = _check(tmp_path / "run_id=ok")
    assert rc == 0 and rep["summary"]["violations"] == 0 and rep["summary"]["steps"] == 4, rep
    m = json.loads((tmp_path / "run_id=ok" / "run.json").read_text())
    assert m["reported"] == {"drafted_tokens": 9, "accepted_tokens": 2 + 1 + 3}
    # the keys vLLM has no counter for are declared with the reason: not checked, said as
    # information (SA514), never a warning on a healthy engine (SA512)
    from specaudit.trace.schema import REPORTED_KEYS
    assert set(m["not_reported"]) | set(m["reported"]) == set(REPORTED_KEYS), m["not_reported"]
    codes = {f["code"] for f in rep["findings"]}
    assert "SA512" not in codes and "SA514" in codes, rep["findings"]
    said = " ".join(f["message"] for f in rep["findings"] if f["code"] == "SA514")
    assert all(k in said for k in m["not_reported"]) and "num_drafts" in said, said
    assert not [f for f in rep["findings"] if f["severity"] == "warning"], rep["findings"]
    assert m["vllm_counters"]["num_drafts"] == 3 and "finished_at" in m and "incomplete" not in m
    import pyarrow.parquet as pq
    assert pq.read_table(tmp_path / "run_id=ok" / "requests.parquet").to_pylist()[0]["output_tokens"] == \
        req.output_token_ids


def test_a_miscounting_vllm_counter_is_caught_from_the_trace(tmp_path):
    rec = Recorder(str(tmp_path), "bad", flush_s=0.1, vllm_version="0.32.0")
    _drive(rec, STEPS, miscount=True)   # vLLM's counter says one more accepted draft than the path
    rec.close()
    rc, rep = _check(tmp_path / "run_id=bad")
    assert rc == 1 and rep["summary"]["violations"] > 0
    assert any(f["code"].startswith("SA3") for f in rep["findings"]), [f["code"] for f in rep["findings"]]


def test_a_failure_inside_the_plugin_marks_the_run_incomplete(tmp_path):
    rec = Recorder(str(tmp_path), "broken", flush_s=0.1, vllm_version="0.32.0")
    _drive(rec, STEPS, drop_worker_at=2)    # the worker's evidence of step 2 never arrived
    assert not rec.active and "worker evidence" in rec.failed
    rec.close()
    m = json.loads((tmp_path / "run_id=broken" / "run.json").read_text())
    assert "finished_at" not in m and "worker evidence" in m["incomplete"]
    rc, rep = _check(tmp_path / "run_id=broken")
    assert rc == 0 and rep["summary"]["incomplete_runs"] == 1
    assert any(f["code"] == "SA001" for f in rep["findings"])


def test_rows_classify_and_finish_reasons():
    assert classify({"kv_before": 2}, 3, []) == "prefill"
    assert classify({"kv_before": 0}, 3, [7]) == "first"
    assert classify({"kv_before": 3}, 3, [7]) == "step"
    assert step_row(None, {"drafts": [1], "sampled": [1]}, [1], False, None, 0.0) is None
    assert finish_reason("FINISHED_STOPPED", 257, 257) == "eos" and finish_reason("FINISHED_LENGTH_CAPPED") == "length"
    assert finish_reason("FINISHED_STOPPED", 108, 257) == "abort"     # a stop token: no contract reason
    assert finish_reason("FINISHED_ABORTED") == "abort"


LOG = ("INFO 12-02 06:42:22 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 3.00, Accepted "
       "throughput: 1.00 tokens/s, Drafted throughput: 1.50 tokens/s, Accepted: {acc} tokens, Drafted: 9 tokens, "
       "Per-position acceptance rate: 1.000, 0.667, 0.333, Avg Draft acceptance rate: 66.7%\n")
METRICS = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="tiny"}} {drafts}
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="tiny"}} 9.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="tiny"}} 6.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="tiny",position="0"}} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="tiny",position="1"}} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="tiny",position="2"}} 1.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="tiny"}} 11.0
"""


def _block(per_step_accepted=(2, 1, 3)):
    return {"id": "cmpl-t", "metrics": {"speculative_decoding": {
        "mean_acceptance_length": 3.0, "draft_acceptance_rate": 6 / 9, "acceptance_histogram": [0, 1, 1, 1],
        "num_spec_steps": 3, "num_accepted_draft_tokens": 6, "num_draft_tokens": 9, "num_spec_tokens": 3,
        "per_step_accepted": list(per_step_accepted), "per_step_drafted": [3, 3, 3]}}}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    d = tmp_path_factory.mktemp("xc")
    rec = Recorder(str(d), "xc", flush_s=0.1, vllm_version="0.32.0")
    _drive(rec, STEPS, rid="cmpl-t-0-abc")
    rec.close()
    return d / "run_id=xc"


def test_crosscheck_agrees_when_every_surface_matches_the_trace(traced):
    from specaudit.audit.sources.vllm_crosscheck import crosscheck
    out = crosscheck(traced, LOG.format(acc=6), "", METRICS.format(drafts=3.0), [_block()])
    assert out["mismatches"] == [], out["mismatches"]
    assert {c["surface"] for c in out["checked"]} == {"log", "/metrics", "per-request", "vllm-own"}
    assert out["trace"]["per_pos"] == [3, 2, 1] and out["trace"]["generated"] == 11


@pytest.mark.parametrize("fault,surfaces", [
    ("log", {"log"}), ("metrics", {"/metrics", "vllm-own"}), ("block", {"per-request", "vllm-own"})])
def test_crosscheck_names_the_surface_that_disagrees(traced, fault, surfaces):
    from specaudit.audit.sources.vllm_crosscheck import crosscheck
    out = crosscheck(traced, LOG.format(acc=7 if fault == "log" else 6), "",
                     METRICS.format(drafts=4.0 if fault == "metrics" else 3.0),
                     [_block((3, 2, 4) if fault == "block" else (2, 1, 3))])
    assert {m["surface"] for m in out["mismatches"]} == surfaces, out["mismatches"]


def test_crosscheck_cli_exit_codes(traced, tmp_path):
    (tmp_path / "log").write_text(LOG.format(acc=7))
    run = lambda *a: subprocess.run([sys.executable, "-m", "specaudit.audit.sources.vllm_crosscheck", *a],
                                    cwd=REPO, capture_output=True, text=True, timeout=120)
    bad = run(str(traced), "--log", str(tmp_path / "log"))
    assert bad.returncode == 1 and json.loads(bad.stdout)["mismatches"][0]["surface"] == "log"
    missing = run(str(tmp_path / "nope"))
    assert missing.returncode == 2 and missing.stderr.startswith("error:") and "Traceback" not in missing.stderr


def test_sampled_fields_follow_vllms_test_and_residual():
    import torch

    from specaudit.integrations.vllm.sampling import sampled_fields
    # two drafts (tokens 1, 2) over a 4-token vocabulary; no draft probabilities (q one-hot)
    p = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    u = torch.tensor([0.5, 0.9])
    raw = torch.log(torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]]))
    # accepted the first (0.6 >= 0.5), rejected the second (0.25 < 0.9), drew 3 from the residual
    f = sampled_fields(p, None, u, 0, [1, 2], [1, 3], raw, 0.8, True)
    assert f["target_prob"] == [1.0, pytest.approx(0.6), pytest.approx(0.25)] and f["draft_prob"] == [1.0, 1.0, 1.0]
    assert f["accept_u"][1:] == [pytest.approx(0.5), pytest.approx(0.9)]
    assert f["sampled_token"] == 3 and f["sampled_prob"] == pytest.approx(0.25 / 0.75)
    assert f["sampled_draft_prob"] == 0.0 and f["sampled_target_prob"] == pytest.approx(0.25)
    # both accepted: the bonus from the last row's p (temperature only)
    g = sampled_fields(p, None, torch.tensor([0.1, 0.1]), 0, [1, 2], [1, 2, 0], raw, 1.0, True)
    assert g["sampled_token"] == 0 and g["sampled_prob"] == pytest.approx(0.7) and g["sampled_rank"] == 0
    # under top-k / top-p the bonus's p is not re-derived: declared unknown, never guessed
    h = sampled_fields(p, None, torch.tensor([0.1, 0.1]), 0, [1, 2], [1, 2, 0], raw, 1.0, False)
    assert h["sampled_token"] == -1 and h["sampled_rank"] == -1


def test_a_flush_mixing_greedy_and_sampled_batches_writes_one_file(tmp_path):
    import pyarrow.parquet as pq

    from specaudit.trace.parquet import ParquetSink
    from specaudit.trace.schema import STEPS_SCHEMA, STEPS_SCHEMA_V2
    sink = ParquetSink(tmp_path, "mix", flush_s=3600)
    sink.open_run({"schema_version": 2, "run_id": "mix"})
    v1 = pa_batch(STEPS_SCHEMA)
    v2 = pa_batch(STEPS_SCHEMA_V2)
    sink.write_steps(v1)
    sink.write_steps(v2)
    sink.flush(force=True)
    (f,) = (tmp_path / "run_id=mix").glob("steps-*.parquet")
    t = pq.read_table(f)
    assert t.num_rows == 2 and t.schema.equals(STEPS_SCHEMA_V2)
    assert t.column("draft_prob").to_pylist()[0] is None


def pa_batch(schema):
    import pyarrow as pa
    vals = {"run_id": "mix", "request_id": "r", "algo": "chain", "finished": False, "mask_hash": 1}
    cols = []
    for f in schema:
        if pa.types.is_list(f.type):
            cols.append(pa.array([[1]], f.type))
        else:
            cols.append(pa.array([vals.get(f.name, 1)], f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def test_the_sinks_clock_and_its_idle_flusher_never_write_a_requests_part_twice(tmp_path, monkeypatch):
    """The tracer's worker (tick) and the idle flusher (flush_if_idle) flush from two threads.
    Each flush waits at a barrier before it writes, so without one lock over both the two are
    inside the Parquet sink's flush at once; each request must still be one row of
    requests.parquet (a tick outside the sink's lock wrote a part twice: SA409 on a live vLLM
    run under load). With the lock the barrier times out and the flushes take turns."""
    import threading
    import time

    import pyarrow.parquet as pq

    from specaudit.integrations.vllm import sink as vsink
    from specaudit.trace import parquet as tparquet
    real_flush, real_write = tparquet.ParquetSink.flush, tparquet.write_parquet_atomic
    both = {"go": None}

    def meeting_flush(self, force=False):
        try:
            both["go"].wait(timeout=0.5)     # the other thread's flush, if it can get in
        except threading.BrokenBarrierError:
            pass
        return real_flush(self, force)

    def slow_write(*a, **kw):
        time.sleep(0.02)
        return real_write(*a, **kw)
    monkeypatch.setattr(tparquet.ParquetSink, "flush", meeting_flush)
    monkeypatch.setattr(tparquet, "write_parquet_atomic", slow_write)
    raised = []

    def caught(f):   # two writers of one part also collide on its temporary file: an error, not a row
        try:
            f()
        except Exception as e:  # noqa: BLE001
            raised.append(repr(e))
    s = vsink._IdleFlushedSink(str(tmp_path), "race", flush_s=3600)    # its own idle thread stays asleep
    s.open_run({"run_id": "race"})
    n = 3
    for i in range(n):
        s._requests.append({"run_id": "race", "request_id": f"r{i}", "prompt_tokens": [1], "output_tokens": [2],
                            "finish_reason": "length"})
        s._last_flush = s._requests_at = time.monotonic() - 7200          # both clocks due
        both["go"] = threading.Barrier(2)
        ts = [threading.Thread(target=caught, args=(f,)) for f in (s.tick, s.flush_if_idle)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    both["go"] = threading.Barrier(1)
    s.close_run({"run_id": "race", "finished_at": "2026-12-02T00:00:00Z"})
    ids = pq.read_table(tmp_path / "run_id=race" / "requests.parquet").column("request_id").to_pylist()
    assert raised == [] and sorted(ids) == [f"r{i}" for i in range(n)], (raised, ids)
