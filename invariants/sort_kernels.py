"""StepFrame's row order and per-row column reads as compiled kernels: sort_kernels.c,
built and loaded by invariants/compiled.py (importing this module builds it on first
use). Imported only through compiled.kernels; the numpy of invariants/frame.py is the
definition, invariants/frame_read.py calls these for a big batch, and
tests/test_compiled_sort.py holds every array they give equal to numpy's.

Shapes: R rows; order [R] (sorted row r is batch row order[r]); K request-id dictionary
codes plus the null slot (gidx [K], rank [K]); codes and steps [R] in batch order.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .compiled import bind, library

I64 = np.int64
_LIB = library(Path(__file__).with_name("sort_kernels.c"))
_SORT = {v: bind(_LIB, f"sort_rows_{v}", f"i i {v} l {v} ol ol", returns=True) for v in "wl"}
_SORTED = {v: bind(_LIB, f"sorted_rows_{v}", f"i i l {v} l {v} i ol ol ol ol ol") for v in "wl"}
_TAKE = bind(_LIB, "take_rows", "i l i l q q")
_COMMON = bind(_LIB, "common_length", "i w", returns=True)

# take_rows' kinds (sort_kernels.c): what a column's source holds
I32_I64, W8, W1, LEN32, START32 = range(5)


def _width(codes, step) -> str:
    """'w' when codes and steps are both int32 (the contract's), else 'l' (both widened)."""
    return "w" if codes.dtype == np.int32 and step.dtype == np.int32 else "l"


def sort_rows(codes, rank, step, order) -> bool:
    """codes [R] (a code < 0: the null slot, rank's last entry), rank [K], step [R] ->
    order [R] written: rows stably by their request's rank. -> whether the steps ascend
    inside each request (when not, order is not the (request, step) order)."""
    v = _width(codes, step)
    cnt = np.zeros(len(rank) + 1, dtype=I64)
    return bool(_SORT[v](len(codes), len(rank), codes, rank, step, cnt, order))


def sorted_rows(order, codes, gidx, step, row_offset):
    """-> (step, request-id code, carry slot, row_in_file) per sorted row and inv, all
    int64 [R]."""
    R = len(order)
    outs = [np.empty(R, dtype=I64) for _ in range(5)]
    step_s, rid_s, req_s, inv, rif = outs
    _SORTED[_width(codes, step)](R, len(gidx), order, codes, gidx, step, row_offset, step_s, rid_s, req_s, inv, rif)
    return step_s, rid_s, req_s, rif, inv


def take_rows(order, columns) -> None:
    """columns: [(kind, source array, destination array [R])]: each destination written
    with its source's batch rows in sorted order, one pass over order. A source must be
    contiguous and of its kind's width (int32 for I32_I64, LEN32 and START32; 8 bytes for
    W8, 1 byte for W1); a destination contiguous, int64 but for W8 (8 bytes) and W1."""
    keep = [np.ascontiguousarray(s) for _, s, _ in columns]
    for (kind, _, d), s in zip(columns, keep):
        width = {I32_I64: 4, LEN32: 4, START32: 4, W8: 8, W1: 1}[kind]
        if s.dtype.itemsize != width or not d.flags.c_contiguous or d.dtype.itemsize != (width if kind in (W8, W1)
                                                                                           else 8):
            raise TypeError(f"take_rows: kind {kind} with a {s.dtype} source and a {d.dtype} destination")
    kinds = np.array([k for k, _, _ in columns], dtype=I64)
    src = np.array([s.ctypes.data for s in keep], dtype=np.uint64)
    dst = np.array([d.ctypes.data for _, _, d in columns], dtype=np.uint64)
    _TAKE(len(order), order, len(columns), kinds, src, dst)


def common_length(off) -> int:
    """off [R + 1] int32 list offsets (R >= 1) -> the length of every list, or -1 when
    they differ."""
    return int(_COMMON(len(off) - 1, off))


_SAME = bind(_LIB, "rows_same", "i i q", returns=True)


def rows_same(V) -> bool:
    """V [R, D] uint64 words (R >= 1) -> whether every row equals row 0, as
    bool((V == V[0]).all())."""
    return bool(_SAME(V.shape[0], V.shape[1], V))


_FP = bind(_LIB, "row_fingerprints", "i i q q oq")
_LOOKUP = bind(_LIB, "row_lookup", "i i q q i q l ol", returns=True)


def row_groups(V, w, head_rows: int):
    """row_groups.group_rows's grouping of V [R, D] uint64 words (w [D] its weights) when
    every row's fingerprint is among those of the first head_rows rows and every row
    equals its group's first row -> (ids [R], first [U]) as numpy gives them; else None."""
    R, D = V.shape
    head = min(R, head_rows)
    fp = np.empty(head, dtype=np.uint64)
    _FP(head, D, V, w, fp)
    cands, first = np.unique(fp, return_index=True)
    ids = np.empty(R, dtype=I64)
    if _LOOKUP(R, D, V, w, len(cands), cands, first.astype(I64, copy=False), ids):
        return None
    return ids, first
