"""RequestIds: request id strings -> dense slots 0, 1, 2, ... in order of first appearance.

The checker's per-request carry (invariants/frame.py, Carry) needs one slot per request
of a run, and a run can hold millions of requests. A dict of Python strings costs about
200 bytes per id (the str, its int value, the dict entry, a list entry); here the ids
live in numpy buffers, about 24 bytes plus the id's UTF-8 bytes each:

    levels   [(hashes int64 [U_k], slots int64 [U_k])]: Python's hash of each id (stable
             within the process), sorted, with its slot; a batch's new ids are a new level
             and levels of similar size are merged (a log-structured merge: each id is
             copied O(log U) times, and a lookup searches O(log U) sorted arrays)
    data     uint8 [B]    every id's UTF-8 bytes, in slot order
    offsets  int64 [Q+1]  id q is data[offsets[q]:offsets[q + 1]]

A lookup is a binary search of the batch's hashes, verified byte for byte against the
stored id: ids whose hashes collide never share a slot (the later one is kept in a
small dict, `_collided`, searched first). Python work per call: one hash and one length
per id (C loops); the rest is vectorised.

Compiled (invariants/ids_kernels.c, through compiled.kernels): once the map and a call
hold MIN_ROWS ids or more together (`rows` = ids in the map + ids in the call), the levels
are taken over by an open-addressing hash table in C (ids_kernels.Table) and every later
call goes through it: one pass per batch, lookups, new slots and the ids' bytes appended
in C. Its hash is of the ids' bytes (ids_kernels.hash_ids), computed in C, so a call that
gives the bytes (`encoded`, an Arrow column's buffers) and no names makes no Python str at
all; the stored ids are hashed again when the table takes over. The same slots as the
levels give, collisions included (C leaves an id whose hash another id holds to the same
Python as here, `_settle`; `_collided` then holds the ids of either hash's collisions).
"""
from __future__ import annotations

import numpy as np

from . import compiled

I64 = np.int64
KERNELS = "specaudit.invariants.ids_kernels"


class RequestIds:
    def __init__(self):
        self._levels: list[tuple[np.ndarray, np.ndarray]] = []   # largest first
        self._data = np.zeros(1024, dtype=np.uint8)
        self._offsets = np.zeros(1024, dtype=I64)
        self._collided: dict[str, int] = {}   # ids whose hash another id already holds
        self._table = None                     # ids_kernels.Table, once compiled (replaces the levels)
        self._kern = None                      # its module (ids_kernels: hash_ids)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k):
        """The id of slot k (a str), or a list of them for a slice."""
        if isinstance(k, slice):
            return [self._name(i) for i in range(*k.indices(self.n))]
        if k < 0:
            k += self.n
        if not 0 <= k < self.n:
            raise IndexError(k)
        return self._name(k)

    def _name(self, q: int) -> str:
        return self._data[self._offsets[q]: self._offsets[q + 1]].tobytes().decode("utf-8", "surrogatepass")

    def slot_of(self, name: str) -> int:
        """The slot of one id, or -1 when it was never indexed."""
        if name in self._collided:
            return self._collided[name]
        enc = _encode([name])
        if self._table is not None:
            h = self._kern.hash_ids(*enc)
            return max(int(self._table.lookup(*enc, h, self._data, self._offsets)[0]), -1)
        got = self._lookup([name], *enc, np.array([hash(name)], dtype=I64))
        return int(got[0])

    def index(self, names: list[str] | None, encoded: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """Slots of the ids (int64 [L]); ids not seen before get new slots, each once, in
        order of first appearance. `names`: the ids as str; `encoded`: their UTF-8 bytes
        and offsets (_encode(names)) when the caller has them (an Arrow string column's
        buffers: arrow_encoded), and then `names` may be None: made from the bytes only
        where needed (never, once compiled, but for a collision)."""
        blob, off = _encode(names) if encoded is None else encoded
        L = len(off) - 1
        if L == 0:
            return np.zeros(0, dtype=I64)
        if self._table is None and (kern := compiled.kernels(KERNELS, rows=self.n + L)) is not None:
            self._take_over(kern)
        if self._table is not None:
            base = self.n
            out = self._table.index(self, blob, off, self._kern.hash_ids(blob, off))
            bad = np.flatnonzero(out < -1)
            if bad.size:
                self._settle(blob, off, out, bad, base)
            return out
        if names is None:
            names = _decode(blob, off, range(L))
        h = np.fromiter(map(hash, names), dtype=I64, count=L)
        out = self._lookup(names, blob, off, h)
        new = np.flatnonzero(out < 0)
        if new.size:
            self._add(names, blob, off, h, new, out)
        return out

    # --------------------------------------------------------------- internals
    def _take_over(self, kern) -> None:
        """The table replaces the levels: every stored id hashed by its bytes (hash_ids,
        not the levels' Python hash) and inserted, the first of each hash; a later id whose
        hash an earlier one holds is a collision (kept in `_collided`, as in _add)."""
        n = self.n
        h = kern.hash_ids(self._data, self._offsets[: n + 1])
        _, first = np.unique(h, return_index=True)
        first.sort()
        self._kern = kern
        self._table = kern.Table(h[first], first.astype(I64), n)
        if len(first) < n:
            rest = np.setdiff1d(np.arange(n, dtype=I64), first, assume_unique=True)
            for q, name in zip(rest.tolist(), _decode(self._data, self._offsets, rest.tolist())):
                self._collided.setdefault(name, q)
        self._levels = []

    def _find(self, h: np.ndarray) -> np.ndarray:
        """The slot holding each hash, -1 where none does (a hash is in one level at most)."""
        out = np.full(len(h), -1, dtype=I64)
        if not self._levels or not len(h):
            return out
        order = np.argsort(h)
        hs = h[order]                                     # sorted needles: cache-friendly searches
        for H, S in self._levels:
            pos = np.minimum(np.searchsorted(H, hs), len(H) - 1)
            hit = H[pos] == hs
            out[order[hit]] = S[pos[hit]]
        return out

    def _push(self, h: np.ndarray, slots: np.ndarray) -> None:
        """Add (hash, slot) pairs whose hashes no level holds."""
        if not len(h):
            return
        order = np.argsort(h, kind="stable")
        self._levels.append((h[order], slots[order]))
        while len(self._levels) > 1 and len(self._levels[-2][0]) <= 2 * len(self._levels[-1][0]):
            (h1, s1), (h2, s2) = self._levels[-2:]
            hh = np.concatenate((h1, h2))
            order = np.argsort(hh, kind="stable")
            self._levels[-2:] = [(hh[order], np.concatenate((s1, s2))[order])]

    def _lookup(self, names, blob, off, h) -> np.ndarray:
        """Slots of known ids, -1 for the others (a hash hit whose bytes differ included)."""
        slot = self._find(h)
        out = np.full(len(h), -1, dtype=I64)
        cand = np.flatnonzero(slot >= 0)
        if cand.size:
            same = _same_bytes(blob, off, cand, self._data, self._offsets, slot[cand])
            out[cand[same]] = slot[cand[same]]
        if self._collided:
            for i in np.flatnonzero(out < 0):
                out[i] = self._collided.get(names[i], -1)
        return out

    def _add(self, names, blob, off, h, new: np.ndarray, out: np.ndarray) -> None:
        """Give the unknown ids at `new` their slots (written into `out`)."""
        # one candidate per distinct hash: its first occurrence; the others must be the
        # same id (verified) or are collisions, handled one by one (rare)
        _, first = np.unique(h[new], return_index=True)
        first = np.sort(new[first])                       # batch order of first appearance
        known = self._find(h[first]) >= 0                 # a hash another id already holds
        collide, first = first[known], first[~known]
        base = self.n
        self._append(blob, off, first)
        slots = base + np.arange(len(first), dtype=I64)
        self._push(h[first], slots)
        order = np.argsort(h[first], kind="stable")
        # every other unknown row: the same id as its hash's first occurrence, or a collision
        rest = np.setdiff1d(new, first, assume_unique=True)
        rest = rest[~np.isin(rest, collide)]
        for i in collide.tolist():                        # (their slots come after the batch's others)
            self._collide(names[i], out, i)
        if rest.size and first.size:
            hf = h[first][order]                          # first's hashes, sorted
            pos = np.minimum(np.searchsorted(hf, h[rest]), len(hf) - 1)
            ok = hf[pos] == h[rest]
            if ok.any():
                j = order[pos[ok]]                        # index into first
                same = _same_bytes(blob, off, rest[ok], blob, off, first[j])
                out[rest[ok][same]] = slots[j[same]]
        out[first] = slots
        for i in np.flatnonzero(out < 0).tolist():        # collisions inside this batch
            self._collide(names[i], out, i)

    def _settle(self, blob, off, out: np.ndarray, rows: np.ndarray, base: int) -> None:
        """The compiled pass's rows whose hash another id holds (out = -2 - that slot), as
        _lookup and _add give them: a collided id's slot; else the batch's new ids' slots
        are followed by the first of each hash held before the batch, then the others."""
        names = dict(zip(rows.tolist(), _decode(blob, off, rows.tolist())))
        left = []
        for i in rows.tolist():
            q = self._collided.get(names[i])
            if q is None:
                left.append(i)
            else:
                out[i] = q
        owners, first = set(), []
        for i in left:
            o = -2 - int(out[i])
            if o < base and o not in owners:
                owners.add(o)
                first.append(i)
        for i in first:
            self._collide(names[i], out, i)
        for i in left:
            if out[i] < 0:
                self._collide(names[i], out, i)

    def _collide(self, name: str, out: np.ndarray, i: int) -> None:
        q = self._collided.get(name)
        if q is None:
            q = self._collided[name] = self.n
            enc = name.encode("utf-8", "surrogatepass")
            self._append(np.frombuffer(enc, dtype=np.uint8), np.array([0, len(enc)], dtype=I64),
                         np.zeros(1, dtype=I64))
        out[i] = q

    def _append(self, blob: np.ndarray, off: np.ndarray, rows: np.ndarray) -> None:
        """Store the ids at `rows` (of a batch encoded as blob/off) as the next slots."""
        lens = off[rows + 1] - off[rows]
        n, k = self.n, len(rows)
        end = int(self._offsets[n])
        need = end + int(lens.sum())
        if need > len(self._data):
            self._data = _grown(self._data, need)
        if n + k + 1 > len(self._offsets):
            self._offsets = _grown(self._offsets, n + k + 1)
        starts = np.cumsum(lens) - lens
        src = np.repeat(off[rows] - starts, lens) + np.arange(int(lens.sum()), dtype=I64)
        self._data[end: need] = blob[src]
        self._offsets[n + 1: n + k + 1] = end + np.cumsum(lens)
        self.n = n + k


def _decode(blob: np.ndarray, off: np.ndarray, rows) -> list[str]:
    """The ids at `rows` of blob/off (_encode's layout) as str."""
    b = blob.tobytes() if len(rows) > 64 else None     # one copy for many, a slice each for few
    return [(b[off[i]: off[i + 1]] if b is not None else blob[off[i]: off[i + 1]].tobytes())
            .decode("utf-8", "surrogatepass") for i in rows]


def _grown(a: np.ndarray, need: int) -> np.ndarray:
    b = np.zeros(max(need, len(a) + len(a) // 2), dtype=a.dtype)
    b[: len(a)] = a
    return b


def _encode(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """-> (every id's UTF-8 bytes concatenated, offsets int64 [L+1])."""
    if all(map(str.isascii, names)):                      # one encode, lengths in characters
        blob = "".join(names).encode("ascii")
        lens = np.fromiter(map(len, names), dtype=I64, count=len(names))
    else:
        enc = [n.encode("utf-8", "surrogatepass") for n in names]
        blob = b"".join(enc)
        lens = np.fromiter(map(len, enc), dtype=I64, count=len(enc))
    off = np.zeros(len(names) + 1, dtype=I64)
    np.cumsum(lens, out=off[1:])
    return np.frombuffer(blob, dtype=np.uint8), off


def arrow_encoded(arr) -> tuple[np.ndarray, np.ndarray] | None:
    """_encode's (bytes, offsets) of a pyarrow string array without nulls, read from its
    buffers (Arrow strings are UTF-8: the bytes _encode gives), or None: call _encode."""
    import pyarrow as pa
    if arr.null_count or not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        return None
    n = len(arr)
    _, ob, db = arr.buffers()
    ot = np.int32 if pa.types.is_string(arr.type) else I64
    o = np.frombuffer(ob, dtype=ot, count=n + 1, offset=arr.offset * np.dtype(ot).itemsize)
    lo, hi = int(o[0]), int(o[n])
    blob = np.frombuffer(db, dtype=np.uint8, count=hi - lo, offset=lo) if hi > lo else np.zeros(0, np.uint8)
    return blob, o.astype(I64) - lo


def _same_bytes(a: np.ndarray, aoff: np.ndarray, ai: np.ndarray,
                b: np.ndarray, boff: np.ndarray, bi: np.ndarray) -> np.ndarray:
    """Per pair k: is string ai[k] of (a, aoff) byte-equal to string bi[k] of (b, boff)."""
    la = aoff[ai + 1] - aoff[ai]
    same = la == boff[bi + 1] - boff[bi]
    k = np.flatnonzero(same & (la > 0))
    if k.size:
        lens = la[k]
        starts = np.cumsum(lens) - lens
        step = np.arange(int(lens.sum()), dtype=I64) - np.repeat(starts, lens)
        diff = a[np.repeat(aoff[ai[k]], lens) + step] != b[np.repeat(boff[bi[k]], lens) + step]
        if diff.any():
            same[k[np.add.reduceat(diff, starts) > 0]] = False
    return same
