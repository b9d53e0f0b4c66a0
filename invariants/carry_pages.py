"""_Pages: the paged storage of a Carry with many requests (invariants/carry.py).

Slot s lives in page s // P at offset s % P. The carry's field arrays then hold only
the pages in memory, each in one block of P rows:

    res    int64 [pages]    page -> its block in the arrays, -1 when not in memory
    disk   bool  [pages]    the page was written to the spill folder (page-<p>.bin:
                            each field's P values, raw, in Carry.FIELDS order)
    used   int64 [blocks]   the rows() call that last touched the block (LRU order)

A page neither in memory nor on disk has no slot with a step yet: every value is
the field's default. Pages are read back on demand, so any access pattern gets the
same state; each read-back keeps one more page in memory from then on (see _load).
"""
from __future__ import annotations

import weakref

import numpy as np

I64 = np.int64


class _Pages:
    def __init__(self, carry, page: int, keep: int):
        """Page the dense arrays of `carry` (its first carry.n slots), keeping at most
        `keep` pages in memory after each trim()."""
        # a proxy, not a reference: no cycle, so a carry dropped unclosed is freed (and
        # its spill folder removed, invariants/spill.py) at once
        self.c, self.P, self.keep = weakref.proxy(carry), page, keep
        P = page
        have = -(-carry.n // P)                          # pages holding the dense slots
        dense = {k: getattr(carry, k)[: carry.n] for k in carry.FIELDS}
        carry._alloc(max(have, 1) * P)
        for k, a in dense.items():
            getattr(carry, k)[: len(a)] = a
        self.res = np.full(have, -1, dtype=I64)
        self.res[:have] = np.arange(have)
        self.disk = np.zeros(have, dtype=bool)
        self.used = np.zeros(max(have, 1), dtype=I64)
        self.free = [] if have else [0]
        self.clock = 0
        self.trim()

    def grow(self, n: int) -> None:
        """Room in the page table for n slots (new pages: defaults, not in memory)."""
        pages = -(-n // self.P)
        if pages > len(self.res):
            extra = pages - len(self.res)
            self.res = np.concatenate((self.res, np.full(extra, -1, dtype=I64)))
            self.disk = np.concatenate((self.disk, np.zeros(extra, dtype=bool)))

    def rows(self, slots: np.ndarray) -> np.ndarray:
        P = self.P
        pages = slots // P
        need = np.unique(pages)
        for p in need[self.res[need] < 0].tolist():
            self._load(p)
        self.clock += 1
        self.used[self.res[need]] = self.clock
        return self.res[pages] * P + slots % P

    def trim(self) -> None:
        """Write out (or drop) the least recently used pages until `keep` are in memory."""
        inmem = np.flatnonzero(self.res >= 0)
        over = len(inmem) - self.keep
        if over <= 0:
            return
        order = np.lexsort((inmem, self.used[self.res[inmem]]))   # oldest first, then by page
        for p in inmem[order[:over]].tolist():
            self._evict(p)

    def fields(self, lo: int, hi: int) -> dict:
        """Every field over slots [lo, hi), copied (pages not in memory read, not loaded)."""
        c, P = self.c, self.P
        out = {k: np.full(hi - lo, v, dtype=dt) for k, (dt, v) in c.FIELDS.items()}
        for p in range(lo // P, -(-hi // P)):
            a, b = max(lo, p * P), min(hi, (p + 1) * P)   # slots of page p in the range
            if a >= b:
                continue
            if self.res[p] >= 0:
                base = self.res[p] * P - p * P
                for k in c.FIELDS:
                    out[k][a - lo: b - lo] = getattr(c, k)[base + a: base + b]
            elif self.disk[p]:
                for k, v in self._read(p).items():
                    out[k][a - lo: b - lo] = v[a - p * P: b - p * P]
        return out

    # --------------------------------------------------------------- internals
    def _block(self) -> int:
        """A free block of P rows in the arrays (the arrays grow by a quarter if none is)."""
        if not self.free:
            c, P = self.c, self.P
            have = len(c.last_step) // P
            more = max(1, have // 4)
            for k, (dt, v) in c.FIELDS.items():
                a = np.full((have + more) * P, v, dtype=dt)
                a[: have * P] = getattr(c, k)
                setattr(c, k, a)
            self.used = np.concatenate((self.used, np.zeros(more, dtype=I64)))
            self.free = list(range(have + more - 1, have - 1, -1))
        return self.free.pop()

    def _load(self, p: int) -> None:
        c, P = self.c, self.P
        r = self._block()
        got = self._read(p) if self.disk[p] else None
        if got is not None:
            # a page read back: the steps do not come in slot order here. One more page
            # kept per read-back, so a run whose in-flight requests spread over many
            # pages ends up holding them (memory as if dense) instead of rereading them
            # batch after batch; a stray late step costs one page.
            self.keep += 1
        for k, (_, v) in c.FIELDS.items():
            getattr(c, k)[r * P: (r + 1) * P] = got[k] if got is not None else v
        self.res[p] = r

    def _evict(self, p: int) -> None:
        c, P = self.c, self.P
        r = int(self.res[p])
        rows = slice(r * P, (r + 1) * P)
        if c.seen[rows].any():                             # else: all defaults, nothing to keep
            with open(c.spill.file(f"page-{p}.bin"), "wb") as fh:
                for k in c.FIELDS:
                    fh.write(getattr(c, k)[rows].tobytes())
            self.disk[p] = True
        self.res[p] = -1
        self.free.append(r)

    def _read(self, p: int) -> dict:
        c, P = self.c, self.P
        with open(c.spill.file(f"page-{p}.bin"), "rb") as fh:
            buf = fh.read()
        out, off = {}, 0
        for k, (dt, _) in c.FIELDS.items():
            a = np.frombuffer(buf, dtype=dt, count=P, offset=off)
            out[k] = a
            off += a.nbytes
        return out
