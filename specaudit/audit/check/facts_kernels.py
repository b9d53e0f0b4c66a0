"""Compiled kernels for facts.py's per-request output facts: facts_kernels.c, built and
loaded by invariants/compiled.py (importing this module builds it on first use).

Loaded only through invariants/compiled.kernels (None: facts.py's numpy, which stays
the definition); tests/test_compiled_facts.py holds both equal, dtypes included.

    h, first, last, eos_in = output_facts(off, vals, olen, eos_id)
    ref_equal, first_diff = reference_facts(off, vals, olen, roff, rvals, rlen)

One pass over each request's tokens, straight from the list column's Arrow buffers
(off, vals as list_parts gives them: a null list's values are never read), instead of
numpy's per-token index, fingerprint, reduceat and searches.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from specaudit.invariants.compiled import library

_LIB = library(Path(__file__).with_name("facts_kernels.c"))
_P, _I = ctypes.c_void_p, ctypes.c_int64
for _w in ("o32_v32", "o32_v64", "o64_v32", "o64_v64"):
    getattr(_LIB, "output_facts_" + _w).argtypes = [_I, _P, _P, _P, _I, _P, _P, _P, _P]
for _w in ("o32_v32", "o64_v64"):
    getattr(_LIB, "reference_facts_" + _w).argtypes = [_I, _P, _P, _P, _P, _P, _P, _P, _P]


def _width(a: np.ndarray) -> tuple[np.ndarray, str]:
    """a as contiguous int32 or int64 (other ints widened to int64), and its name."""
    if a.dtype == np.int32:
        return np.ascontiguousarray(a), "32"
    return np.ascontiguousarray(a, dtype=np.int64), "64"


def output_facts(off, vals, olen, eos):
    """off int32|int64 [R+1], vals ints [V] (row i: vals[off[i]: off[i] + olen[i]]),
    olen int64 [R] (-1: a null list), eos int -> (output_hash uint64 [R]: token_mix
    summed over positions 1.., 0 for an empty or null output; output_first, output_last
    int64 [R], -1 when empty; eos_inside int64 [R]: the first eos before the last token,
    -1 when none)."""
    R = len(olen)
    off, ow = _width(off)
    vals, vw = _width(vals)
    olen = np.ascontiguousarray(olen, dtype=np.int64)
    h = np.empty(R, dtype=np.uint64)
    first, last, eos_in = (np.empty(R, dtype=np.int64) for _ in range(3))
    getattr(_LIB, f"output_facts_o{ow}_v{vw}")(R, off.ctypes.data, vals.ctypes.data, olen.ctypes.data, int(eos),
                                              h.ctypes.data, first.ctypes.data, last.ctypes.data, eos_in.ctypes.data)
    return h, first, last, eos_in


def reference_facts(off, vals, olen, roff, rvals, rlen):
    """The output against reference_tokens (same layout: roff, rvals, rlen int64 [R],
    -1 a null list) -> (reference_equal int64 [R]: 1 equal, 0 not, -1 no reference;
    reference_first_diff int64 [R]: the first position that differs, the shorter
    length when one is a prefix of the other, -1 when equal or no reference). A null
    output counts as empty."""
    R = len(olen)
    w = "o32_v32" if all(x.dtype == np.int32 for x in (off, vals, roff, rvals)) else "o64_v64"
    dt = np.int32 if w == "o32_v32" else np.int64
    a = [np.ascontiguousarray(x, dtype=t) for x, t in ((off, dt), (vals, dt), (olen, np.int64), (roff, dt),
                                                        (rvals, dt), (rlen, np.int64))]
    eq, diff = np.empty(R, dtype=np.int64), np.empty(R, dtype=np.int64)
    getattr(_LIB, "reference_facts_" + w)(R, *(x.ctypes.data for x in a), eq.ctypes.data, diff.ctypes.data)
    return eq, diff
