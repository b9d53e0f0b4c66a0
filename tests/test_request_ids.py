"""RequestIds (invariants/request_ids.py): the carry's compact request id -> slot map
must give exactly the slots a dict in order of first appearance gives, collisions or not."""
from __future__ import annotations

import random

import numpy as np
import pytest
import specaudit.invariants.request_ids as request_ids
from specaudit.invariants import compiled
from specaudit.invariants.request_ids import RequestIds

POOL = [f"r{i}" for i in range(3000)] + ["é-ü", "\0null", "", "x" * 50, "日本", "\udcff"]


@pytest.fixture(autouse=True, params=["numpy", "compiled"])
def both_ways(request, monkeypatch):
    """Every test on the numpy levels and on the compiled table (tests/test_compiled_ids.py)."""
    if request.param == "numpy":
        monkeypatch.setenv(compiled.ENV, "0")
    else:
        monkeypatch.delenv(compiled.ENV, raising=False)
        monkeypatch.setattr(compiled, "MIN_ROWS", 0)
    return request.param


def dict_index(d: dict, names: list[str]) -> np.ndarray:
    """The reference: a dict, new ids numbered in order of first appearance."""
    for n in names:
        d.setdefault(n, len(d))
    return np.array([d[n] for n in names], dtype=np.int64)


@pytest.mark.parametrize("seed", range(5))
def test_slots_match_a_dict_in_order_of_first_appearance(seed):
    rng = random.Random(seed)
    ids, d = RequestIds(), {}
    for _ in range(25):
        names = [rng.choice(POOL) for _ in range(rng.randint(0, 400))]
        assert ids.index(names).tolist() == dict_index(d, names).tolist()
    assert len(ids) == len(d)
    assert ids[:] == list(d)
    assert ids[-1] == list(d)[-1]
    assert all(ids.slot_of(n) == q for n, q in list(d.items())[:100])
    assert ids.slot_of("never seen") == -1


def test_colliding_hashes_never_share_a_slot(monkeypatch):
    # seven hash values for ~50 ids: most lookups collide; every id keeps its own slot
    monkeypatch.setattr(request_ids, "hash", lambda s: hash(s) % 7, raising=False)
    rng = random.Random(1)
    ids, seen = RequestIds(), {}
    for _ in range(30):
        names = [rng.choice(POOL[:40] + POOL[-6:]) for _ in range(rng.randint(0, 80))]
        got = ids.index(names).tolist()
        for n, q in zip(names, got, strict=True):
            assert seen.setdefault(n, q) == q      # an id's slot never changes
            assert ids[q] == n                     # and the slot holds that id
    assert len(ids) == len(seen) == len(set(seen.values()))
    assert all(ids.slot_of(n) == q for n, q in seen.items())


def test_empty_and_repeated():
    ids = RequestIds()
    assert ids.index([]).tolist() == []
    assert ids.index(["a", "a", "b", "a"]).tolist() == [0, 0, 1, 0]
    assert ids.index(["b", "c"]).tolist() == [1, 2]
    with pytest.raises(IndexError):
        ids[3]


@pytest.mark.parametrize("large", [False, True])
def test_arrow_buffers_give_the_encoded_ids(large):
    """arrow_encoded (the requests table's id column read from its buffers, no _encode):
    the same bytes and offsets as _encode, for slices too, and the same slots."""
    import pyarrow as pa
    rng = random.Random(3)
    names = [rng.choice(POOL[:-1]) for _ in range(500)]   # Arrow strings are UTF-8: no lone surrogate
    arr = pa.array(names, type=pa.large_string() if large else pa.string())
    for a, want in ((arr, names), (arr.slice(7, 300), names[7:307]), (arr.slice(500), [])):
        blob, off = request_ids.arrow_encoded(a)
        rb, ro = request_ids._encode(want)
        assert blob.tobytes() == rb.tobytes() and off.dtype == np.int64 and off.tolist() == ro.tolist()
    with_enc, plain, d = RequestIds(), RequestIds(), {}
    for lo in range(0, 500, 100):
        part = arr.slice(lo, 100)
        got = with_enc.index(names[lo: lo + 100], request_ids.arrow_encoded(part)).tolist()
        assert got == plain.index(names[lo: lo + 100]).tolist() == dict_index(d, names[lo: lo + 100]).tolist()
    assert with_enc[:] == plain[:]
    assert request_ids.arrow_encoded(pa.array(["a", None])) is None          # a null id: "None", _encode's
    assert request_ids.arrow_encoded(pa.array(["a"]).dictionary_encode()) is None


def test_carry_growth_keeps_values_and_defaults():
    """Carry._grow (doubling, up to SPILL_SLOTS): slots kept, new slots at each field's default."""
    from specaudit.invariants.carry import SPILL_SLOTS, Carry
    c = Carry()
    c.index([f"q{i}" for i in range(1000)])
    c.out_len[:1000] = np.arange(1000)
    c.seen[:1000] = True
    c.index([f"q{i}" for i in range(5000)])
    assert c.n == 5000 and len(c.out_len) >= 5000
    assert c.out_len[:1000].tolist() == list(range(1000)) and c.seen[:1000].all()
    for k, (dt, v) in Carry.FIELDS.items():
        a = getattr(c, k)
        assert a.dtype == dt and (a[1000:] == v).all() and (k in ("out_len", "seen") or (a[:1000] == v).all())
    c.index([f"q{i}" for i in range(SPILL_SLOTS)])
    assert len(c.last_step) == SPILL_SLOTS and not c.paged
