"""The public tracing API: any engine calls `record_step` once per batched verify.

    tracer = Tracer(sinks=[ParquetSink("traces/", run_id)], manifest={...})
    tracer.begin_request(rid, prompt_tokens=..., first_token=...)
    tracer.record_step(request_ids=..., node_tokens=..., ...)   # every verify forward
    tracer.end_request(rid, output_tokens=..., finish_reason="eos")
    tracer.close(reported={...})                                # the engine's own counters

Tensors may live on any device. `record_step` only enqueues (and, for device tensors,
starts one batched device->host copy per step: no sync); reading tensors, the mask hash,
the Arrow conversion and every sink run on a background thread, off the decode path
(the copy: trace/host_copy.py; the conversion: trace/steps_arrow.py).
Pass the tensors the verify forward really used (positions, the node mask, the
argmax); pass the engine's own counters as reported, never recomputed: they are what
specaudit audits.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

from specaudit.trace.host_copy import Staged, host_view, on_device, stage_device, unstage
from specaudit.trace.steps_arrow import steps_to_arrow

log = logging.getLogger("specaudit.tracer")


@dataclass
class _StepItem:
    fields: dict
    event: object = None  # a CUDA event to wait on before reading host copies
    staged: object = None  # the step's staged host buffer (a CPU tensor), see stage_device


class Tracer:
    """Collects step rows and request rows and hands them to sinks.

    Sinks implement any of: open_run(manifest), write_steps(RecordBatch),
    write_request(dict), close_run(manifest), health() -> dict with "ok", and
    sink_error(sink_name) (told of every failure of any sink: the Prometheus sink
    counts them as specaudit_sink_errors_total). A failing sink never stops the
    decode loop: the failure is counted, logged once per episode (one line on the
    `specaudit.tracer` logger, and one when the sink recovers), shown by health(),
    and retried by the sink; close() raises SinkError (one line) only when data
    was lost.
    """

    def __init__(self, sinks, manifest: dict, run_id: str, batch_s: float | None = None,
                 copy_inputs: bool = True):
        self.sinks = list(sinks)
        self.batch_s = batch_s if batch_s is not None else default_batch_s(self.sinks)
        # CPU tensors are read later on the worker thread: copy them unless the engine
        # promises never to write to a tensor it has handed over (ours allocates fresh
        # ones every step and passes copy_inputs=False).
        self.copy_inputs = copy_inputs
        self.run_id = run_id
        self.manifest = dict(manifest, run_id=run_id)
        self.manifest.setdefault("started_at", time.time())
        self._requests: dict[str, dict] = {}
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._errors: list[BaseException] = []   # lost data: raised from close()
        self._lock = threading.Lock()
        self.error_count = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self._failing: set[str] = set()           # sinks in a failure episode (logged once)
        for s in self.sinks:
            if hasattr(s, "open_run"):
                s.open_run(self.manifest)
        self._thread = threading.Thread(target=self._worker, name="specaudit-tracer", daemon=True)
        self._thread.start()
        self._closed = False

    # -------------------------------------------------------------- requests
    def begin_request(self, request_id: str, *, prompt_tokens, first_token: int,
                      reference_tokens=None, t_arrive: float | None = None) -> None:
        self._requests[request_id] = {
            "run_id": self.run_id, "request_id": request_id,
            "prompt_tokens": [int(t) for t in prompt_tokens], "first_token": int(first_token),
            "reference_tokens": None if reference_tokens is None else [int(t) for t in reference_tokens],
            "t_arrive": float(t_arrive if t_arrive is not None else time.time()),
        }

    def end_request(self, request_id: str, *, output_tokens, finish_reason: str,
                    ttft_s: float, e2e_s: float) -> None:
        row = self._requests.pop(request_id, None) or {"run_id": self.run_id, "request_id": request_id,
                                                        "prompt_tokens": [], "first_token": -1,
                                                        "reference_tokens": None, "t_arrive": time.time()}
        row.update(output_tokens=[int(t) for t in output_tokens], finish_reason=finish_reason,
                   ttft_s=float(ttft_s), e2e_s=float(e2e_s))
        # through the queue, so a sink sees a request's steps before the request
        self._q.put(("request", row))

    # ------------------------------------------------------------------ steps
    def record_step(self, *, request_ids, steps, algo: str, budget: int, topk: int, seq_len,
                    node_tokens, n_nodes, parents, positions, target_argmax,
                    accepted_path, accepted_depth, commit_len, committed_tokens, finished,
                    node_mask=None, mask_hash=None, draft_logprob=None, target_margin=None,
                    t_start: float, draft_s: float, verify_s: float, step_s: float,
                    batch_size: int | None = None, sampling: dict | None = None) -> None:
        """Record one batched verify forward over B requests.

        Per-node arrays are [B, N] (padded; `n_nodes` [B] gives each row's real N);
        node_mask is the [B, N, N] bool mask fed to attention, or give `mask_hash` [B]
        when it was hashed on the device. accepted_path and committed_tokens are
        [B, *] ragged (lists) or padded with -1; accepted_depth and commit_len are the
        engine's counters.

        `sampling` (contract v2, speculative sampling): a dict of per-node [B, N] arrays
        draft_prob, target_prob, accept_u and per-row [B] sampled_token, sampled_prob,
        sampled_target_prob, sampled_draft_prob, sampled_rank (schema.SAMPLING_FIELDS).
        Give it on every step of a sampled run, never on a greedy one.
        """
        # The decode thread only files the objects away (a dict, a queue put: a few
        # microseconds); reading tensors and every conversion run on the worker. With
        # copy_inputs (an engine that reuses its buffers) CPU arrays are copied here.
        fields = dict(
            request_ids=list(request_ids), steps=steps, algo=algo, budget=int(budget),
            topk=int(topk), seq_len=seq_len, node_tokens=node_tokens, n_nodes=n_nodes, parents=parents,
            positions=positions, node_mask=node_mask, mask_hash=mask_hash, draft_logprob=draft_logprob,
            target_argmax=target_argmax, target_margin=target_margin, accepted_path=accepted_path,
            accepted_depth=accepted_depth, commit_len=commit_len, committed_tokens=committed_tokens,
            finished=finished, t_start=float(t_start), draft_s=float(draft_s), verify_s=float(verify_s),
            step_s=float(step_s), batch_size=batch_size, sampling=sampling)
        event = staged = None
        if on_device(node_tokens) or on_device(target_argmax):
            fields, staged = stage_device(fields)   # one copy per step, started, not awaited
            if getattr(node_tokens, "is_cuda", False) or getattr(target_argmax, "is_cuda", False):
                import torch
                event = torch.cuda.Event()
                event.record()
        if self.copy_inputs:
            for k, v in fields.items():
                if k != "request_ids" and not isinstance(v, (Staged, str)):
                    fields[k] = ({sk: host_view(sv) for sk, sv in v.items()} if isinstance(v, dict)
                                 else host_view(v))
        self._q.put(("steps", _StepItem(fields, event, staged)))

    # ------------------------------------------------------------------ worker
    def _worker(self) -> None:
        """Every `batch_s` seconds, drain the queue and convert all pending steps at once.

        The worker sleeps between drains instead of waking on every put: a wake-up per
        step would hand the GIL back and forth with the decode loop. A conversion costs
        a fixed part per batch (some 60 numpy and Arrow calls, whatever the batch holds)
        plus a few microseconds per step, all while holding the GIL the decode loop
        needs; with 1 s batches (about 100 steps on the reference runtime) the fixed
        part is spread thin. Sinks see data within batch_s (default_batch_s: a quarter
        second when a live sink is attached); flush() and close() wake the worker at once.
        """
        while True:
            self._wake.wait(self.batch_s)
            self._wake.clear()
            items = []
            while True:
                try:
                    items.append(self._q.get_nowait())
                except queue.Empty:
                    break
            steps: list[_StepItem] = []
            for kind, item in items:
                if kind == "steps":
                    steps.append(item)
                    continue
                self._emit(steps)  # keep order: a request's steps reach sinks before it
                steps = []
                if kind == "stop":
                    return
                if kind == "flush":
                    item.set()
                elif kind == "request":
                    self._call("write_request", item)
            self._emit(steps)
            self._tick()

    def _emit(self, steps: list[_StepItem]) -> None:
        if not steps:
            return
        try:
            for it in steps:
                if it.event is not None:
                    it.event.synchronize()
                if it.staged is not None:
                    unstage(it.fields, it.staged.numpy())
                    it.staged = None
            batch = steps_to_arrow(self.run_id, [it.fields for it in steps])
        except Exception as e:  # keep the decode loop alive; report at close
            with self._lock:
                self._errors.append(e)
            self._failed("tracer", e)
            return
        self._call("write_steps", batch)

    def _tick(self) -> None:
        """Every wake: sinks that flush by the clock (ParquetSink.tick) do so, idle or not.
        A failure counts like any write's; a tick that writes nothing proves no recovery."""
        for s in self.sinks:
            t = getattr(s, "tick", None)
            if t is None:
                continue
            try:
                t()
            except OSError as e:
                self._failed(_name(s), e)
            except Exception as e:
                with self._lock:
                    self._errors.append(e)
                self._failed(_name(s), e)

    def _call(self, method: str, arg) -> None:
        for s in self.sinks:
            if hasattr(s, method):
                try:
                    getattr(s, method)(arg)
                except OSError as e:      # the sink keeps the rows and retries
                    self._failed(_name(s), e)
                except Exception as e:    # a sink bug: the rows are lost
                    with self._lock:
                        self._errors.append(e)
                    self._failed(_name(s), e)
                else:
                    if self._failing and _name(s) in self._failing and _sink_ok(s):
                        self._failing.discard(_name(s))
                        log.warning("specaudit tracer: sink %s recovered; writing again", _name(s))

    def _failed(self, name: str, e: BaseException) -> None:
        with self._lock:
            self.error_count += 1
            self.last_error = f"{name}: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
            self.last_error_at = time.time()
            first = name not in self._failing
            self._failing.add(name)
        if first:
            log.error("specaudit tracer: sink %s failed (%s); rows kept and retried with backoff; "
                      "/health reports it", name, self.last_error)
        for s in self.sinks:
            if hasattr(s, "sink_error"):
                try:
                    s.sink_error(name)
                except Exception:
                    pass

    def health(self) -> dict:
        """{"ok", "errors", "last_error", "last_error_at", "sinks": {name: health}}.

        ok: no sink is in a failure episode, every sink that reports health is ok, and
        no rows were lost to an error."""
        sinks = {_name(s): s.health() for s in self.sinks if hasattr(s, "health")}
        ok = not self._failing and not self._errors and all(h.get("ok", True) for h in sinks.values())
        return {"ok": ok, "errors": self.error_count, "last_error": self.last_error,
                "last_error_at": self.last_error_at, "sinks": sinks}

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything recorded so far reached the sinks."""
        ev = threading.Event()
        self._q.put(("flush", ev))
        self._wake.set()
        ev.wait(timeout)

    def close(self, reported: dict | None = None, **manifest_extra) -> dict:
        """Drain the queue, close every sink with the final manifest, return it."""
        if self._closed:
            return self.manifest
        self._closed = True
        self._q.put(("stop", None))
        self._wake.set()
        self._thread.join()
        self.manifest.update(manifest_extra)
        self.manifest["finished_at"] = time.time()
        if reported is not None:
            self.manifest["reported"] = reported
        for s in self.sinks:
            if hasattr(s, "close_run"):
                try:
                    s.close_run(self.manifest)
                except Exception as e:
                    self._errors.append(e)
                    self._failed(_name(s), e)
        if self._errors:
            from specaudit.trace.parquet import SinkError
            e = self._errors[0]
            if isinstance(e, SinkError):
                raise e
            raise SinkError(None, f"tracer sink failed: {type(e).__name__}: "
                                  f"{' '.join(str(e).split())[:200]}") from None
        return self.manifest


# How often the worker converts what the decode loop filed (Tracer(batch_s=None)). Each
# conversion has a fixed cost while holding the GIL, so a batch-only record (Parquet)
# is converted once a second; a live sink (Prometheus, OTel: `live = True`) keeps the
# quarter second its readers see data within, and a sink that flushes more often than
# either (ParquetSink(flush_s=...)) sets the pace.
BATCH_S = 1.0
LIVE_BATCH_S = 0.25


def default_batch_s(sinks) -> float:
    out = BATCH_S
    for s in sinks:
        if getattr(s, "live", False):
            out = min(out, LIVE_BATCH_S)
        f = getattr(s, "flush_s", None)
        if isinstance(f, (int, float)) and f >= 0:
            out = min(out, float(f))
    return out


def _name(sink) -> str:
    return getattr(sink, "sink_name", None) or type(sink).__name__


def _sink_ok(sink) -> bool:
    try:
        return bool(sink.health().get("ok", True)) if hasattr(sink, "health") else True
    except Exception:
        return False
