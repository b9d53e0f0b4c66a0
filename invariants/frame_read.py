"""StepFrame's first stages for a big batch through the compiled kernels of
invariants/sort_kernels.py: the row order (a counting sort), the scalar columns and the
list lengths and starts gathered in sorted order, one pass each. Each function sets
the same attributes, equal in values and dtypes, as the numpy stage of
invariants/frame.py that it stands in for (tests/test_compiled_sort.py), or returns
False and sets nothing when the batch is not the usual kind (then numpy runs):

  sort_rows:    order, step, row_in_file, _rid_names, _rid_codes, req, inv, nulls of
                step and request_id (StepFrame._sort_rows)
  read_scalars: the integer, hash and flag columns (the part of StepFrame._read_scalars
                after the string columns)
  read_lists:   lens, diag_bad, n_raw, n, T, start, uniform_n, tokens, parents,
                positions, argmax, and path / commit with their starts and lengths
                (StepFrame._read_lists, then _own of accepted_path and committed_tokens):
                a batch whose node_tokens lists all have one length N >= 1, and no null
                node_tokens list, with int32 offsets.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from specaudit.trace.schema import NODE_LIST_COLUMNS, NULLABLE_NODE_LIST_COLUMNS

from .arrow import _lengths, list_parts, to_np, valid_mask
from .frame_diagnostics import DIAGNOSTIC_RANGES, diagnostic_bad

I64 = np.int64
SORT_KERNELS = "specaudit.invariants.sort_kernels"
LISTS = (*NODE_LIST_COLUMNS, *NULLABLE_NODE_LIST_COLUMNS, "accepted_path", "committed_tokens")


def _combined(arr):
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def sort_rows(f, kern, col: dict, carry, row_offset: int) -> bool:
    """The rows by (request, step) as StepFrame._sort_rows orders them (np.lexsort's
    order: by carry slot, then step, ties in batch order)."""
    rid = _combined(col["request_id"])
    if not pa.types.is_dictionary(rid.type):
        return False
    codes = to_np(rid.indices, -1)
    if codes.dtype not in (np.int32, np.int64):
        codes = codes.astype(I64)
    dic = rid.dictionary
    rdict = dic.to_pylist()
    # a string dictionary without nulls gives str only: no check per value
    plain = (pa.types.is_string(dic.type) or pa.types.is_large_string(dic.type)) and dic.null_count == 0
    if not plain and not all(map(str.__instancecheck__, rdict)):
        rdict = [str(x) for x in rdict]
    gidx = carry.index(rdict + ["\0null"])
    sarr = _combined(col["step"])
    step = to_np(sarr, -1)
    if step.dtype not in (np.int32, np.int64):
        step = step.astype(I64)
    if codes.dtype != step.dtype:
        codes, step = codes.astype(I64), step.astype(I64)
    _, rank = np.unique(gidx, return_inverse=True)
    order = np.empty(f.R, dtype=I64)
    if not kern.sort_rows(codes, rank.reshape(-1).astype(I64), step, order):
        order = np.lexsort((step, gidx[codes]))        # steps out of order inside a request
    f.order = order
    f.step, f._rid_codes, f.req, f.row_in_file, f.inv = kern.sorted_rows(order, codes, gidx, step, row_offset)
    f._rid_names = rdict + ["<null>"]
    valid = valid_mask(sarr)
    if valid is not None:
        f.nulls["step"] = ~valid[order]
    if f._rid_codes.min(initial=0) < 0:
        f.nulls["request_id"] = f._rid_codes < 0
    return True


# the scalar columns StepFrame._read_scalars reads: (name, fill of a null, dtype)
SCALARS = (("budget", -1, I64), ("topk", -1, I64), ("batch_size", -1, I64), ("seq_len", -1, I64),
           ("accepted_depth", -1, I64), ("commit_len", -1, I64), ("mask_hash", 0, np.uint64),
           ("finished", False, bool))


def read_scalars(f, kern, col: dict) -> None:
    """The integer, hash and flag columns in sorted order (nulls: the fill, and their
    rows in f.nulls), gathered in one pass."""
    R, order, todo = f.R, f.order, []
    for name, fill, dtype in SCALARS:
        arr = _combined(col[name])
        v = to_np(arr, fill)
        if v.dtype == np.int32 and dtype == I64:
            kind = kern.I32_I64
        else:
            v = v.astype(dtype, copy=False)
            kind = kern.W1 if v.dtype.itemsize == 1 else kern.W8
        out = np.empty(R, dtype=dtype)
        todo.append((kind, v, out))
        setattr(f, name, out)
        valid = valid_mask(arr)
        if valid is not None:
            f.nulls[name] = ~valid[order]
    kern.take_rows(order, todo)


def read_lists(f, kern, col: dict) -> bool:
    """The list columns of a batch whose node_tokens lists all have one length N >= 1:
    lengths and starts per sorted row gathered in one pass, per-node lists as views
    of their Arrow values (a list column of other lengths: numpy's alignment)."""
    R, order = f.R, f.order
    parts = {}
    for name in LISTS:
        if name in col:
            arr = _combined(col[name])
            off = to_np(arr.offsets)
            parts[name] = (arr, off, valid_mask(arr) is None and off.dtype == np.int32)
    nt_arr, nt_off, nt_plain = parts["node_tokens"]
    N0 = kern.common_length(nt_off) if nt_plain and R else -1
    if N0 < 1:
        return False
    T = N0 * R
    lens_nt = np.empty(R, dtype=I64)
    todo = [(kern.LEN32, nt_off, lens_nt)]
    f.lens = {"node_tokens": lens_nt}
    raw = {}
    for name, (arr, off, plain) in parts.items():
        if name == "node_tokens":
            continue
        if plain and kern.common_length(off) == N0:
            f.lens[name] = lens_nt
        elif plain:
            f.lens[name] = np.empty(R, dtype=I64)
            todo.append((kern.LEN32, off, f.lens[name]))
        else:                                           # null lists (-1) or int64 offsets
            lens = _lengths(arr, off)
            f.lens[name] = lens_nt if (lens == N0).all() else lens[order]
            raw[name] = lens
    # accepted path and commit: flat in batch order, start and length per sorted row
    own = {}
    for name in ("accepted_path", "committed_tokens"):
        arr, off, plain = parts[name]
        if plain:
            v = to_np(arr.values, -1)
            flat = v[off[0]: off[-1]] if len(v) else np.zeros(0, dtype=I64)
            s, n = np.empty(R, dtype=I64), np.empty(R, dtype=I64)
            todo += [(kern.START32, off, s), (kern.LEN32, off, n)]
            own[name] = (flat, s, n)
        else:
            own[name] = f._own(list_parts(arr), order)
    f.start = np.empty(R, dtype=I64)
    todo.append((kern.START32, nt_off, f.start))
    kern.take_rows(order, todo)
    f.diag_bad = {c: diagnostic_bad(col[c], *DIAGNOSTIC_RANGES[c], R, f.inv)
                  for c in DIAGNOSTIC_RANGES if c in col}
    f.n_raw = lens_nt
    f.n = lens_nt.copy()
    f.T = T
    f.uniform_n = True
    for attr, name in (("tokens", "node_tokens"), ("parents", "parents"), ("positions", "positions"),
                       ("argmax", "target_argmax")):
        arr, off, plain = parts[name]
        v = to_np(arr.values, -1)
        if f.lens[name] is lens_nt and plain:           # every list N long: a view of the values
            setattr(f, attr, v[off[0]: off[-1]])
        else:
            lens = raw[name] if name in raw else _lengths(arr, off)
            # (N0 per batch row and the flat starts: only for a list of other lengths)
            n0, s0 = np.full(R, N0, dtype=I64), np.arange(0, T, N0, dtype=I64)
            setattr(f, attr, f._aligned((off, v, lens), n0, None, s0))
    (f.path, f.path_start, f.path_len), (f.commit, f.commit_start, f.commit_n) = \
        own["accepted_path"], own["committed_tokens"]
    return True
