"""RequestIds' hash -> slot map in C: ids_kernels.c, built and loaded by
invariants/compiled.py (importing this module builds it on first use); imported only
through compiled.kernels. The numpy levels of invariants/request_ids.py are the
definition: tests/test_compiled_ids.py holds every slot given here equal to theirs.

A Table is an open-addressing hash table (int64 [cap], a power of two, at most 80% full;
doubled and rehashed in C when full) of the ids' hashes (hash_ids: of their UTF-8 bytes,
read from an Arrow column's buffers, where Python's hash needs a str made for each id),
plus the hash of each slot (int64, dense): 8 + 8 / load bytes per id (load between 40%
and 80%: 18 to 28), where the numpy levels keep 16 (and twice that while merging),
beside the ids' bytes and offsets (8 + their UTF-8 bytes) that RequestIds keeps either
way. Measured, with the offsets: 29 to 41 bytes per id for 0.1M to 3M ids (numpy's
levels: 24 to 28), the peak while indexing no higher than numpy's.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .compiled import bind, library
from .request_ids import _grown

I64 = np.int64
_LIB = library(Path(__file__).with_name("ids_kernels.c"))
_INSERT = bind(_LIB, "ids_insert", "i l l ol i ol")
_REHASH = bind(_LIB, "ids_rehash", "i l ol i l")
_LOOKUP = bind(_LIB, "ids_lookup", "i y l l l i l y l ol")
_INDEX = bind(_LIB, "ids_index", "i i y l l ol i i ol i oy i ol i ol ol", returns=True)
_HASH = bind(_LIB, "ids_hash", "i y l ol")
MAX_SLOTS = 1 << 40     # ids_kernels.c's SLOT_BITS


def hash_ids(blob: np.ndarray, off: np.ndarray) -> np.ndarray:
    """The table's hash of each id (int64 [len(off) - 1]) from its UTF-8 bytes (blob/off, as
    request_ids._encode gives them): ids_hash, no Python str made."""
    L = len(off) - 1
    out = np.empty(L, dtype=I64)
    if L:
        _HASH(L, blob, off, out)
    return out


def _limit(cap: int) -> int:
    return cap * 4 // 5


class Table:
    """(hash, slot) pairs (hashes distinct), `slots` slots in all: a RequestIds' ids so far."""

    def __init__(self, h: np.ndarray, s: np.ndarray, slots: int):
        cap = 1024
        while _limit(cap) < len(h) + 1:
            cap *= 2
        self.table = np.full(cap, -1, dtype=I64)
        self.hashes = np.zeros(max(1024, slots + slots // 2), dtype=I64)
        self.used = len(h)
        _INSERT(len(h), h, s, self.table, cap - 1, self.hashes)

    def lookup(self, blob, off, h, data, offsets) -> np.ndarray:
        """Slot of each id; -1: the hash is not held; -2 - owner: held by slot owner, another id."""
        out = np.empty(len(h), dtype=I64)
        _LOOKUP(len(h), blob, off, h, self.table, len(self.table) - 1, self.hashes, data, offsets, out)
        return out

    def index(self, ids, blob, off, h) -> np.ndarray:
        """ids_index over a batch, growing ids' data / offsets and this table when they are
        full. Returns the slots (-2 - owner where the hash is another id's: Python's)."""
        L = len(h)
        out = np.empty(L, dtype=I64)
        state = np.array([ids.n, self.used], dtype=I64)
        i = 0
        while True:
            cap = len(self.table)
            i = _INDEX(L, i, blob, off, h, self.table, cap - 1, _limit(cap), self.hashes, len(self.hashes),
                       ids._data, len(ids._data), ids._offsets, len(ids._offsets), out, state)
            ids.n, self.used = int(state[0]), int(state[1])
            if i == L:
                return out
            self._room(ids, L - i, int(off[L] - off[i]))

    def _room(self, ids, k: int, length: int) -> None:
        """Room for k more ids of `length` bytes in all (the rest of a batch, were they all
        new: one growth per batch at most; an array grows by half at least, the table doubles)."""
        n = ids.n
        if n + k >= MAX_SLOTS:
            raise OverflowError(f"more than {MAX_SLOTS} request ids")
        need = int(ids._offsets[n]) + length
        if need > len(ids._data):
            ids._data = _grown(ids._data, need)
        if n + k + 1 > len(ids._offsets):
            ids._offsets = _grown(ids._offsets, n + k + 1)
        if n + k > len(self.hashes):
            self.hashes = _grown(self.hashes, n + k)
        cap = len(self.table)
        if self.used + k > _limit(cap):
            while self.used + k > _limit(cap):
                cap *= 2
            old = self.table
            self.table = np.full(cap, -1, dtype=I64)
            _REHASH(len(old), old, self.table, cap - 1, self.hashes)

    def nbytes(self) -> int:
        return self.table.nbytes + self.hashes.nbytes
