"""facts_kernels (compiled) against facts.py's numpy: batch_facts gives the same dict of
arrays, dtypes included, with and without the kernel, on the fixture corpus's requests
tables, on big synthetic ones with random corruptions, and on hand-made edge cases."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from specaudit.invariants import all_rules, compiled
from specaudit.invariants.carry import Carry, token_mix
from specaudit.invariants.fixtures import FixtureRun

from specaudit.audit.check import facts as F
from specaudit.trace.synth import synth_run_rows

TRACE_RULES = [r for r in all_rules() if r.scope != "source"]


@pytest.fixture(autouse=True)
def small_batches_compiled(monkeypatch):
    """Every batch takes the compiled path, however small."""
    monkeypatch.setattr(compiled, "MIN_ROWS", 0)
    monkeypatch.delenv(compiled.ENV, raising=False)


def both(batch: pa.RecordBatch, eos_id: int, monkeypatch) -> tuple[dict, dict]:
    """batch_facts with numpy (SPECAUDIT_COMPILED=0) and with the kernel, each on a fresh carry."""
    monkeypatch.setenv(compiled.ENV, "0")
    want = F.batch_facts(batch, Carry(), eos_id)
    monkeypatch.setenv(compiled.ENV, "1")
    assert F._kernels(batch.num_rows, *_token_inputs(batch), eos_id) is not None, "the kernel was not used"
    got = F.batch_facts(batch, Carry(), eos_id)
    return want, got


def _token_inputs(batch):
    col = dict(zip(batch.schema.names, batch.columns))
    vals = F.list_parts(col["output_tokens"])[1]
    ref = F.list_parts(col["reference_tokens"]) if "reference_tokens" in col else None
    return vals, ref


def assert_same(want: dict, got: dict) -> None:
    assert list(want) == list(got)
    for k, w in want.items():
        g = got[k]
        assert w.dtype == g.dtype, (k, w.dtype, g.dtype)
        if w.dtype == object:
            assert w.tolist() == g.tolist(), k
        else:
            np.testing.assert_array_equal(g, w, err_msg=k)


def one_batch(table: pa.Table) -> pa.RecordBatch:
    return table.combine_chunks().to_batches()[0] if table.num_rows else table.to_batches()[0]


@pytest.mark.parametrize("rule", TRACE_RULES, ids=lambda r: r.code)
def test_fixture_corpus_requests_tables(rule, monkeypatch):
    for how in (rule.passing, rule.fail):
        fx = FixtureRun.make(rule.fixture_algo)
        how(fx)
        rq = fx.tables()[1]
        if rq is None or rq.num_rows == 0:
            continue
        assert_same(*both(one_batch(rq), fx.eos_id, monkeypatch))


@pytest.mark.parametrize("algo", ["chain", "tree"])
def test_fixture_corpus_request_findings(algo, monkeypatch):
    """Each request rule's failing fixture: the same findings, numpy or compiled."""
    for rule in [r for r in TRACE_RULES if r.scope == "request" and r.fixture_algo == algo]:
        out = []
        for mode in ("0", "1"):
            monkeypatch.setenv(compiled.ENV, mode)
            fx = FixtureRun.make(rule.fixture_algo)
            rule.fail(fx)
            out.append([(f.code, f.message) for f in fx.check().findings])
        assert out[0] == out[1], rule.code


def _big(seed: int, algo: str = "chain", n: int = 3000) -> pa.Table:
    _, rq, _ = synth_run_rows(n, algo=algo, seed=seed, vocab=64, max_new_tokens=60, eos_frac=0.5)
    return rq


def _corrupt(rq: pa.Table, rng, value_type: pa.DataType, large: bool) -> pa.Table:
    """Random damage to output_tokens and reference_tokens: null lists, emptied, eos
    (0) planted, tokens changed, references cut, extended or dropped; other widths
    (no null token inside an unsigned list: to_np's fill -1 does not fit it, numpy's own
    path raises there)."""
    out, ref = rq["output_tokens"].to_pylist(), rq["reference_tokens"].to_pylist()
    lo, hi = (0 if pa.types.is_unsigned_integer(value_type) else -3), min(1 << 20, 1 << (value_type.bit_width - 2))
    for i in range(len(out)):
        r = rng.random()
        o = out[i]
        if r < 0.05:
            out[i] = None
        elif r < 0.1:
            out[i] = []
        elif o and r < 0.3:
            o[rng.integers(len(o))] = 0                       # eos somewhere (the last one included)
        elif o and r < 0.4:
            o[rng.integers(len(o))] = int(rng.integers(lo, hi))
        elif o and r < 0.45 and lo < 0:
            o[rng.integers(len(o))] = None                    # a null token inside
        r = rng.random()
        if r < 0.1:
            ref[i] = None
        elif r < 0.2 and ref[i]:
            ref[i] = ref[i][: rng.integers(len(ref[i]))]
        elif r < 0.3 and ref[i] is not None:
            ref[i] = ref[i] + [int(x) for x in rng.integers(0, 64, rng.integers(1, 4))]
        elif r < 0.35:
            ref[i] = list(out[i] or [])
    lt = pa.large_list(value_type) if large else pa.list_(value_type)
    rq = rq.set_column(rq.schema.get_field_index("output_tokens"), "output_tokens", pa.array(out, lt))
    return rq.set_column(rq.schema.get_field_index("reference_tokens"), "reference_tokens", pa.array(ref, lt))


@pytest.mark.parametrize("seed", range(4))
def test_big_synthetic_batches_with_random_corruptions(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    rq = _big(seed, "tree" if seed % 2 else "chain")
    assert_same(*both(one_batch(rq), 0, monkeypatch))                     # untouched
    kinds = [(pa.int32(), False), (pa.int64(), True), (pa.int16(), False), (pa.uint32(), True)]
    bad = _corrupt(rq, rng, *kinds[seed])
    assert_same(*both(one_batch(bad), 0, monkeypatch))
    assert_same(*both(one_batch(bad), 5, monkeypatch))                    # another eos id
    for b in one_batch(bad).slice(1000, 1500), one_batch(bad).slice(7):    # offsets not at 0
        assert_same(*both(b, 0, monkeypatch))


def _table(out, ref=..., typ=None) -> pa.RecordBatch:
    n, typ = len(out), typ or pa.list_(pa.int32())
    cols = {"request_id": pa.array([f"r{i}" for i in range(n)]), "prompt_tokens": pa.array([[1, 2]] * n, typ),
            "first_token": pa.array([7] * n, pa.int32()), "output_tokens": pa.array(out, typ),
            "finish_reason": pa.array(["stop"] * n)}
    if ref is not ...:
        cols["reference_tokens"] = pa.array(ref, typ)
    return pa.RecordBatch.from_pydict(cols)


EDGE_OUT = [[], None, [5], [0], [3, 0], [0, 3], [3, 0, 4, 0], [4, 4, 0, 0], [9, 8, 7], [1, None, 0, 2]]


@pytest.mark.parametrize("ref", [
    ..., [None] * len(EDGE_OUT), list(EDGE_OUT),                    # absent, all null, all equal
    [o[:-1] if o else o for o in EDGE_OUT],                          # shorter
    [(o or []) + [1] for o in EDGE_OUT],                             # longer (a null output: empty)
    [[x + 1 if x is not None else 0 for x in (o or [])] for o in EDGE_OUT],   # different
    [None, [], [5], None, [3, 1], [0, 3, 1], [3, 0], [4, 4, 0, 1], [9, 9, 7], [1, None, 0, 2]],   # mixed
], ids=["absent", "null", "equal", "shorter", "longer", "different", "mixed"])
def test_edge_cases(ref, monkeypatch):
    b = _table(EDGE_OUT, ref)
    want, got = both(b, 0, monkeypatch)
    assert_same(want, got)
    assert got["eos_inside"].tolist()[:9] == [-1, -1, -1, -1, -1, 0, 1, 2, -1]   # eos at the last token is not inside
    for typ in pa.large_list(pa.int64()), pa.list_(pa.int8()):
        assert_same(*both(_table(EDGE_OUT, ref, typ), 0, monkeypatch))


def test_extreme_token_values_hash_like_token_mix(monkeypatch):
    """Tokens at the ends of int64 (sign-extended into the fingerprint like numpy's astype)."""
    big = [[0, -1, (1 << 63) - 1, -(1 << 63), 12345678901], [7, -(1 << 40)]]
    want, got = both(_table(big, big, pa.list_(pa.int64())), -1, monkeypatch)
    assert_same(want, got)
    flat = np.array(big[0], dtype=np.int64)
    assert got["output_hash"][0] == token_mix(flat[1:], np.arange(1, 5)).sum(dtype=np.uint64)
    assert got["eos_inside"].tolist() == [1, -1]


def test_empty_batch_and_numpy_fallbacks(monkeypatch):
    assert_same(*both(_table([]), 0, monkeypatch))
    b = _table(EDGE_OUT, list(EDGE_OUT))
    vals, ref = _token_inputs(b)
    monkeypatch.setenv(compiled.ENV, "0")
    assert F._kernels(b.num_rows, vals, ref, 0) is None                    # switched off
    monkeypatch.setenv(compiled.ENV, "1")
    assert F._kernels(b.num_rows, vals, ref, 1 << 70) is None              # an eos id past int64
    assert F._kernels(b.num_rows, vals.astype(np.uint64), ref, 0) is None  # uint64 tokens
    monkeypatch.setattr(compiled, "MIN_ROWS", 4096)
    assert F._kernels(b.num_rows, vals, ref, 0) is None                    # a small batch
    u = _table([[1, 2], [1 << 63]], [[1, 2], [1 << 63]], pa.list_(pa.uint64()))
    monkeypatch.setenv(compiled.ENV, "0")
    want = F.batch_facts(u, Carry(), 0)
    monkeypatch.setenv(compiled.ENV, "1")
    monkeypatch.setattr(compiled, "MIN_ROWS", 0)
    assert_same(want, F.batch_facts(u, Carry(), 0))                         # numpy either way
