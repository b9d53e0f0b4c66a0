"""The per-node diagnostic lists (draft_logprob, target_margin): the values they may hold
and the rows whose values do not (SA109), read straight from the Arrow list column."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrow import to_np, valid_mask

# per-node diagnostic lists and the values they can hold: target_margin is top-1 minus
# top-2 logit (finite, >= 0), draft_logprob a log-probability (finite, <= 0)
DIAGNOSTIC_RANGES = {"target_margin": (0.0, np.inf), "draft_logprob": (-np.inf, 1e-6)}


def diagnostic_bad(arr, lo: float, hi: float, R: int, inv: np.ndarray):
    """(bad [R] over sorted rows, first offending value [R]) of a diagnostic list column:
    a value that is null inside a list, NaN, infinite, or outside [lo, hi]."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    bad = np.zeros(R, dtype=bool)
    val = np.full(R, np.nan)
    flat = arr.flatten()                                  # values of the non-null lists
    if len(flat) == 0:
        return bad, val
    v = to_np(flat, 0).astype(np.float64)
    valid = valid_mask(flat)
    if valid is not None:
        v[~valid] = np.nan                                # null -> NaN
    with np.errstate(invalid="ignore"):
        b = ~np.isfinite(v) | (v < lo) | (v > hi)
    if not b.any():
        return bad, val
    rows = inv[to_np(pc.list_parent_indices(arr))]
    idx = np.flatnonzero(b)[::-1]                         # reversed: the first wins
    bad[rows[idx]] = True
    val[rows[idx]] = v[idx]
    return bad, val
