"""RequestIds through the compiled hash table (invariants/ids_kernels.c) equals RequestIds
in numpy (its sorted hash levels, the definition): the same slots for every call, the
same ids per slot, the same slot_of and the same collided ids, over random id streams
(repeats, new ids, unicode, empty strings, ids under hashes forced to collide, millions of
ids in batches) and when the table takes over a map the levels began. MIN_ROWS is
patched so that small calls take the compiled path. The table hashes the ids' bytes in C
(ids_kernels.hash_ids), the levels call Python's hash: a test that forces collisions
forces both (`_force`) with one function of the id. The test machine has a C compiler
(scripts/test.sh): nothing here skips without one."""
from __future__ import annotations

import random
import zlib

import numpy as np
import pytest
import specaudit.invariants.request_ids as request_ids
from specaudit.invariants import compiled
from specaudit.invariants.request_ids import KERNELS, RequestIds

POOL = [f"r{i}" for i in range(3000)] + ["é-ü", "\0null", "", "x" * 50, "日本", "\udcff", "a\0b", "ß" * 300]


def _switch_on(mp, min_rows: int):
    """Kernels on; maps and calls of min_rows ids or more compiled (they must load)."""
    mp.setattr(compiled, "MIN_ROWS", min_rows)
    mp.delenv(compiled.ENV, raising=False)
    assert compiled.kernels(KERNELS, rows=min_rows) is not None, "the ids kernels failed to load"


@pytest.fixture
def kernels_on(monkeypatch):
    _switch_on(monkeypatch, 0)
    return monkeypatch


def _force(mp, fn):
    """Both hashes (the levels' Python hash, the table's hash of the bytes) made fn(id)."""
    from specaudit.invariants import ids_kernels

    def of_bytes(blob, off):
        names = request_ids._decode(blob, off, range(len(off) - 1))
        return np.array([fn(n) for n in names], dtype=np.int64)
    mp.setattr(request_ids, "hash", fn, raising=False)
    mp.setattr(ids_kernels, "hash_ids", of_bytes)


class Both:
    """A numpy RequestIds (the reference) and a compiled one, fed the same calls."""

    def __init__(self, mp):
        self.mp, self.ref, self.got = mp, RequestIds(), RequestIds()

    def index(self, names):
        self.mp.setenv(compiled.ENV, "0")
        want = self.ref.index(names)
        self.mp.delenv(compiled.ENV)
        got = self.got.index(names)
        assert self.ref._table is None
        assert got.dtype == want.dtype == np.int64
        assert np.array_equal(got, want)
        return got

    def same(self, names=()):
        ref, got = self.ref, self.got
        assert len(got) == len(ref)
        assert got[:] == ref[:]
        assert got._collided == ref._collided
        if len(ref):
            assert got[-1] == ref[-1] and got[0] == ref[0]
        for n in list(names) + ["never seen", "r999999"]:
            assert got.slot_of(n) == ref.slot_of(n)


def _stream(rng, pool, calls, most):
    for _ in range(calls):
        yield [rng.choice(pool) for _ in range(rng.randint(0, most))]


@pytest.mark.parametrize("seed", range(6))
def test_random_streams(kernels_on, seed):
    rng = random.Random(seed)
    b = Both(kernels_on)
    for names in _stream(rng, POOL, 30, 500):
        b.index(names)
    assert b.got._table is not None
    b.same(rng.sample(POOL, 200))


@pytest.mark.parametrize("modulus", [1, 2, 7, 1000])
@pytest.mark.parametrize("seed", range(3))
def test_forced_collisions(kernels_on, modulus, seed):
    # few hash values for many ids: most lookups collide; slots still equal numpy's. The hash is
    # CRC-32, not Python's: str hashes change with PYTHONHASHSEED, and 68 ids over 1000 values
    # then collided in about nine runs of ten (a fresh venv's run hit the tenth)
    _force(kernels_on, lambda s: zlib.crc32(s.encode("utf-8", "surrogatepass")) % modulus)
    rng = random.Random(seed)
    pool = POOL[:60] + POOL[-8:]
    b = Both(kernels_on)
    for names in _stream(rng, pool, 40, 120):
        got = b.index(names)
        assert [b.got[q] for q in got.tolist()] == names   # each slot holds its id
    assert b.got._collided
    b.same(pool)


def test_collisions_between_and_within_batches(kernels_on):
    _force(kernels_on, len)
    b = Both(kernels_on)
    b.index(["a", "bb", "a"])
    b.index(["c", "b", "dd", "a", "c", "e", "bb", "ccc", "dd", "f"])   # c, dd: hashes held before
    b.index(["e", "x", "yy", "x", "zzz", "c"])
    b.index([])
    b.same(["a", "b", "c", "dd", "e", "x", "yy", "zzz", "ccc"])


def test_table_takes_over_the_levels(monkeypatch):
    # numpy while the map and call are small, then the table takes over (collided ids too)
    _switch_on(monkeypatch, 1000)
    _force(monkeypatch, lambda s: hash(s) % 5000)
    rng = random.Random(3)
    pool = [f"q{i}" for i in range(20000)] + POOL[-8:]
    b = Both(monkeypatch)
    for _ in range(12):
        b.index([rng.choice(pool) for _ in range(60)])
        assert b.got._table is None and len(b.got._levels) > 0
    for names in _stream(rng, pool, 10, 3000):
        b.index(names)
    assert b.got._table is not None and not b.got._levels
    b.same(rng.sample(pool, 300))


def test_millions_of_ids_in_batches(kernels_on):
    # 2M ids in 64k batches, new and repeated: the arrays and the table grown many times
    rng = np.random.default_rng(5)
    b = Both(kernels_on)
    seen = 0
    for _ in range(31):
        k = rng.integers(0, seen + 40000, size=65536)
        names = [f"req-{v}" for v in k.tolist()]
        b.index(names)
        seen = len(b.ref)
    assert len(b.got) > 300_000          # (about 340k distinct ids)
    b.same([f"req-{v}" for v in range(0, 2_000_000, 9973)])


def test_empty_repeated_and_getitem(kernels_on):
    ids = RequestIds()
    assert ids.index([]).tolist() == []
    assert ids.index(["a", "a", "", "b", "a", ""]).tolist() == [0, 0, 1, 2, 0, 1]
    assert ids._table is not None
    assert ids.index(["b", "c", ""]).tolist() == [2, 3, 1]
    assert ids[:] == ["a", "", "b", "c"] and ids[1] == "" and ids[-1] == "c"
    assert ids.slot_of("") == 1 and ids.slot_of("d") == -1
    with pytest.raises(IndexError):
        ids[4]


def _unmix(m: int) -> int:
    """The int64 hash that ids_kernels.c's mix (murmur3's fmix64) takes to m."""
    M = (1 << 64) - 1
    m ^= m >> 33
    m = (m * 0x9CB4B2F8129337DB) & M    # inverse of 0xC4CEB9FE1A85EC53
    m ^= m >> 33
    m = (m * 0x4F74430C22A54005) & M    # inverse of 0xFF51AFD7ED558CCD
    m ^= m >> 33
    return m - (1 << 64) if m >> 63 else m


def test_same_position_and_tag_different_hashes(kernels_on):
    # distinct hashes whose mixed values agree on the table position and the tag (the top
    # 23 bits): a probe must compare the whole hash, never take one for the other
    base = 0x5A5A5A5A5A5A5A5A
    crafted = {f"t{k}": _unmix(base ^ (1 << (30 + k))) for k in range(10)}
    assert len(set(crafted.values())) == len(crafted)
    _force(kernels_on, lambda s: crafted.get(s, hash(s)))
    b = Both(kernels_on)
    names = list(crafted)
    b.index(names[:3] + ["z"] + names[:5])
    b.index(names[::-1] + ["z", "y"])
    assert not b.got._collided
    b.same(names)


def test_table_hash_is_of_the_bytes(kernels_on):
    # the C hash the table uses: equal ids hash alike wherever their bytes sit, and a million
    # distinct ids (lengths 0 to 40, a trailing NUL, a byte past a word's end) hash apart
    from specaudit.invariants import ids_kernels
    ids = ["", "a", "a\0", "\0", "ab", "ba", "12345678", "123456789", "1234567\0"] + \
        [f"req-{i}" + "x" * (i % 31) for i in range(1_000_000)]
    blob, off = request_ids._encode(ids)
    h = ids_kernels.hash_ids(blob, off)
    assert h.dtype == np.int64 and len(h) == len(ids)
    assert len(np.unique(h)) == len(ids)
    again, aoff = request_ids._encode(["zz"] + ids[:9])          # the same ids at other offsets
    assert ids_kernels.hash_ids(again, aoff)[1:].tolist() == h[:9].tolist()
    assert ids_kernels.hash_ids(blob, off[:1]).tolist() == []


def test_ids_given_as_bytes_alone(kernels_on):
    # index(None, encoded): no str given; the slots equal those of the names, the levels'
    # path (small calls) and the table's alike, and the stored ids read back as str
    names = ["r1", "é", "r1", "", "r2", "é"]
    for min_rows in (10**9, 0):
        _switch_on(kernels_on, min_rows)
        a, b = RequestIds(), RequestIds()
        assert a.index(None, request_ids._encode(names)).tolist() == b.index(names).tolist() == [0, 1, 0, 2, 3, 1]
        assert a[:] == b[:] == ["r1", "é", "", "r2"]
        assert (a._table is None) == (min_rows > 0)
