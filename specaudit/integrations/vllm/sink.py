"""The traced run inside one vLLM engine core: Tracer + ParquetSink, manifest, close.

Opened lazily on the first scheduler update (the API server process loads the plugin too
but never schedules, so it writes nothing). Closed by vLLM's own Scheduler.shutdown, and
at process exit as a fallback. Crash-safe as every specaudit trace: the Parquet sink
flushes every `flush_s` seconds, so a killed server leaves a readable run that lacks
finished_at (`specaudit check` reports it incomplete, SA001).

A failure inside the plugin (a hook raising, a missing piece of evidence, a sink that
cannot write) never reaches vLLM: recording stops, the error is logged once, and at close
the manifest says `incomplete: <reason>` and carries no finished_at, so the checker reports
the run as incomplete instead of auditing a partial record as whole.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

from specaudit.integrations.vllm.rows import classify, finish_reason, step_row

log = logging.getLogger("specaudit.vllm")
HASH_LIMIT = 2 << 30   # weights above this are not hashed at start-up (the manifest says so)


class Recorder:
    def __init__(self, dataset: str, run_id: str | None = None, flush_s: float = 1.0, vllm_version: str = ""):
        self.dataset, self.run_id_req, self.flush_s = dataset, run_id, flush_s
        self.vllm_version = vllm_version
        self.active = True
        self.tracer = None
        self.failed: str | None = None
        self.closed = False
        self.reqs: dict[str, dict] = {}
        self.drafted = self.accepted = 0
        self.n_steps = self.n_drafts = 0
        self.eos_id = None
        self.budget = 0   # num_speculative_tokens, from the manifest at _open
        self.sampling = None        # the first sampled request's {temperature, plain}: contract v2
        self.unknown_token = False  # a bonus drawn under top-k/top-p: its p not re-derived
        atexit.register(self.close)

    # ------------------------------------------------------------ failure
    def fail(self, where: str, e) -> None:
        """Stop recording; vLLM goes on. The run is marked incomplete at close."""
        if self.failed is None:
            self.failed = f"{where}: {type(e).__name__}: {' '.join(str(e).split())[:200]}" \
                if isinstance(e, BaseException) else f"{where}: {e}"
            log.error("specaudit vLLM plugin stopped recording (vLLM keeps serving; the trace is marked "
                      "incomplete): %s", self.failed)
        self.active = False

    # ------------------------------------------------------------ run
    def _open(self, sched) -> None:
        from specaudit.trace.tracer import Tracer
        cfg = sched.vllm_config
        rid = self.run_id_req or f"vllm-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
        dp = getattr(cfg.parallel_config, "data_parallel_size", 1) or 1
        if dp > 1:
            rid += f"-dp{getattr(cfg.parallel_config, 'data_parallel_rank', 0)}"
        sink = _IdleFlushedSink(self.dataset, rid, flush_s=self.flush_s)
        m = manifest(cfg, rid, self.vllm_version)
        if self.eos_id is not None:   # in the first manifest too: a killed run keeps it
            m["config"]["eos_id"] = int(self.eos_id)
        self.tracer = Tracer([sink], m, rid)
        self.budget = int(self.tracer.manifest["config"]["budget"])
        log.info("specaudit vLLM plugin: tracing run %s into %s", rid, sink.run_dir)

    def on_update(self, sched, pre: dict, counters: dict, t_update: float) -> None:
        """One Scheduler.update_from_output: a row per decode step, requests begun/ended."""
        if not self.active:
            return
        if self.tracer is None:
            self.eos_id = next((getattr(b["req"], "eos_token_id", None) for b in pre.values()), None)
            self._open(sched)
        tr = self.tracer
        for rid, b in pre.items():
            req = b["req"]
            w = b["worker"]
            committed = [int(t) for t in list(req.output_token_ids)[b["out_before"]:]]
            finished = req.is_finished()
            kind = classify(b, req.num_prompt_tokens, committed)
            st = self.reqs.get(rid)
            if kind == "prefill":
                continue
            if kind == "first":
                if st is not None:   # recomputed after preemption: its steps are no longer one chain
                    self.fail("request preempted", f"request {rid} was preempted and recomputed")
                    return
                if self.eos_id is None:
                    self.eos_id = getattr(req, "eos_token_id", None)
                st = self.reqs[rid] = {"t_arrive": float(getattr(req, "arrival_time", 0) or t_update),
                                       "t_first": t_update, "step": 0, "out": [committed[0]]}
                tr.begin_request(rid, prompt_tokens=list(req.prompt_token_ids or []), first_token=committed[0],
                                 t_arrive=st["t_arrive"])
            elif st is None:
                continue        # began before tracing started
            else:
                row = step_row(w, b, committed, finished, counters.get(rid), t_update)
                if row is None:
                    self.fail("worker evidence", f"no verify-forward capture for request {rid} (is the "
                                                 "model runner in another process? tensor/pipeline parallel "
                                                 "is not supported)")
                    return
                self._record(rid, st, row)
            if finished:
                self._end(rid, req, t_update)

    def _record(self, rid: str, st: dict, row: dict) -> None:
        import numpy as np
        N = row["N"]
        if row["counter_drafted"] is not None:
            self.n_drafts += 1
            self.drafted += row["counter_drafted"]
            self.accepted += row["accepted_depth"]
        self.tracer.record_step(
            request_ids=[rid], steps=[st["step"]], algo="chain", budget=self.budget, topk=1,
            seq_len=[row["seq_len"]], node_tokens=np.array([row["node_tokens"]]), n_nodes=[N],
            parents=np.arange(-1, N - 1, dtype=np.int64)[None], positions=np.array([row["positions"]]),
            node_mask=np.tril(np.ones((1, N, N), dtype=bool)),   # a causal LM over a chain (module doc)
            target_argmax=np.array([row["target_argmax"]]),
            target_margin=np.array([row["target_margin"]], np.float32),
            accepted_path=[row["accepted_path"]], accepted_depth=[row["accepted_depth"]],
            commit_len=[row["commit_len"]], committed_tokens=[row["committed_tokens"]], finished=[row["finished"]],
            t_start=row["t_start"], draft_s=row["draft_s"], verify_s=row["verify_s"], step_s=row["step_s"],
            batch_size=row["batch_size"],
            sampling=None if row["sampling"] is None else {k: np.array([v]) for k, v in row["sampling"].items()})
        if row["sampling"] is not None and self.sampling is None:
            self.sampling = row["sampling_params"]
        if row["sampling"] is not None and row["sampling"]["sampled_token"] < 0:
            self.unknown_token = True
        st["step"] += 1
        st["out"] += row["committed_tokens"]
        self.n_steps += 1

    def _end(self, rid: str, req, t: float) -> None:
        st = self.reqs.pop(rid)
        out = [int(x) for x in req.output_token_ids]
        why = finish_reason(req.status.name, out[-1] if out else None, getattr(req, "eos_token_id", None))
        self.tracer.end_request(rid, output_tokens=out, finish_reason=why, ttft_s=st["t_first"] - st["t_arrive"],
                                e2e_s=t - st["t_arrive"])

    def close(self) -> None:
        """Close the run (Scheduler.shutdown, or process exit). Never raises."""
        if self.closed or self.tracer is None:
            return
        self.closed = True
        try:
            for rid in list(self.reqs):      # still running at shutdown: what was recorded of it
                st = self.reqs.pop(rid)
                self.tracer.end_request(rid, output_tokens=st["out"], finish_reason="abort",
                                        ttft_s=st["t_first"] - st["t_arrive"],
                                        e2e_s=time.time() - st["t_arrive"])
            # vLLM's own counters, as its metrics code saw them (make_spec_decoding_stats).
            # The other contract keys have no vLLM counter of the same meaning: declared
            # in not_reported with the reason, so check says they were not checked
            # (SA514, info) instead of auditing a number we made.
            reported = {"drafted_tokens": self.drafted, "accepted_tokens": self.accepted}
            extra = {"incomplete": self.failed} if self.failed else {}
            extra["not_reported"] = dict(NOT_REPORTED)
            extra["vllm_counters"] = {"num_drafts": self.n_drafts, "num_draft_tokens": self.drafted,
                                      "num_accepted_tokens": self.accepted,
                                      "note": "summed from Scheduler.make_spec_decoding_stats calls"}
            if self.eos_id is not None:
                self.tracer.manifest["config"]["eos_id"] = int(self.eos_id)
            if self.sampling is not None:   # sampled requests were traced: contract v2
                from specaudit.integrations.vllm.sampling import manifest_sampling
                from specaudit.trace.schema import SAMPLING_SCHEMA_VERSION
                self.tracer.manifest["schema_version"] = SAMPLING_SCHEMA_VERSION
                self.tracer.manifest["config"]["sampling"] = manifest_sampling(
                    self.sampling["temperature"], None, None, ["sampled_token"] if self.unknown_token else [])
            m = self.tracer.close(reported=reported, **extra)
        except Exception as e:   # a sink that lost rows (disk full): say so in the manifest
            self.fail("sink", e)
            m = dict(self.tracer.manifest, incomplete=self.failed)
        if self.failed:
            _rewrite_incomplete(Path(self.dataset) / f"run_id={self.tracer.run_id}" / "run.json", m)


# The contract's `reported` keys vLLM has no counter for, and why (run.json `not_reported`).
NOT_REPORTED = {
    "verify_steps": "vLLM counts num_drafts, the steps that had drafts, not every verify step",
    "committed_tokens": "not among the counters vLLM's spec-decode stats keep (its generation tokens "
                        "are a Prometheus series: check --prometheus reads them)",
    "generated_tokens": "not among the counters vLLM's spec-decode stats keep (its generation tokens "
                        "are a Prometheus series: check --prometheus reads them)",
    "mean_accepted_depth": "vLLM's mean acceptance length is over steps with drafts and counts the bonus; "
                           "no counter of this meaning",
    "mean_commit_len": "vLLM's mean acceptance length is over steps with drafts and counts the bonus; "
                       "no counter of this meaning",
    "gen_throughput_tps": "vLLM logs throughput per 10 s interval only, no figure for the whole run",
    "wall_s": "vLLM logs throughput per 10 s interval only, no figure for the whole run",
}


def _idle_flusher(sink) -> None:
    """Flush what waits when no new rows come (the Parquet sink otherwise flushes only
    when rows arrive): a server killed while idle has lost nothing."""
    while not sink.closed:
        time.sleep(sink.flush_s)
        try:
            sink.flush_if_idle()
        except OSError:
            pass   # counted by the sink; retried with its backoff


def _make_idle_flushed_sink():
    from specaudit.trace.parquet import ParquetSink

    class IdleFlushedSink(ParquetSink):
        """The Parquet sink behind one lock, plus a thread flushing it when idle.

        Every way in takes the lock: the tracer's worker thread (write_steps, write_request and
        its clock, tick) and the idle flusher (flush_if_idle). A tick outside it once raced the
        idle flusher into writing the same requests part twice: every request two rows in
        requests.parquet (SA409, seen on a live vLLM run under load). Re-entrant: a locked
        write may flush."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self._lock = threading.RLock()
            self.closed = False
            threading.Thread(target=_idle_flusher, args=(self,), name="specaudit-vllm-flush", daemon=True).start()

        def flush(self, force: bool = False):
            with self._lock:
                super().flush(force)

        def tick(self, _=None):
            with self._lock:
                super().tick(_)

        def write_steps(self, batch):
            with self._lock:
                super().write_steps(batch)

        def write_request(self, row):
            with self._lock:
                super().write_request(row)

        def flush_if_idle(self):
            with self._lock:
                if (self._pending or self._requests) and not self.closed \
                        and time.monotonic() - self._last_flush >= self.flush_s:
                    self.flush(force=True)

        def close_run(self, manifest):
            with self._lock:
                self.closed = True
                super().close_run(manifest)

    return IdleFlushedSink


def _IdleFlushedSink(*a, **kw):
    return _make_idle_flushed_sink()(*a, **kw)


def _rewrite_incomplete(path: Path, m: dict) -> None:
    """The manifest without finished_at: the checker then reports the run incomplete."""
    from specaudit.trace.safe_io import atomic_write_bytes
    m = {k: v for k, v in m.items() if k != "finished_at"}
    try:
        atomic_write_bytes(path, (json.dumps(m, indent=1, sort_keys=True, default=str) + "\n").encode())
    except OSError as e:
        log.error("specaudit vLLM plugin: cannot mark %s incomplete: %s", path, e)


def _weights_sha256(folder) -> str | None:
    """sha256 over the folder's *.safetensors files in name order (None: not a local
    folder, or above HASH_LIMIT bytes: not hashed at start-up)."""
    try:
        files = sorted(Path(folder).glob("*.safetensors"))
        if not files or sum(f.stat().st_size for f in files) > HASH_LIMIT:
            return None
        h = hashlib.sha256()
        for f in files:
            with open(f, "rb") as fh:
                for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


def manifest(cfg, run_id: str, vllm_version: str) -> dict:
    """run.json for a traced vLLM engine core (schema v1; vLLM's config as it ran)."""
    from specaudit.trace.schema import SCHEMA_VERSION
    sc = cfg.speculative_config
    mc = cfg.model_config
    k = int(getattr(sc, "num_speculative_tokens", 0) or 0) if sc is not None else 0
    drafter = None
    if sc is not None:
        dm = getattr(sc, "draft_model_config", None)
        dpath = getattr(dm, "model", None) if dm is not None else getattr(sc, "model", None)
        drafter = {"name": str(dpath) if dpath else str(getattr(sc, "method", None)),
                   "sha256": _weights_sha256(dpath) if dpath else None}
    try:
        from vllm.platforms import current_platform
        device = str(current_platform.device_type)
    except Exception:
        device = None
    sched = cfg.scheduler_config
    return {
        "schema_version": SCHEMA_VERSION, "run_id": run_id,
        "engine": {"name": "vllm", "version": vllm_version, "traced_by": "specaudit.integrations.vllm"},
        "models": {"target": {"name": str(mc.model), "sha256": _weights_sha256(mc.model)}, "drafter": drafter},
        "config": {"algo": "chain", "budget": k, "topk": 1, "block_size": k + 1,
                   "concurrency": int(getattr(sched, "max_num_seqs", 0) or 0), "max_new_tokens": None,
                   "dtype": str(mc.dtype).replace("torch.", ""), "device": device,
                   "seed": getattr(mc, "seed", None), "fault": None,
                   "vllm": {"method": getattr(sc, "method", None) if sc else None,
                            "num_speculative_tokens": k,
                            "speculative_config": _spec_summary(sc),
                            "async_scheduling": bool(getattr(sched, "async_scheduling", False)),
                            "enforce_eager": bool(getattr(mc, "enforce_eager", False)),
                            "max_model_len": getattr(mc, "max_model_len", None)}},
        "conventions": {"accept_length": "includes_bonus", "mean": "pooled"},
        "finish_reasons": "eos: vLLM stopped on the request's EOS; abort: aborted, or stopped on a stop token or "
                          "string (the contract has no reason for those); length: max_tokens",
        "host": {"hostname": socket.gethostname(), "pid": os.getpid()},
        "started_at": time.time(),
    }


def _spec_summary(sc) -> dict | None:
    if sc is None:
        return None
    keys = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
            "draft_sample_method", "rejection_sample_method", "disable_by_batch_size")
    return {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
            for k in keys if (v := getattr(sc, k, None)) is not None}
