"""Arrow columns as numpy, without copies where Arrow allows: the decoding every frame shares.

Split from frame.py so that frame.py and frame_sampling.py both build on it without
importing each other.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

I64 = np.int64

# Arrow's fixed-width types and their numpy dtypes: to_np reads these from the buffers
_NP_DTYPES = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
              pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
              pa.float32(): np.float32, pa.float64(): np.float64}


def valid_mask(arr) -> np.ndarray | None:
    """Validity [len] bool of an Arrow array (lists and dictionaries included), None
    when it holds no null."""
    if not arr.null_count:
        return None
    buf = arr.buffers()[0]
    if buf is None:      # a null-typed array: every slot is null
        return np.zeros(len(arr), dtype=bool)
    bits = np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")
    return bits[arr.offset: arr.offset + len(arr)].view(bool)


def to_np(arr, fill=None) -> np.ndarray:
    """A primitive Arrow array as numpy, read from its buffers: zero-copy when it has no
    null, else a copy with `fill` in the null slots.

    pyarrow's own to_numpy converts through its pandas bridge, which imports pandas on
    first use (half a second of a check's first batch); this reads the same values
    without it. Types without a fixed-width numpy twin, and nulls without a `fill`,
    go through to_numpy as before."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    dt = _NP_DTYPES.get(arr.type)
    is_bool = dt is None and arr.type == pa.bool_()
    valid = valid_mask(arr)
    if (dt is None and not is_bool) or (valid is not None and fill is None):
        if valid is not None and fill is not None:
            arr = arr.fill_null(fill)
        return arr.to_numpy(zero_copy_only=False)
    n = len(arr)
    buf = arr.buffers()[1]
    if is_bool:
        if buf is None or n == 0:
            out = np.zeros(n, dtype=bool)
        else:
            out = np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")[
                arr.offset: arr.offset + n].view(bool)
    elif buf is None or n == 0:
        out = np.zeros(n, dtype=dt)
    else:
        out = np.frombuffer(buf, dtype=dt, count=n, offset=arr.offset * np.dtype(dt).itemsize)
    if valid is not None:
        # a negative fill (the -1 that marks a null) has no place in an unsigned type: widen to
        # int64 (uint32 token ids with a null inside raised OverflowError, an internal error)
        out = out.astype(np.int64) if out.dtype.kind == "u" and fill < 0 else out.copy()
        out[~valid] = fill
    return out



def rows_with_null_values(arr) -> np.ndarray | None:
    """bool [R] in batch order: the rows of a list array with a null among their values;
    None when no row has one (the usual batch: Arrow keeps the child's null count)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    vals = arr.values                       # the whole child: offsets index into it, slice or not
    if not vals.null_count:
        return None
    off = to_np(arr.offsets)
    idx = np.flatnonzero(~valid_mask(vals))
    idx = idx[(idx >= off[0]) & (idx < off[-1])]
    if not len(idx):
        return None
    out = np.zeros(len(arr), dtype=bool)
    out[np.searchsorted(off, idx, side="right") - 1] = True   # a null list's range is empty
    return out


def list_parts(arr):
    """A list array -> (offsets [R+1] as Arrow has them: int32, int64 for a large list;
    values numpy; lengths int64 [R] with -1 for null).

    Values keep their Arrow buffer (offsets index into them); nulls inside values -> -1."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    off = to_np(arr.offsets)
    v = to_np(arr.values, -1)               # nulls inside values -> -1
    return off, v, _lengths(arr, off)


def list_lengths(arr) -> np.ndarray:
    """Lengths [R] of a list array's rows, -1 for a null list (values not decoded)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return _lengths(arr, to_np(arr.offsets))


def _lengths(arr, off):
    lens = np.subtract(off[1:], off[:-1], dtype=I64)   # int64 in one pass from int32 offsets
    valid = valid_mask(arr)
    if valid is not None:
        lens = np.where(valid, lens, -1)
    return lens


def list_values(off, v, lens) -> np.ndarray:
    """The values of a list array's non-null rows, contiguous (from list_parts' output):
    a null list may still span values in the buffer, those are dropped."""
    flat = v[off[0]: off[-1]] if len(v) else np.zeros(0, dtype=I64)
    if (lens < 0).any():
        flat = flat[np.repeat(lens >= 0, np.diff(off))]
    return flat


def list_local_index(ln: np.ndarray) -> np.ndarray:
    """Each value's index inside its list, for lists laid out back to back with lengths
    ln [L] (>= 0) -> int64 [sum(ln)]: arange - repeat(starts, ln) as one cumsum of steps
    (+1 along a list, back to 0 at the next one), without repeat's slow per-list loop
    (4x on long lists such as a request's output; short lists gain nothing)."""
    n = int(ln.sum())
    k = np.ones(n, dtype=I64)
    if n == 0:
        return k
    nz = np.flatnonzero(ln > 0)
    starts = np.cumsum(ln) - ln
    k[starts[nz[1:]]] = 1 - ln[nz[:-1]]               # the step into a list's first value
    k[0] = 0
    return np.cumsum(k, out=k)


def _scalar(arr, fill=-1, dtype=I64):
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    valid = valid_mask(arr)
    nulls = None if valid is None else ~valid
    return to_np(arr, fill).astype(dtype, copy=False), nulls


def _strings(arr, wide: bool = True):
    """String column -> (codes int64 [R], unique values list); wide=False: the codes in
    their own signed integer type (int32 as Parquet's dictionaries have them, a view of
    the Arrow buffer when none is null), for a reader that only indexes with them."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()  # (files are read with read_dictionary: already encoded)
    codes = to_np(arr.indices, -1)
    if wide or codes.dtype.kind != "i":
        codes = codes.astype(I64)
    return codes, arr.dictionary.to_pylist()
