"""Filed steps -> one Arrow RecordBatch of the contract's steps table (the tracer's worker).

steps_to_arrow builds each column for a whole batch of steps at once (one concatenation
or one flattening per column); node_mask_hashes is the contract hash of each row's block
of a padded [B, N, N] node mask (kernels/mask_hash.py does the same on the device).
"""
from __future__ import annotations

import sys
from itertools import chain

import numpy as np
import pyarrow as pa

from specaudit.trace.host_copy import as_numpy
from specaudit.trace.schema import SAMPLING_FIELDS, STEPS_SCHEMA, STEPS_SCHEMA_V2, mask_hash


def _ragged_flat(x, B: int) -> tuple[np.ndarray, np.ndarray]:
    """A ragged per-row field -> (flat values, lengths). Accepts a list of sequences or
    a padded [B, M] array (padding < 0)."""
    if isinstance(x, (list, tuple)):
        rows = [np.asarray(as_numpy(r), dtype=np.int64).reshape(-1) for r in x]
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
                out = as_numpy(torch.cat(vals) if len(vals) > 1 else vals[0])
            else:
                out = np.concatenate(vals) if len(vals) > 1 else np.asarray(vals[0])
        if out.ndim == 1 and (R is None or len(out) == R):
            return out.astype(dtype, copy=False)
    except (RuntimeError, TypeError, ValueError):  # nested or odd values: the general path below
        pass
    return np.concatenate([np.asarray(as_numpy(v)).reshape(-1) for v in vals]).astype(dtype, copy=False)


def _grid(vals: list, counts: list, R: int, N: int, dtype, square: bool = False) -> np.ndarray:
    """Per-node fields of many steps ([k, w] or [k, w, w] each, w >= the step's N_r) ->
    one padded [R, N] (or [R, N, N]) array. Steps of one width (the usual case) are
    concatenated in one call; mixed widths are copied step by step into zeros."""
    g = None
    torch = sys.modules.get("torch")
    try:   # one call for the whole batch; a width mismatch raises and takes the path below
        if torch is not None and type(vals[0]) is torch.Tensor:
            g = as_numpy(torch.cat(vals) if len(vals) > 1 else vals[0])   # C++, drops the GIL to copy
        else:
            g = np.concatenate(vals) if len(vals) > 1 else np.asarray(vals[0])
    except (RuntimeError, TypeError, ValueError):
        g = None
    if g is not None and g.ndim == (3 if square else 2) and len(g) == R and g.shape[1] >= N \
            and (not square or g.shape[2] >= N):
        g = g[:, :N, :N] if square else g[:, :N]
        return g.astype(dtype, copy=False)
    arrs = [np.asarray(as_numpy(v)) for v in vals]
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
    parts = [_ragged_flat(as_numpy(v), k) for v, k in zip(vals, counts)]
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
        counts = [np.asarray(as_numpy(f["n_nodes"])).size for f in items]

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
                a = None if v is None else np.asarray(as_numpy(v))
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
            np.asarray(as_numpy(f["mask_hash"]), dtype=np.uint64).reshape(-1) if f["mask_hash"] is not None
            else node_mask_hashes(np.asarray(as_numpy(f["node_mask"]), dtype=bool), n)
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
                        a = np.asarray(as_numpy(s[key]), dtype=np.float32)
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
                vals.append(np.zeros(k, dt) if s is None else np.asarray(as_numpy(s[key])).reshape(-1).astype(dt))
                mask.append(np.full(k, s is None))
            cols[key] = pa.array(np.concatenate(vals), fld.type, mask=np.concatenate(mask))
    return cols
