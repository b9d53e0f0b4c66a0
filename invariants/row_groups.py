"""group_rows: the rows of an [R, N0] integer block grouped by equal content (tree shapes).

A uniform-N batch holds a few distinct trees repeated over its R rows (a static tree:
one; a dynamic one: tens), so per-row tree work done once per distinct shape and
gathered back is R / U times cheaper. The grouping is exact: rows are grouped by a
fingerprint, then every row is verified against its group's first row, and a row
that differs gets a group of its own (a collision costs time, never a wrong answer).

Cost per batch: one matrix-vector product (the fingerprint, over the block's bytes
read as uint64 words), a sort of the first rows' fingerprints and a binary search of
every row's among them (np.unique of the rest when the first rows lack some), and a
gather + compare to verify, by chunks of rows (a fresh R x N0 temporary costs more in
page faults than the compare).
"""
from __future__ import annotations

import numpy as np

I64 = np.int64
_HEAD_ROWS = 4096   # rows whose distinct fingerprints are found by a sort: the others by a search
_CHUNK = 4096       # rows verified at a time
_W = np.random.default_rng(20261202).integers(1, 2**63 - 1, size=8192, dtype=np.int64).astype(np.uint64) \
    | np.uint64(1)


def _words(P: np.ndarray) -> np.ndarray:
    """The block's rows as uint64 words [R, W] (a view when the rows allow it)."""
    if P.dtype.itemsize == 8 and P.flags.c_contiguous:
        return P.view(np.uint64)
    if P.dtype.itemsize == 4 and P.flags.c_contiguous and P.shape[1] % 2 == 0:
        return P.view(np.uint64)                          # two int32 entries a word
    return np.ascontiguousarray(P, dtype=I64).view(np.uint64)


def group_rows(P: np.ndarray, kern=None) -> tuple[np.ndarray, np.ndarray]:
    """P [R, N0] int (R >= 1) -> (ids int64 [R], first int64 [U]): rows of one id are
    equal, and equal rows share an id (but a row split off by a fingerprint collision:
    a group of its own); first[u] is a row of group u. kern: the compiled kernels of
    invariants/sort_kernels.py (a big batch), the same answer in one pass when the
    prefix holds every shape and no fingerprint collides, else numpy's."""
    R = P.shape[0]
    V = _words(P)
    # one group (a chain, a static tree): the prefix first, then every row (in one C pass
    # for a big batch: numpy's broadcast compare over short rows is slow)
    if (V[:64] == V[0]).all() and (kern.rows_same(np.ascontiguousarray(V)) if kern is not None
                                   else (V == V[0]).all()):
        return np.zeros(R, dtype=I64), np.zeros(1, dtype=I64)
    if kern is not None and V.shape[1] <= len(_W):
        got = kern.row_groups(np.ascontiguousarray(V), _W[: V.shape[1]], _HEAD_ROWS)
        if got is not None:
            return got
    if V.shape[1] > len(_W):                              # (wider than any tree the contract allows)
        V = np.ascontiguousarray(V)
        fp = np.zeros(R, dtype=np.uint64)
        for c in range(0, V.shape[1], len(_W)):
            blk = V[:, c: c + len(_W)]
            fp += blk @ _W[: blk.shape[1]]
    else:
        fp = V @ _W[: V.shape[1]]                         # uint64 arithmetic wraps: a hash mod 2^64
    # the distinct fingerprints of a prefix (a batch's shapes show up early), every row
    # looked up among them; rows whose fingerprint the prefix lacks: np.unique of those
    head = fp[: min(R, _HEAD_ROWS)]
    cands, first = np.unique(head, return_index=True)
    pos = np.minimum(np.searchsorted(cands, fp), len(cands) - 1)
    ids = pos.astype(I64, copy=False)
    rest = np.flatnonzero(cands[pos] != fp)
    if rest.size:
        _, f2, inv = np.unique(fp[rest], return_index=True, return_inverse=True)
        ids[rest] = len(first) + inv.reshape(-1)
        first = np.concatenate((first, rest[f2]))
    # verify: every row equals its group's first row (by chunks of rows: small temporaries)
    mism = [c + np.flatnonzero((V[c: c + _CHUNK] != V[first[ids[c: c + _CHUNK]]]).any(axis=1))
            for c in range(0, R, _CHUNK)
            if not np.array_equal(V[c: c + _CHUNK], V[first[ids[c: c + _CHUNK]]])]
    if mism:                                              # fingerprint collision: own groups
        mism = np.concatenate(mism)
        ids[mism] = len(first) + np.arange(mism.size)
        first = np.concatenate((first, mism))
    return ids, first
