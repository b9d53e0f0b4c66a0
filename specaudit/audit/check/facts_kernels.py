"""Compiled kernels for facts.py's per-request output facts (numba, the `fast` extra).

Loaded only through invariants/compiled.kernels (None: facts.py's numpy, which stays
the definition); tests/test_compiled_facts.py holds both equal, dtypes included.

    h, first, last, eos_in = output_facts(off, vals, olen, eos_id)
    ref_equal, first_diff = reference_facts(off, vals, olen, roff, rvals, rlen)

One pass over each request's tokens, straight from the list column's Arrow buffers
(off, vals as list_parts gives them: a null list's values are never read), instead of
numpy's per-token index, fingerprint, reduceat and searches.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# invariants/carry.py's token_mix constants: the fingerprint must stay bit-identical
from specaudit.invariants.carry import _MIX1, _MIX2, _MIX3

_U1, _S31, _S29 = np.uint64(1), np.uint64(31), np.uint64(29)


@njit(cache=True, nogil=True)
def _mix(t, pos):
    """carry.token_mix of one token t (any int: sign-extended to 64 bits) at position pos."""
    x = ((np.uint64(np.int64(t)) + _U1) * _MIX1) ^ (np.uint64(pos) * _MIX2)
    x ^= x >> _S31
    x *= _MIX3
    return x ^ (x >> _S29)


@njit(cache=True, nogil=True)
def output_facts(off, vals, olen, eos):
    """off int32|int64 [R+1], vals ints [V] (row i: vals[off[i]: off[i] + olen[i]]),
    olen int64 [R] (-1: a null list), eos int64 -> (output_hash uint64 [R]: token_mix
    summed over positions 1.., 0 for an empty or null output; output_first, output_last
    int64 [R], -1 when empty; eos_inside int64 [R]: the first eos before the last token,
    -1 when none)."""
    R = len(olen)
    h = np.zeros(R, dtype=np.uint64)
    first = np.full(R, -1, dtype=np.int64)
    last = np.full(R, -1, dtype=np.int64)
    eos_in = np.full(R, -1, dtype=np.int64)
    for i in range(R):
        n = olen[i]
        if n <= 0:
            continue
        s = np.int64(off[i])
        first[i] = np.int64(vals[s])
        last[i] = np.int64(vals[s + n - 1])
        acc = np.uint64(0)
        for j in range(1, n):
            acc += _mix(vals[s + j], j)
        h[i] = acc
        for j in range(n - 1):
            if np.int64(vals[s + j]) == eos:
                eos_in[i] = j
                break
    return h, first, last, eos_in


@njit(cache=True, nogil=True)
def reference_facts(off, vals, olen, roff, rvals, rlen):
    """The output against reference_tokens (same layout: roff, rvals, rlen int64 [R],
    -1 a null list) -> (reference_equal int64 [R]: 1 equal, 0 not, -1 no reference;
    reference_first_diff int64 [R]: the first position that differs, the shorter
    length when one is a prefix of the other, -1 when equal or no reference). A null
    output counts as empty."""
    R = len(olen)
    eq = np.full(R, -1, dtype=np.int64)
    diff = np.full(R, -1, dtype=np.int64)
    for i in range(R):
        if rlen[i] < 0:
            continue
        n, rn = max(olen[i], 0), rlen[i]
        m = min(n, rn)
        s, rs = np.int64(off[i]), np.int64(roff[i])
        d = -1
        for j in range(m):
            if np.int64(vals[s + j]) != np.int64(rvals[rs + j]):
                d = j
                break
        if d < 0 and n != rn:
            d = m
        diff[i] = d
        eq[i] = 1 if d < 0 else 0
    return eq, diff
