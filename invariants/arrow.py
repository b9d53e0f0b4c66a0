"""Arrow columns as numpy, without copies where Arrow allows: the decoding every frame shares.

Split from frame.py so that frame.py and frame_sampling.py both build on it without
importing each other.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

I64 = np.int64



def list_parts(arr):
    """A list array -> (offsets int64 [R+1], values numpy, lengths [R] with -1 for null).

    Values keep their Arrow buffer (offsets index into them); nulls inside values -> -1."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    off = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=I64)
    vals = arr.values
    if vals.null_count:
        vals = vals.fill_null(-1)
    v = vals.to_numpy(zero_copy_only=False)
    return off, v, _lengths(arr, off)


def list_lengths(arr) -> np.ndarray:
    """Lengths [R] of a list array's rows, -1 for a null list (values not decoded)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return _lengths(arr, np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=I64))


def _lengths(arr, off):
    lens = np.diff(off)
    if arr.null_count:
        lens = np.where(arr.is_null().to_numpy(zero_copy_only=False), -1, lens)
    return lens


def list_values(off, v, lens) -> np.ndarray:
    """The values of a list array's non-null rows, contiguous (from list_parts' output):
    a null list may still span values in the buffer, those are dropped."""
    flat = v[off[0]: off[-1]] if len(v) else np.zeros(0, dtype=I64)
    if (lens < 0).any():
        flat = flat[np.repeat(lens >= 0, np.diff(off))]
    return flat


def _scalar(arr, fill=-1, dtype=I64):
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    nulls = None
    if arr.null_count:
        nulls = arr.is_null().to_numpy(zero_copy_only=False)
        arr = arr.fill_null(fill)
    return arr.to_numpy(zero_copy_only=False).astype(dtype, copy=False), nulls


def _strings(arr):
    """String column -> (codes int64 [R], unique values list)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()  # (files are read with read_dictionary: already encoded)
    ind = arr.indices
    if ind.null_count:
        ind = ind.fill_null(-1)
    codes = ind.to_numpy(zero_copy_only=False).astype(I64)
    return codes, arr.dictionary.to_pylist()
