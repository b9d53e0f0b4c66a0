"""The public tracing API: any engine calls `record_step` once per batched verify.

    tracer = Tracer(sinks=[ParquetSink("traces/", run_id)], manifest={...})
    tracer.begin_request(rid, prompt_tokens=..., first_token=...)
    tracer.record_step(request_ids=..., node_tokens=..., ...)   # every verify forward
    tracer.end_request(rid, output_tokens=..., finish_reason="eos")
    tracer.close(reported={...})                                # the engine's own counters

Tensors may live on any device. `record_step` only enqueues (and, for device tensors,
starts one batched device->host copy per step: no sync); reading tensors, the mask hash,
the Arrow conversion and every sink run on a background thread, off the decode path.
Pass the tensors the verify forward really used (positions, the node mask, the
argmax); pass the engine's own counters as reported, never recomputed: they are what
specaudit audits.
"""
from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass
from itertools import chain

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
    """A field as numpy (or as given: lists, scalars, None). Tensors are read here, on the
    worker: CPU ones as views; a device tensor that was not staged (an engine mixing
    devices) is copied synchronously, on this thread only; dtypes numpy lacks (bfloat16)
    are widened to float32."""
    if x is None or isinstance(x, np.ndarray):
        return x
    if hasattr(x, "numpy"):
        try:
            return x.numpy()
        except (RuntimeError, TypeError):  # requires grad, not on the CPU, or no numpy dtype
            x = x.detach().cpu()
            try:
                return x.numpy()
            except TypeError:
                return x.float().numpy()
    return x


def _on_device(x) -> bool:
    """A tensor off the CPU (Tensor.is_cpu: a flag read, no device object built)."""
    return getattr(x, "is_cpu", True) is False and hasattr(x, "numpy")


@dataclass
class _Staged:
    """Where a device tensor's bytes sit in a step's staged host buffer."""
    offset: int
    nbytes: int
    dtype: np.dtype
    shape: tuple


_NP_DTYPES: dict = {}


def _stage_device(fields: dict, on_device=_on_device):
    """Gather every device tensor of a step into one uint8 buffer and start one copy.

    One concatenation and one non-blocking device->host copy per step instead of one per
    field, and no sync on the decode thread (the worker waits on an event). Returns
    (fields, host buffer or None): staged tensors are replaced by _Staged placeholders
    that `_unstage` turns into numpy views of the buffer once the copy landed. Nested
    dicts (sampling) are copied, never changed in place. Widest dtypes go first so every
    view is aligned.
    """
    import torch
    found = []   # (dict, key, tensor)

    def visit(d):
        for k, v in d.items():
            if isinstance(v, dict):
                d[k] = v = dict(v)
                visit(v)
            elif on_device(v):
                t = v.detach()
                if t.dtype in (torch.bfloat16, torch.float16):
                    t = t.float()   # numpy has no bfloat16; the schema stores float32 anyway
                found.append((d, k, t))
    visit(fields)
    if not found:
        return fields, None
    found.sort(key=lambda e: -e[2].element_size())
    flat, off = [], 0
    for d, k, t in found:
        dt = _NP_DTYPES.get(t.dtype)
        if dt is None:
            dt = _NP_DTYPES[t.dtype] = torch.empty(0, dtype=t.dtype).numpy().dtype
        nbytes = t.numel() * t.element_size()
        d[k] = _Staged(off, nbytes, dt, tuple(t.shape))
        flat.append(t.contiguous().reshape(-1).view(torch.uint8))
        off += nbytes
    buf = torch.cat(flat)
    cuda = buf.device.type == "cuda"
    return fields, buf.to("cpu", non_blocking=cuda)


def _unstage(fields: dict, host: np.ndarray) -> dict:
    """Resolve _Staged placeholders into views of the landed host buffer (uint8)."""
    for k, v in fields.items():
        if isinstance(v, _Staged):
            fields[k] = host[v.offset:v.offset + v.nbytes].view(v.dtype).reshape(v.shape)
        elif isinstance(v, dict):
            _unstage(v, host)
    return fields


@dataclass
class _StepItem:
    fields: dict
    event: object = None  # a CUDA event to wait on before reading host copies
    staged: object = None  # the step's staged host buffer (a CPU tensor), see _stage_device


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
        if _on_device(node_tokens) or _on_device(target_argmax):
            fields, staged = _stage_device(fields)   # one copy per step, started, not awaited
            if getattr(node_tokens, "is_cuda", False) or getattr(target_argmax, "is_cuda", False):
                import torch
                event = torch.cuda.Event()
                event.record()
        if self.copy_inputs:
            for k, v in fields.items():
                if k != "request_ids" and not isinstance(v, (_Staged, str)):
                    fields[k] = ({sk: _host(sv) for sk, sv in v.items()} if isinstance(v, dict)
                                 else _host(v))
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
                    _unstage(it.fields, it.staged.numpy())
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


def _ragged_flat(x, B: int) -> tuple[np.ndarray, np.ndarray]:
    """A ragged per-row field -> (flat values, lengths). Accepts a list of sequences or
    a padded [B, M] array (padding < 0)."""
    if isinstance(x, (list, tuple)):
        rows = [np.asarray(_np(r), dtype=np.int64).reshape(-1) for r in x]
        lens = np.array([len(r) for r in rows], dtype=np.int64)
        flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        return flat, lens
    a = np.asarray(x).reshape(B, -1)
    keep = a >= 0
    return a[keep], keep.sum(1)


def node_mask_hashes(mask: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Contract hash of each row's [n_r, n_r] block of a padded [B, N, N] mask."""
    n = np.asarray(n)
    sizes = np.unique(n)
    if len(sizes) == 1:   # every row the same N (chains, full trees): no row gather
        return np.asarray(mask_hash(mask[:, :sizes[0], :sizes[0]]), dtype=np.uint64).reshape(-1)
    out = np.zeros(len(n), dtype=np.uint64)
    for size in sizes:
        rows = np.flatnonzero(n == size)
        out[rows] = mask_hash(mask[rows][:, :size, :size])
    return out


def _offsets(lens: np.ndarray) -> pa.Array:
    out = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=out[1:])
    return pa.array(out, pa.int32())


def _rows(vals: list, dtype, R: int | None = None) -> np.ndarray:
    """Per-row fields of many steps ([B] each: lists, arrays, tensors) -> one [R] array.
    One flattening call for lists, one concatenation for arrays or tensors; anything
    else (nested lists, [B, 1] arrays) goes value by value."""
    try:
        if type(vals[0]) is list:
            out = np.fromiter(chain.from_iterable(vals), dtype=dtype)
        else:
            torch = sys.modules.get("torch")
            if torch is not None and type(vals[0]) is torch.Tensor:
                out = _np(torch.cat(vals) if len(vals) > 1 else vals[0])
            else:
                out = np.concatenate(vals) if len(vals) > 1 else np.asarray(vals[0])
        if out.ndim == 1 and (R is None or len(out) == R):
            return out.astype(dtype, copy=False)
    except (RuntimeError, TypeError, ValueError):  # nested or odd values: the general path below
        pass
    return np.concatenate([np.asarray(_np(v)).reshape(-1) for v in vals]).astype(dtype, copy=False)


def _grid(vals: list, counts: list, R: int, N: int, dtype, square: bool = False) -> np.ndarray:
    """Per-node fields of many steps ([k, w] or [k, w, w] each, w >= the step's N_r) ->
    one padded [R, N] (or [R, N, N]) array. Steps of one width (the usual case) are
    concatenated in one call; mixed widths are copied step by step into zeros."""
    g = None
    torch = sys.modules.get("torch")
    try:   # one call for the whole batch; a width mismatch raises and takes the path below
        if torch is not None and type(vals[0]) is torch.Tensor:
            g = _np(torch.cat(vals) if len(vals) > 1 else vals[0])   # C++, drops the GIL to copy
        else:
            g = np.concatenate(vals) if len(vals) > 1 else np.asarray(vals[0])
    except (RuntimeError, TypeError, ValueError):
        g = None
    if g is not None and g.ndim == (3 if square else 2) and len(g) == R and g.shape[1] >= N \
            and (not square or g.shape[2] >= N):
        g = g[:, :N, :N] if square else g[:, :N]
        return g.astype(dtype, copy=False)
    arrs = [np.asarray(_np(v)) for v in vals]
    out = np.zeros((R, N, N) if square else (R, N), dtype=dtype)
    r0 = 0
    for a, k in zip(arrs, counts):
        a = a.reshape(k, -1, *a.shape[2:]) if a.ndim == 1 else a
        w = min(a.shape[1], N)
        if square:
            out[r0:r0 + k, :w, :w] = a[:, :w, :w]
        else:
            out[r0:r0 + k, :w] = a[:, :w]
        r0 += k
    return out


def _ragged(vals: list, counts: list) -> pa.Array:
    """Ragged per-row fields of many steps (lists of sequences, or padded [k, M] arrays
    with padding < 0) -> one list<int32> column."""
    if all(isinstance(v, (list, tuple)) for v in vals):
        rows = [r for v in vals for r in v]
        try:
            lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
            total = int(lens.sum())
            if not rows:
                flat = np.zeros(0, np.int32)
            elif type(rows[0]) is np.ndarray:   # accept_greedy's paths: one concatenation
                flat = np.concatenate(rows)
            else:
                flat = np.fromiter(chain.from_iterable(rows), dtype=np.int32, count=total)
            if flat.ndim == 1 and len(flat) == total:
                return pa.ListArray.from_arrays(_offsets(lens), pa.array(flat.astype(np.int32, copy=False),
                                                                         pa.int32()))
        except (TypeError, ValueError):   # nested or odd rows: the general path below
            pass
    parts = [_ragged_flat(_np(v), k) for v, k in zip(vals, counts)]
    flat = np.concatenate([p[0] for p in parts]).astype(np.int32)
    return pa.ListArray.from_arrays(_offsets(np.concatenate([p[1] for p in parts])), pa.array(flat, pa.int32()))


def steps_to_arrow(run_id: str, items) -> pa.RecordBatch:
    """Batched steps' fields -> one RecordBatch of STEPS_SCHEMA.

    `items` is one field dict (one batched verify) or a list of them, as record_step
    filed them (tensors, arrays or lists). Each column is built for the whole batch of
    steps at once: one concatenation (or one flattening of the lists) per column, so the
    Python work per step is a few list appends, never a loop over rows or nodes. The
    worker holds the GIL while this runs, so this is what tracing costs the decode loop.
    """
    if isinstance(items, dict):
        items = [items]
    i32 = pa.list_(pa.int32())
    f32 = pa.list_(pa.float32())
    counts = [len(f["request_ids"]) for f in items]
    n_all = _rows([f["n_nodes"] for f in items], np.int64)
    if len(n_all) != sum(counts):   # request ids and node counts disagree: rows follow n_nodes
        counts = [np.asarray(_np(f["n_nodes"])).size for f in items]

    def per_step_n():   # [k] node counts of each step, for the rare per-step paths
        ends = np.cumsum(counts)
        return [n_all[e - k:e] for e, k in zip(ends, counts)]
    R, N = len(n_all), int(n_all.max())
    full = bool((n_all == N).all())          # every row has N nodes: no padding to drop
    valid = None if full else np.arange(N)[None, :] < n_all[:, None]  # [R, N]
    node_offsets = _offsets(n_all)

    def flat_nodes(g):   # [R, N] padded -> the real nodes, row-major
        return g.reshape(-1) if full else g[valid]

    def node_col(key, typ, dtype):
        vals = [f[key] for f in items]
        present = [v is not None for v in vals]
        if not any(present):
            return pa.nulls(R, typ)
        if not all(present):  # a producer sent it for some steps only: rare, slow path
            rows = []
            for v, n in zip(vals, per_step_n()):
                a = None if v is None else np.asarray(_np(v))
                rows += [None if a is None else a[i, : n[i]].tolist() for i in range(len(n))]
            return pa.array(rows, typ)
        return pa.ListArray.from_arrays(node_offsets, pa.array(flat_nodes(_grid(vals, counts, R, N, dtype)),
                                                               typ.value_type))

    def per_row(key, dtype):
        return _rows([f[key] for f in items], dtype, R)

    def per_step(key, dtype, typ):
        vals = [f[key] for f in items]
        if vals.count(vals[0]) == len(vals):   # budget, topk: one value for the whole batch
            return pa.repeat(pa.scalar(dtype(vals[0]).item(), typ), R)
        return pa.array(np.repeat(np.array(vals, dtype=dtype), counts), typ)

    hashes_given = [f["mask_hash"] is not None for f in items]
    if all(hashes_given):
        hashes = per_row("mask_hash", np.uint64)
    elif not any(hashes_given):
        hashes = node_mask_hashes(_grid([f["node_mask"] for f in items], counts, R, N, bool, square=True), n_all)
    else:
        hashes = np.concatenate([
            np.asarray(_np(f["mask_hash"]), dtype=np.uint64).reshape(-1) if f["mask_hash"] is not None
            else node_mask_hashes(np.asarray(_np(f["node_mask"]), dtype=bool), n)
            for f, n in zip(items, per_step_n())])

    algos = [f["algo"] for f in items]
    if all(a == algos[0] for a in algos):
        algo_col = pa.repeat(pa.scalar(algos[0], pa.string()), R)
    else:
        algo_col = pa.array(np.repeat(np.array(algos, dtype=object), counts), pa.string())
    batch_size = np.repeat([f["batch_size"] or k for f, k in zip(items, counts)], counts)
    cols = {
        "run_id": pa.repeat(pa.scalar(run_id, pa.string()), R),
        "request_id": pa.array([r if type(r) is str else str(r) for f in items for r in f["request_ids"]],
                               pa.string()),
        "step": pa.array(per_row("steps", np.int32), pa.int32()),
        "algo": algo_col,
        "budget": per_step("budget", np.int32, pa.int32()),
        "topk": per_step("topk", np.int32, pa.int32()),
        "batch_size": pa.array(batch_size.astype(np.int32), pa.int32()),
        "seq_len": pa.array(per_row("seq_len", np.int32), pa.int32()),
        "node_tokens": node_col("node_tokens", i32, np.int32),
        "parents": node_col("parents", i32, np.int32),
        "positions": node_col("positions", i32, np.int32),
        "mask_hash": pa.array(hashes, pa.uint64()),
        "draft_logprob": node_col("draft_logprob", f32, np.float32),
        "target_argmax": node_col("target_argmax", i32, np.int32),
        "target_margin": node_col("target_margin", f32, np.float32),
        "accepted_path": _ragged([f["accepted_path"] for f in items], counts),
        "accepted_depth": pa.array(per_row("accepted_depth", np.int32), pa.int32()),
        "commit_len": pa.array(per_row("commit_len", np.int32), pa.int32()),
        "committed_tokens": _ragged([f["committed_tokens"] for f in items], counts),
        "finished": pa.array(per_row("finished", bool), pa.bool_()),
        "t_start": per_step("t_start", np.float64, pa.float64()),
        "draft_s": per_step("draft_s", np.float64, pa.float64()),
        "verify_s": per_step("verify_s", np.float64, pa.float64()),
        "step_s": per_step("step_s", np.float64, pa.float64()),
    }
    schema = STEPS_SCHEMA
    if [f.get("sampling") for f in items].count(None) != len(items):
        schema = STEPS_SCHEMA_V2
        cols.update(_sampling_cols(items, counts, node_offsets, flat_nodes, R, N))
    return pa.RecordBatch.from_arrays([cols[c] for c in schema.names], schema=schema)


def _sampling_cols(items, counts, node_offsets, flat_nodes, R: int, N: int) -> dict:
    """Contract v2 columns of a batch of steps (null where a step brought none)."""
    cols = {}
    samp = [f.get("sampling") for f in items]
    every = all(s is not None for s in samp)
    missing = None if every else pa.array(np.repeat([s is None for s in samp], counts), pa.bool_())
    for fld in SAMPLING_FIELDS:
        key = fld.name
        if pa.types.is_list(fld.type):
            if every:
                out = _grid([s[key] for s in samp], counts, R, N, np.float32)
            else:
                out = np.full((R, N), np.nan, dtype=np.float32)
                r0 = 0
                for s, k in zip(samp, counts):
                    if s is not None:
                        a = np.asarray(_np(s[key]), dtype=np.float32)
                        w = min(a.shape[1], N)
                        out[r0:r0 + k, :w] = a[:, :w]
                    r0 += k
            arr = pa.ListArray.from_arrays(node_offsets, pa.array(flat_nodes(out), pa.float32()))
            if missing is not None:
                arr = pa.ListArray.from_arrays(node_offsets, arr.values, mask=missing)
            cols[key] = arr
        else:
            dt = np.int32 if pa.types.is_integer(fld.type) else np.float32
            if every:
                cols[key] = pa.array(_rows([s[key] for s in samp], dt), fld.type)
                continue
            vals, mask = [], []
            for s, k in zip(samp, counts):
                vals.append(np.zeros(k, dt) if s is None else np.asarray(_np(s[key])).reshape(-1).astype(dt))
                mask.append(np.full(k, s is None))
            cols[key] = pa.array(np.concatenate(vals), fld.type, mask=np.concatenate(mask))
    return cols
