"""group_rows: the rows of an [R, N0] integer block grouped by equal content (tree shapes).

A uniform-N batch holds a few distinct trees repeated over its R rows (a static tree:
one; a dynamic one: tens), so per-row tree work done once per distinct shape and
gathered back is R / U times cheaper. The grouping is exact: rows are grouped by a
fingerprint, then every row is verified against its group's first row, and a row
that differs gets a group of its own (a collision costs time, never a wrong answer).

Cost per batch: one matrix-vector product (the fingerprint, over the block's bytes
read as uint64 words), a few passes over R fingerprints while few groups exist (the
usual batch: no sort), np.unique otherwise, and one gather + compare to verify.
"""
from __future__ import annotations

import numpy as np

I64 = np.int64
_PEEL_MAX = 32     # distinct fingerprints taken one by one, beyond: np.unique of the rest
_W = np.random.default_rng(20261202).integers(1, 2**63 - 1, size=8192, dtype=np.int64).astype(np.uint64) \
    | np.uint64(1)


def _words(P: np.ndarray) -> np.ndarray:
    """The block's rows as uint64 words [R, W] (a view when the rows allow it)."""
    if P.dtype.itemsize == 8 and P.flags.c_contiguous:
        return P.view(np.uint64)
    if P.dtype.itemsize == 4 and P.flags.c_contiguous and P.shape[1] % 2 == 0:
        return P.view(np.uint64)                          # two int32 entries a word
    return np.ascontiguousarray(P, dtype=I64).view(np.uint64)


def group_rows(P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P [R, N0] int (R >= 1) -> (ids int64 [R], first int64 [U]): rows of one id are
    equal, and equal rows share an id (but a row split off by a fingerprint collision:
    a group of its own); first[u] is a row of group u."""
    R = P.shape[0]
    V = _words(P)
    if V.shape[1] > len(_W):                              # (wider than any tree the contract allows)
        V = np.ascontiguousarray(V)
        fp = np.zeros(R, dtype=np.uint64)
        for c in range(0, V.shape[1], len(_W)):
            blk = V[:, c: c + len(_W)]
            fp += blk @ _W[: blk.shape[1]]
    else:
        fp = V @ _W[: V.shape[1]]                         # uint64 arithmetic wraps: a hash mod 2^64
    ids = np.empty(R, dtype=I64)
    left = np.ones(R, dtype=bool)
    firsts: list[int] = []
    r0 = 0
    while len(firsts) < _PEEL_MAX:                        # few groups: one pass over fp each
        m = fp == fp[r0]
        ids[m] = len(firsts)
        firsts.append(r0)
        left &= ~m
        r0 = int(np.argmax(left))
        if not left[r0]:
            break
    first = np.asarray(firsts, dtype=I64)
    if left.any():                                        # many groups: sort the rest
        rest = np.flatnonzero(left)
        _, f2, inv = np.unique(fp[rest], return_index=True, return_inverse=True)
        ids[rest] = len(first) + inv.reshape(-1)
        first = np.concatenate((first, rest[f2]))
    # verify: every row equals its group's first row (one broadcast compare for one group)
    rep = V[first[0]] if len(first) == 1 else V[first[ids]]
    if len(first) == 1 and (V == rep).all() or len(first) > 1 and np.array_equal(V, rep):
        return ids, first
    mism = np.flatnonzero((V != rep).any(axis=1))         # fingerprint collision: own groups
    ids[mism] = len(first) + np.arange(mism.size)
    return ids, np.concatenate((first, mism))
