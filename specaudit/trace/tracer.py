"""The public tracing API: any engine calls `record_step` once per batched verify.

    tracer = Tracer(sinks=[ParquetSink("traces/", run_id)], manifest={...})
    tracer.begin_request(rid, prompt_tokens=..., first_token=...)
    tracer.record_step(request_ids=..., node_tokens=..., ...)   # every verify forward
    tracer.end_request(rid, output_tokens=..., finish_reason="eos")
    tracer.close(reported={...})                                # the engine's own counters

Tensors may live on any device. `record_step` only starts device->host copies and
enqueues; the mask hash, the Arrow conversion and every sink run on a background
thread, off the decode path. Pass the tensors the verify forward really used
(positions, the node mask, the argmax); pass the engine's own counters as reported,
never recomputed: they are what specaudit audits.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from specaudit.trace.schema import SAMPLING_FIELDS, STEPS_SCHEMA, STEPS_SCHEMA_V2, mask_hash

log = logging.getLogger("specaudit.tracer")


def _host(x, copy: bool = True):
    """Host view of a field: CPU tensors and numpy arrays as numpy (copied unless `copy`
    is False), a started non-blocking copy for device tensors; Python lists pass through
    (the caller builds them per step)."""
    if isinstance(x, np.ndarray):
        return x.copy() if copy else x
    if x is None or isinstance(x, (list, tuple, int, float)):
        return x
    if hasattr(x, "numpy"):  # torch tensor
        if x.device.type != "cpu":
            return x.detach().to("cpu", non_blocking=True)
        try:
            a = x.numpy()
        except RuntimeError:  # requires grad
            a = x.detach().numpy()
        return a.copy() if copy else a
    return x


def _np(x):
    if x is None:
        return None
    if hasattr(x, "numpy"):
        return x.numpy()
    return x


@dataclass
class _StepItem:
    fields: dict
    event: object = None  # a CUDA event to wait on before reading host copies


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

    def __init__(self, sinks, manifest: dict, run_id: str, batch_s: float = 0.25,
                 copy_inputs: bool = True):
        self.sinks = list(sinks)
        self.batch_s = batch_s
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
        c = self.copy_inputs
        fields = dict(
            request_ids=list(request_ids), steps=_host(steps, c), algo=algo, budget=int(budget),
            topk=int(topk), seq_len=_host(seq_len, c), node_tokens=_host(node_tokens, c),
            n_nodes=_host(n_nodes, c), parents=_host(parents, c), positions=_host(positions, c),
            node_mask=_host(node_mask, c), mask_hash=_host(mask_hash, c),
            draft_logprob=_host(draft_logprob, c), target_argmax=_host(target_argmax, c),
            target_margin=_host(target_margin, c), accepted_path=_host(accepted_path, c),
            accepted_depth=_host(accepted_depth, c), commit_len=_host(commit_len, c),
            committed_tokens=_host(committed_tokens, c), finished=_host(finished, c),
            t_start=float(t_start), draft_s=float(draft_s), verify_s=float(verify_s),
            step_s=float(step_s), batch_size=batch_size,
            sampling=None if sampling is None else {k: _host(v, c) for k, v in sampling.items()})
        event = None
        if getattr(node_tokens, "is_cuda", False) or getattr(target_argmax, "is_cuda", False):
            import torch
            event = torch.cuda.Event()
            event.record()
        self._q.put(("steps", _StepItem(fields, event)))

    # ------------------------------------------------------------------ worker
    def _worker(self) -> None:
        """Every `batch_s` seconds, drain the queue and convert all pending steps at once.

        The worker sleeps between drains instead of waking on every put: a wake-up per
        step would hand the GIL back and forth with the decode loop. Converting many
        steps in one go keeps the per-step cost to tens of microseconds; sinks see data
        within batch_s. flush() and close() wake it early.
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

    def _emit(self, steps: list[_StepItem]) -> None:
        if not steps:
            return
        try:
            for it in steps:
                if it.event is not None:
                    it.event.synchronize()
            batch = steps_to_arrow(self.run_id, [it.fields for it in steps])
        except Exception as e:  # keep the decode loop alive; report at close
            with self._lock:
                self._errors.append(e)
            self._failed("tracer", e)
            return
        self._call("write_steps", batch)

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


def _name(sink) -> str:
    return getattr(sink, "sink_name", None) or type(sink).__name__


def _sink_ok(sink) -> bool:
    try:
        return bool(sink.health().get("ok", True)) if hasattr(sink, "health") else True
    except Exception:
        return False


def _ragged_flat(x, B: int) -> tuple[np.ndarray, np.ndarray]:
    """A ragged per-row field -> (flat values, lengths). Accepts a list of sequences or
    a padded [B, M] array (padding < 0)."""
    if isinstance(x, (list, tuple)):
        rows = [np.asarray(r, dtype=np.int64).reshape(-1) for r in x]
        lens = np.array([len(r) for r in rows], dtype=np.int64)
        flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        return flat, lens
    a = np.asarray(x).reshape(B, -1)
    keep = a >= 0
    return a[keep], keep.sum(1)


def node_mask_hashes(mask: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Contract hash of each row's [n_r, n_r] block of a padded [B, N, N] mask."""
    out = np.zeros(len(n), dtype=np.uint64)
    for size in np.unique(n):
        rows = np.flatnonzero(n == size)
        out[rows] = mask_hash(mask[rows][:, :size, :size])
    return out


def _offsets(lens: np.ndarray) -> pa.Array:
    return pa.array(np.concatenate(([0], np.cumsum(lens))).astype(np.int32), pa.int32())


def steps_to_arrow(run_id: str, items) -> pa.RecordBatch:
    """Batched steps' fields (host arrays) -> one RecordBatch of STEPS_SCHEMA.

    `items` is one field dict (one batched verify) or a list of them. Every per-node
    field is first stacked into one padded [R, N] array (one slice copy per item),
    then turned into a list column from values + offsets: the cost per step is a few
    slice copies, not a Python loop over rows or nodes.
    """
    if isinstance(items, dict):
        items = [items]
    i32 = pa.list_(pa.int32())
    f32 = pa.list_(pa.float32())
    ns = [np.asarray(_np(f["n_nodes"]), dtype=np.int64).reshape(-1) for f in items]
    counts = [len(n) for n in ns]
    n_all = np.concatenate(ns)
    R, N = len(n_all), int(n_all.max())
    valid = np.arange(N)[None, :] < n_all[:, None]  # [R, N]
    node_offsets = _offsets(n_all)

    def stacked(key, dtype, shape=()):
        out = np.zeros((R, N) + shape, dtype=dtype)
        r0 = 0
        for f, k in zip(items, counts):
            a = np.asarray(_np(f[key]))
            w = min(a.shape[1], N)
            if shape:
                out[r0:r0 + k, :w, :w] = a[:, :w, :w]
            else:
                out[r0:r0 + k, :w] = a[:, :w]
            r0 += k
        return out

    def node_col(key, typ, dtype):
        present = [f[key] is not None for f in items]
        if not any(present):
            return pa.nulls(R, typ)
        if not all(present):  # a producer sent it for some steps only: rare, slow path
            rows = []
            for f, n in zip(items, ns):
                a = None if f[key] is None else np.asarray(_np(f[key]))
                rows += [None if a is None else a[i, : n[i]].tolist() for i in range(len(n))]
            return pa.array(rows, typ)
        return pa.ListArray.from_arrays(node_offsets, pa.array(stacked(key, dtype)[valid], typ.value_type))

    def per_row(key, dtype):
        return np.concatenate([np.asarray(_np(f[key])).reshape(-1) for f in items]).astype(dtype)

    def per_step(key, dtype, typ=None):
        return pa.array(np.repeat(np.array([f[key] for f in items]), counts).astype(dtype), typ)

    if all(f["mask_hash"] is not None for f in items):
        hashes = per_row("mask_hash", np.uint64)
    elif all(f["mask_hash"] is None for f in items):
        hashes = node_mask_hashes(stacked("node_mask", bool, (N,)), n_all)
    else:
        hashes = np.concatenate([
            np.asarray(_np(f["mask_hash"]), dtype=np.uint64).reshape(-1) if f["mask_hash"] is not None
            else node_mask_hashes(np.asarray(_np(f["node_mask"]), dtype=bool), n)
            for f, n in zip(items, ns)])

    def ragged_col(key):
        parts = [_ragged_flat(_np(f[key]), k) for f, k in zip(items, counts)]
        flat = np.concatenate([p[0] for p in parts]).astype(np.int32)
        return pa.ListArray.from_arrays(_offsets(np.concatenate([p[1] for p in parts])),
                                        pa.array(flat, pa.int32()))

    batch_size = np.repeat([f["batch_size"] or k for f, k in zip(items, counts)], counts)
    cols = {
        "run_id": pa.array([run_id] * R, pa.string()),
        "request_id": pa.array([str(r) for f in items for r in f["request_ids"]], pa.string()),
        "step": pa.array(per_row("steps", np.int32)),
        "algo": pa.array(np.repeat(np.array([f["algo"] for f in items], dtype=object), counts), pa.string()),
        "budget": per_step("budget", np.int32),
        "topk": per_step("topk", np.int32),
        "batch_size": pa.array(batch_size.astype(np.int32)),
        "seq_len": pa.array(per_row("seq_len", np.int32)),
        "node_tokens": node_col("node_tokens", i32, np.int32),
        "parents": node_col("parents", i32, np.int32),
        "positions": node_col("positions", i32, np.int32),
        "mask_hash": pa.array(hashes, pa.uint64()),
        "draft_logprob": node_col("draft_logprob", f32, np.float32),
        "target_argmax": node_col("target_argmax", i32, np.int32),
        "target_margin": node_col("target_margin", f32, np.float32),
        "accepted_path": ragged_col("accepted_path"),
        "accepted_depth": pa.array(per_row("accepted_depth", np.int32)),
        "commit_len": pa.array(per_row("commit_len", np.int32)),
        "committed_tokens": ragged_col("committed_tokens"),
        "finished": pa.array(per_row("finished", bool)),
        "t_start": per_step("t_start", np.float64),
        "draft_s": per_step("draft_s", np.float64),
        "verify_s": per_step("verify_s", np.float64),
        "step_s": per_step("step_s", np.float64),
    }
    schema = STEPS_SCHEMA
    if any(f.get("sampling") is not None for f in items):
        schema = STEPS_SCHEMA_V2
        cols.update(_sampling_cols(items, counts, node_offsets, valid, R, N))
    return pa.RecordBatch.from_arrays([cols[c] for c in schema.names], schema=schema)


def _sampling_cols(items, counts, node_offsets, valid, R: int, N: int) -> dict:
    """Contract v2 columns of a batch of steps (null where a step brought none)."""
    cols = {}
    for fld in SAMPLING_FIELDS:
        key = fld.name
        if pa.types.is_list(fld.type):
            out = np.full((R, N), np.nan, dtype=np.float32)
            r0 = 0
            for f, k in zip(items, counts):
                if f.get("sampling") is not None:
                    a = np.asarray(_np(f["sampling"][key]), dtype=np.float32)
                    w = min(a.shape[1], N)
                    out[r0:r0 + k, :w] = a[:, :w]
                r0 += k
            arr = pa.ListArray.from_arrays(node_offsets, pa.array(out[valid], pa.float32()))
            missing = np.repeat([f.get("sampling") is None for f in items], counts)
            if missing.any():
                arr = pa.ListArray.from_arrays(node_offsets, arr.values, mask=pa.array(missing))
            cols[key] = arr
        else:
            dt = np.int32 if pa.types.is_integer(fld.type) else np.float32
            vals, mask = [], []
            for f, k in zip(items, counts):
                s = f.get("sampling")
                vals.append(np.zeros(k, dt) if s is None else np.asarray(_np(s[key])).reshape(-1).astype(dt))
                mask.append(np.full(k, s is None))
            cols[key] = pa.array(np.concatenate(vals), fld.type, mask=np.concatenate(mask))
    return cols
