"""A run with many requests spills its per-request state (the carry's pages,
invariants/carry_pages.py; the request facts, specaudit/audit/check/facts.py): the
findings and counts must be the ones the in-memory check gives. The limits are lowered
here (a page of 2 slots, 4 slots in memory) so that fixture runs of a few requests take
the spilled path, and the folder must be gone afterwards, on error too."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from specaudit.invariants import all_rules
from specaudit.invariants import carry as carry_mod
from specaudit.invariants.carry import Carry
from specaudit.invariants.fixtures import FixtureRun
from specaudit.invariants.spill import SpillDir

from specaudit.audit.check import check_paths, check_tables
from specaudit.trace.synth import synth_run_rows

TRACE_RULES = [r for r in all_rules() if r.scope != "source"]


@pytest.fixture
def made(monkeypatch):
    """The spill files made while the test runs (their paths, in order)."""
    paths: list[str] = []
    real = SpillDir.file

    def file(self, name):
        p = real(self, name)
        paths.append(p)
        return p
    monkeypatch.setattr(SpillDir, "file", file)
    return paths


def spill_small(monkeypatch) -> None:
    monkeypatch.setattr(carry_mod, "PAGE_SLOTS", 2)
    monkeypatch.setattr(carry_mod, "SPILL_SLOTS", 4)


def shown(res) -> dict:
    """Everything a check reports: the findings in order, the counts, the totals."""
    return {"findings": [json.dumps(f.to_dict(), sort_keys=True, default=str) for f in res.findings],
            "counts": dict(res.counts), "steps": res.steps, "requests": res.requests,
            "bad": res.bad_files, "incomplete": res.incomplete_runs}


def both_ways(monkeypatch, check) -> tuple[dict, dict]:
    """check() in memory, then with the limits lowered."""
    with monkeypatch.context() as m:
        whole = shown(check())
        spill_small(m)
        spilled = shown(check())
    return whole, spilled


@pytest.mark.parametrize("rule", TRACE_RULES, ids=lambda r: r.code)
def test_rule_fixtures_find_the_same_spilled(rule, tmp_path, monkeypatch, made):
    bad = FixtureRun.make(rule.fixture_algo)
    rule.fail(bad)
    run = bad.write(tmp_path / "fail")
    whole, spilled = both_ways(monkeypatch, lambda: check_paths([run], batch_rows=3))
    assert rule.code in whole["counts"]
    assert spilled == whole
    # (a tiny run is checked in the pool, which drops its carry unclosed: gone all the same)
    assert not any(os.path.exists(os.path.dirname(p)) for p in made)


def _faulty_run(n: int = 40):
    """A run whose requests table and steps disagree in every way a request rule sees:
    a duplicated row, a row with no steps, steps with no row, a step after the
    request finished and a step repeated (both at the very end, long after their
    pages left memory), a request whose output differs from its commits."""
    st, rq, m = synth_run_rows(n, seed=5, concurrency=3, zero_step_frac=0.0)
    steps, reqs = st.to_pylist(), rq.to_pylist()
    first = reqs[0]["request_id"]
    last = max((s for s in steps if s["request_id"] == first), key=lambda s: s["step"])
    steps.append(dict(last, step=last["step"] + 1))
    steps.append(dict(next(s for s in steps if s["request_id"] != first and s["step"] == 1)))
    reqs.append(dict(reqs[3]))
    reqs.append(dict(reqs[1], request_id="ghost"))
    gone = reqs.pop(7)["request_id"]
    reqs[9]["output_tokens"] = reqs[9]["output_tokens"][:-1]
    return pa.Table.from_pylist(steps, st.schema), pa.Table.from_pylist(reqs, rq.schema), m, gone


@pytest.mark.parametrize("cap", [0, 1, 3])
def test_request_table_faults_found_the_same_spilled(cap, monkeypatch, made):
    st, rq, m, gone = _faulty_run()
    whole, spilled = both_ways(monkeypatch, lambda: check_tables(st, rq, m, batch_rows=7, max_per_code=cap))
    assert {"SA401", "SA404", "SA406", "SA409"} <= set(whole["counts"])
    assert any(gone in f for f in whole["findings"])
    assert spilled == whole
    names = {os.path.basename(p).split("-")[0] for p in made}
    assert names == {"page", "facts"}                        # both spilled
    assert not any(os.path.exists(os.path.dirname(p)) for p in made)   # and removed


@pytest.mark.parametrize("paged", [False, True])
def test_request_frames_smaller_than_a_range_find_the_same(paged, monkeypatch, made):
    """Request rules joined FRAME_SLOTS slots at a time within a range (a page of a paged
    carry, or the whole of a dense one): the same findings, in the same order, counts and
    totals as one frame per range."""
    import specaudit.audit.check.core as core
    st, rq, m, _ = _faulty_run()
    check = lambda: shown(check_tables(st, rq, m, batch_rows=7, max_per_code=2))
    with monkeypatch.context() as mp:
        if paged:
            mp.setattr(carry_mod, "PAGE_SLOTS", 8)
            mp.setattr(carry_mod, "SPILL_SLOTS", 16)
        whole = check()
        mp.setattr(core, "FRAME_SLOTS", 3)
        split = check()
    assert {"SA406", "SA409"} <= set(whole["counts"])
    assert split == whole


def test_a_run_under_the_limit_spills_nothing(made):
    st, rq, m, _ = _faulty_run(12)
    assert check_tables(st, rq, m, batch_rows=7).counts
    assert made == []


def test_the_spill_folder_goes_when_a_rule_raises(monkeypatch, made):
    spill_small(monkeypatch)
    rule = next(r for r in TRACE_RULES if r.code == "SA409")

    def boom(q):
        raise RuntimeError("a bug in a request rule")
    monkeypatch.setattr(rule, "check", boom)
    st, rq, m, _ = _faulty_run()
    with pytest.raises(RuntimeError, match="a bug"):
        check_tables(st, rq, m, rules=[rule], batch_rows=7)
    assert made and not any(os.path.exists(os.path.dirname(p)) for p in made)


@pytest.mark.parametrize("seed", range(4))
def test_paged_carry_holds_what_dense_arrays_hold(seed, monkeypatch):
    """Random writes through rows(), pages spilled and read back between them: every
    field of every slot as a plain dense array has it."""
    monkeypatch.setattr(carry_mod, "PAGE_SLOTS", 3)
    monkeypatch.setattr(carry_mod, "SPILL_SLOTS", 6)
    rng = np.random.default_rng(seed)
    c = Carry()
    want = {k: [] for k in Carry.FIELDS}
    try:
        for _ in range(40):
            c.index([f"r{i}" for i in rng.integers(0, 60, 5)])
            for k, (_, v) in Carry.FIELDS.items():
                want[k] += [v] * (c.n - len(want[k]))
            slots = np.unique(rng.integers(0, c.n, 4))
            rows = c.rows(slots)
            for k, (dt, _) in Carry.FIELDS.items():
                vals = rng.integers(0, 2 if dt is bool else 1000, len(slots)).astype(dt)
                getattr(c, k)[rows] = vals
                for s, v in zip(slots.tolist(), vals.tolist()):
                    want[k][s] = v
            c.seen[rows] = True
            for s in slots.tolist():
                want["seen"][s] = True
            c.trim()
        assert c.paged and os.listdir(c.spill.path)
        got = c.fields(0, c.n)
        for k in Carry.FIELDS:
            assert got[k].tolist() == want[k], k
        lo, hi = 4, 17                                      # a range across pages
        assert c.fields(lo, hi)["out_len"].tolist() == want["out_len"][lo:hi]
    finally:
        c.close()
    assert c.spill.path is None


def test_steps_out_of_slot_order_stop_rereading_pages(monkeypatch):
    """Requests in flight spread over many pages: each page is read back once or twice,
    then kept (not reread batch after batch)."""
    monkeypatch.setattr(carry_mod, "PAGE_SLOTS", 3)
    monkeypatch.setattr(carry_mod, "SPILL_SLOTS", 6)
    c = Carry()
    c.index([f"r{i}" for i in range(60)])
    spread = np.arange(0, 60, 3)                         # one slot in each of the 20 pages
    reads = []
    real = type(c._pages)._read
    monkeypatch.setattr(type(c._pages), "_read", lambda self, p: reads.append(p) or real(self, p))
    try:
        for _ in range(30):
            rows = c.rows(spread)                        # (may grow the arrays: first)
            c.seen[rows] = True
            c.trim()
        assert len(reads) <= 2 * len(spread)
        assert c.fields(0, 60)["seen"][spread].all()
    finally:
        c.close()


def test_a_carry_dropped_unclosed_removes_its_folder(monkeypatch):
    """(The tiny-run pool drops its carry without close().)"""
    monkeypatch.setattr(carry_mod, "PAGE_SLOTS", 2)
    monkeypatch.setattr(carry_mod, "SPILL_SLOTS", 2)
    c = Carry()
    c.index([f"r{i}" for i in range(8)])
    rows = c.rows(np.arange(8))
    c.seen[rows] = True
    c.trim()
    path = c.spill.path
    assert path and os.listdir(path)
    del c, rows
    assert not os.path.exists(path)


def test_spilled_facts_come_back_as_written_without_pickle(tmp_path):
    """A spilled range holds numbers of every fact dtype and a string fact with None in it;
    chunk() gives back the same values, dtypes and Nones (npz with allow_pickle=False)."""
    from specaudit.audit.check.facts import FactStore
    spill = SpillDir()
    try:
        store = FactStore(spill, part=4)
        store.spilled = True   # write from the first batch on (the limit itself is tested above)
        facts = {"idx": np.array([0, 5, 1, 6], dtype=np.int64),
                 "output_len": np.array([3, 4, 5, 6], dtype=np.int32),
                 "output_hash": np.array([2**64 - 1, 1, 2, 3], dtype=np.uint64),
                 "finish_reason": np.array(["eos", None, "length", "abort"], dtype=object),
                 "extra:accept_length": np.array([1.5, np.nan, 2.0, 3.0])}
        store.add(facts)
        store.add({k: v[:1] for k, v in facts.items()})
        lo = store.chunk(0, 4)
        assert lo["idx"].tolist() == [0, 1, 0] and lo["output_hash"].dtype == np.uint64
        assert lo["finish_reason"].tolist() == ["eos", "length", "eos"] and lo["output_len"].dtype == np.int32
        hi = store.chunk(4, 8)
        assert hi["finish_reason"].tolist() == [None, "abort"] and hi["output_hash"].tolist() == [1, 3]
        assert np.isnan(hi["extra:accept_length"][0]) and store.chunk(8, 12) == {}
        assert sorted(p.name for p in Path(spill.path).iterdir()) == [
            "facts-0-0.npz", "facts-0-1.npz", "facts-1-0.npz"]
    finally:
        spill.close()
