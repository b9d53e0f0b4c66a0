"""Exact float sums, for the per-request means of the run rules: the partials of any
grouping of a run's requests combine (math.fsum) into the correctly rounded sum.

    exact_sum_partials(np.array([0.1, 0.2, 0.3]))      # floats whose exact sum is theirs
    math.fsum(exact_sum_partials(a) + exact_sum_partials(b))   # == the sum of a and b, rounded once
"""
from __future__ import annotations

import math

import numpy as np

# below this many values the per-exponent sums go through np.bincount's float64 sums,
# exact while they stay under 2^53 (n * 2^27); past it through a sort by exponent
BINCOUNT_MAX = 1 << 26


def exact_sum_partials(values, partials=()) -> list:
    """Floats whose exact sum is the exact sum of `values` (and of the given partials):
    math.fsum over any concatenation of them rounds once.

    Vectorised for a numpy array of finite floats (_exact_sum_int: the sum is exact in
    integers, then split into a few floats); anything else goes through Shewchuk's
    loop (_shewchuk_partials), one Python step per value."""
    if isinstance(values, np.ndarray) and values.dtype == np.float64 and len(values) > 64:
        got = _exact_sum_int(values)
        if got is not None:
            return _shewchuk_partials(got, partials) if len(partials) else got
        values = values.tolist()
    return _shewchuk_partials(values.tolist() if isinstance(values, np.ndarray) else values, partials)


def _exact_sum_int(x: np.ndarray) -> list | None:
    """The exact sum of finite float64s as a short list of floats, or None when the
    values are out of the range this handles (non-finite, or tiny/huge exponents).

    Each x = M * 2^(e-53) with integer |M| < 2^53 (frexp). M splits into a high and a
    low part below 2^27 each, summed per exponent (exact for < 2^36 values);
    the per-exponent sums are added exactly as Python integers, S * 2^(emin-53); S is
    then peeled into floats, each the rounding of what is left, until nothing is."""
    if len(x) == 0:
        return []
    if len(x) >= 1 << 36 or not np.isfinite(x).all():
        return None
    m, e = np.frexp(x)
    M = (m * float(1 << 53)).astype(np.int64)          # exact: |m| < 1, 53 bits
    nz = M != 0
    if not nz.any():
        return [0.0]
    M, e = M[nz], e[nz].astype(np.int64)
    emin, emax = int(e.min()), int(e.max())
    if emin < -900 or emax > 900 or emax - emin > 4096:
        return None
    idx = e - emin                                      # [n] exponent bins, 0..4096
    hi = M >> 26                                        # floor: M = hi * 2^26 + lo, 0 <= lo < 2^26
    lo = M - (hi << 26)
    if len(M) < BINCOUNT_MAX:
        # per-exponent sums by bincount, no sort: its float64 running sums stay integers
        # of magnitude < n * 2^27 < 2^53, so every addition is exact
        his = np.bincount(idx, weights=hi.astype(np.float64))
        los = np.bincount(idx, weights=lo.astype(np.float64))
        bins = np.flatnonzero((his != 0) | (los != 0))
        sums = zip(bins.tolist(), his[bins].astype(np.int64).tolist(), los[bins].astype(np.int64).tolist())
    else:                                               # int64 sums per run of equal exponents
        order = np.argsort(idx, kind="stable")
        es = idx[order]
        starts = np.flatnonzero(np.r_[True, es[1:] != es[:-1]])
        sums = zip(es[starts].tolist(), np.add.reduceat(hi[order], starts).tolist(),
                   np.add.reduceat(lo[order], starts).tolist())
    S = 0
    for sh, h, low in sums:
        S += (h << (sh + 26)) + (low << sh)
    k = emin - 53                                       # exact sum = S * 2^k
    out = []
    while S:
        f = float(S)                                    # correctly rounded, integer-valued
        out.append(math.ldexp(f, k))
        S -= int(f)
    return out or [0.0]


def _shewchuk_partials(values, partials=()) -> list:
    """Non-overlapping floats whose exact sum is the exact sum of `values` and `partials`."""
    ps = [float(p) for p in partials]
    for x in values:
        x = float(x)
        i = 0
        for y in ps:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                ps[i] = lo
                i += 1
            x = hi
        ps[i:] = [x]
    return ps
