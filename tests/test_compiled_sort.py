"""StepFrame's first stages through the compiled kernels of invariants/sort_kernels.py
(the row sort, the scalar columns, the list lengths and starts: invariants/frame_read.py)
equal the numpy stages, their definition: every attribute the frame holds after
__init__ (values, dtypes, and which lens arrays are shared), the carry after each batch
and every step rule's findings, with only these kernels switched between on and off
(the other kernels on both ways), on the fixture corpus (MIN_ROWS 0) and on big
synthetic batches, corrupted and reshaped: steps out of order inside a request (the
lexsort fallback), null request ids, steps, scalars and lists, int64 columns, large
lists, ragged node lists."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from specaudit.invariants import DEFINED, compiled, load_rules
from specaudit.invariants.carry import Carry
from specaudit.invariants.fixtures import FixtureRun
from specaudit.invariants.frame import StepFrame
from specaudit.invariants.frame_read import SORT_KERNELS
from test_compiled_frame import _corpus, _corrupt, _fixture_batches, _synthetic_batches

from specaudit.audit.check.core import emit_hits
from specaudit.audit.check.result import CheckResult

_SKIP = {"_sk", "_carry", "columns"}   # the kernels themselves, the carry object, the batch


@pytest.fixture
def switch(monkeypatch):
    """-> set(on): the sort kernels on or off, every other kernel on, at every batch size."""
    monkeypatch.setattr(compiled, "MIN_ROWS", 0)
    monkeypatch.delenv(compiled.ENV, raising=False)
    assert compiled.kernels(SORT_KERNELS, rows=1) is not None, "the sort kernels failed to load"
    real = compiled.kernels
    state = {"on": True}

    def kernels(module, rows):
        return None if module == SORT_KERNELS and not state["on"] else real(module, rows)
    monkeypatch.setattr(compiled, "kernels", kernels)
    return lambda on: state.__setitem__("on", on)


def _same(a, b, where) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype, (where, a.dtype, getattr(b, "dtype", b))
        assert a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), where
    elif isinstance(a, (dict, tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), where
        keys = a.keys() if isinstance(a, dict) else range(len(a))
        if isinstance(a, dict):
            assert list(a) == list(b), where
        for k in keys:
            _same(a[k], b[k], (where, k))
    else:
        assert type(a) is type(b) and a == b, (where, a, b)


def _frames(batches, cfg, on: bool, switch):
    """Per batch: (the frame's attributes after __init__, which lens share node_tokens',
    the step rules' findings); the carry's fields after the last batch."""
    switch(on)
    load_rules()
    rules = [r() for r in DEFINED.values() if r.scope == "step"]
    carry, out, rows = Carry(), [], 0
    for b in batches:
        f = StepFrame(b, carry=carry, row_offset=rows, **cfg)
        assert (f._sk is not None) == on
        rows += b.num_rows
        attrs = {k: f.__dict__[k] for k in sorted(f.__dict__) if k not in _SKIP}   # (set in any order)
        shared = sorted(k for k, v in f.lens.items() if v is f.lens["node_tokens"])
        res = CheckResult(max_per_code=0)
        for rule in rules:
            emit_hits(rule, rule.check(f), f, res, kind="step")
        f.finish_carry()
        out.append((attrs, shared, [x.to_dict() for x in res.findings]))
    fields = {k: carry.view(k).copy() for k in Carry.FIELDS}
    carry.close()
    return out, fields


def _assert_same(batches, cfg, switch) -> int:
    """The frames with the sort kernels equal numpy's -> the number of findings."""
    want, want_carry = _frames(batches, cfg, False, switch)
    got, got_carry = _frames(batches, cfg, True, switch)
    n = 0
    for i, (w, g) in enumerate(zip(want, got)):
        _same(w[0], g[0], i)
        assert w[1] == g[1], (i, w[1], g[1])
        assert w[2] == g[2], i
        n += len(w[2])
    _same(want_carry, got_carry, "carry")
    return n


@pytest.mark.parametrize("rule, kind", list(_corpus()))
def test_fixture_frames_equal_numpy(rule, kind, switch):
    run = FixtureRun.make(rule.fixture_algo)
    rule.passing(run) if kind == "pass" else rule.fail(run)
    batches, cfg = _fixture_batches(run)
    try:
        _frames(batches, cfg, False, switch)
    except Exception as e:   # a fixture that breaks the schema on purpose: refused both ways
        with pytest.raises(type(e)):
            _frames(batches, cfg, True, switch)
        return
    _assert_same(batches, cfg, switch)


# ------------------------------------------------------------------ big synthetic batches
def _with(batch, **cols):
    arrays = {n: batch.column(i) for i, n in enumerate(batch.schema.names)}
    arrays.update(cols)
    return pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))


def _nulled(arr, rows):
    mask = np.zeros(len(arr), dtype=bool)
    mask[rows] = True
    return pa.array(arr.to_pylist(), type=arr.type, mask=mask) if not pa.types.is_dictionary(arr.type) else \
        pa.DictionaryArray.from_arrays(pa.array(arr.indices.to_pylist(), type=arr.indices.type, mask=mask),
                                       arr.dictionary)


def _reshaped(b, j: int):
    """A batch changed in one of the ways the compiled read hands back to numpy, or must
    read as numpy does."""
    rng = np.random.default_rng(j)
    R = b.num_rows
    rows = rng.choice(R, size=7, replace=False)
    col = lambda n: b.column(b.schema.get_field_index(n))
    k = j % 9
    if k == 0:                      # steps out of order inside requests: np.lexsort's order
        step = col("step").to_numpy().copy()
        step[rows] = step[rows[::-1]]
        return _with(b, step=pa.array(step, type=pa.int32()))
    if k == 1:                      # null request ids and steps
        return _with(b, request_id=_nulled(col("request_id"), rows), step=_nulled(col("step"), rows[:3]))
    if k == 2:                      # null scalars, a null flag; int64 steps beside int32 codes
        return _with(b, seq_len=_nulled(col("seq_len"), rows), mask_hash=_nulled(col("mask_hash"), rows[:2]),
                     step=col("step").cast(pa.int64()),
                     finished=_nulled(col("finished"), rows[2:]), budget=_nulled(col("budget"), rows[:1]))
    if k == 3:                      # other widths: int16 codes and int64 steps widened, int64 and int16 scalars
        rid = col("request_id")
        return _with(b, step=col("step").cast(pa.int64()), seq_len=col("seq_len").cast(pa.int64()),
                     topk=col("topk").cast(pa.int16()),
                     request_id=pa.DictionaryArray.from_arrays(rid.indices.cast(pa.int16()), rid.dictionary))
    if k == 4:                      # large lists (int64 offsets)
        return _with(b, parents=col("parents").cast(pa.large_list(pa.int32())),
                     committed_tokens=col("committed_tokens").cast(pa.large_list(pa.int32())))
    if k == 5:                      # null lists: a node list, a path, a commit, a parents list
        return _with(b, accepted_path=_nulled(col("accepted_path"), rows[:2]),
                     committed_tokens=_nulled(col("committed_tokens"), rows[2:4]),
                     parents=_nulled(col("parents"), rows[4:5]))
    if k == 6:                      # null node_tokens lists: numpy's read
        return _with(b, node_tokens=_nulled(col("node_tokens"), rows[:1]))
    if k == 7:                      # a per-node list of other lengths than node_tokens'
        pos = col("positions").to_pylist()
        for r in rows:
            pos[r] = pos[r][:-1]
        return _with(b, positions=pa.array(pos, type=col("positions").type))
    rid = col("request_id")         # string ids, not a dictionary (encoded by numpy's read)
    return _with(b, request_id=rid.cast(pa.string()))


@pytest.mark.parametrize("algo, n_nodes, ragged", [("chain", 8, False), ("tree", 16, False), ("tree", 12, True)])
def test_big_batches_equal_numpy(algo, n_nodes, ragged, tmp_path, switch):
    batches, cfg = _synthetic_batches(tmp_path, algo, n_nodes, ragged)
    assert len(batches) >= 3
    assert _assert_same(batches, cfg, switch) == 0          # a valid run: no finding either way
    mixed = [_corrupt(b, seed=i) if i % 2 else b for i, b in enumerate(batches)]
    assert _assert_same(mixed, cfg, switch) > 0


@pytest.mark.parametrize("j", range(9))
def test_reshaped_batches_equal_numpy(j, tmp_path, switch):
    batches, cfg = _synthetic_batches(tmp_path, "chain", 8, False, steps=6000, rows=2048)
    changed = [_reshaped(b, j + 9 * i) if i % 2 == 0 and b.num_rows >= 16 else b for i, b in enumerate(batches)]
    assert sum(c is not b for c, b in zip(changed, batches)) >= 2
    _assert_same(changed, cfg, switch)


def test_counting_sort_against_lexsort():
    """sort_rows on random keys: stable, equal to np.lexsort where steps ascend, and
    says so exactly when they do not; a null code reads the last rank."""
    kern = compiled.kernels(SORT_KERNELS, rows=compiled.MIN_ROWS)
    rng = np.random.default_rng(0)
    for K, R, dt in ((3, 5000, np.int32), (70000, 9000, np.int64), (40, 1, np.int32)):
        gidx = rng.permutation(K + 5)[:K].astype(np.int64)
        codes = rng.integers(-1, K - 1, size=R).astype(dt)
        step = np.zeros(R, dtype=dt)
        for c in np.unique(codes):
            at = np.flatnonzero(codes == c)
            step[at] = np.sort(rng.integers(0, 50, size=len(at)))
        _, rank = np.unique(gidx, return_inverse=True)
        order = np.empty(R, dtype=np.int64)
        assert kern.sort_rows(codes, rank.astype(np.int64), step, order)
        assert np.array_equal(order, np.lexsort((step, gidx[codes])))
        if R > 1:
            c = codes[0]
            at = np.flatnonzero(codes == c)
            if len(at) > 1 and step[at[0]] < step[at[-1]]:
                step[at[0]], step[at[-1]] = step[at[-1]], step[at[0]]
                assert not kern.sort_rows(codes, rank.astype(np.int64), step, order)


@pytest.mark.parametrize("dtype, N0", [(np.int32, 32), (np.int32, 7), (np.int64, 12)])
def test_row_groups_equal_numpy(dtype, N0):
    """group_rows through the kernels: the same (ids, first) as numpy on blocks of a few
    shapes, shapes first seen past the prefix, and a row differing from its group's in a
    word the fingerprint misses (numpy's answer then)."""
    from specaudit.invariants import row_groups
    kern = compiled.kernels(SORT_KERNELS, rows=compiled.MIN_ROWS)
    rng = np.random.default_rng(N0)
    shapes = rng.integers(-1, N0, size=(9, N0)).astype(dtype)
    for R, late in ((5000, False), (9000, True), (3, False)):
        P = shapes[rng.integers(0, 6, size=R)]
        if late:                                        # shapes 6..8 only after the prefix
            P[row_groups._HEAD_ROWS + 17:: 501] = shapes[6 + np.arange(len(P[row_groups._HEAD_ROWS + 17:: 501])) % 3]
        want = row_groups.group_rows(P)
        got = row_groups.group_rows(P, kern)
        assert all(g.dtype == w.dtype and np.array_equal(g, w) for g, w in zip(got, want)), (R, late)
        V = row_groups._words(P)
        ready = kern.row_groups(np.ascontiguousarray(V), row_groups._W[: V.shape[1]], row_groups._HEAD_ROWS)
        assert (ready is None) == late or len(np.unique(P, axis=0)) == 1
    # a collision: the weights zeroed past the first word, rows differing only there
    P = np.repeat(shapes[:2], 3000, axis=0)
    P[4500, -1] += 1
    V = row_groups._words(P)
    w = row_groups._W[: V.shape[1]].copy()
    w[1:] = 0
    assert kern.row_groups(np.ascontiguousarray(V), w, row_groups._HEAD_ROWS) is None or V.shape[1] == 1


@pytest.mark.parametrize("dtype, N0", [(np.int32, 8), (np.int32, 7), (np.int64, 12), (np.int32, 1)])
def test_rows_same_equal_numpy(dtype, N0):
    """rows_same (group_rows' one-group test) as numpy's (V == V[0]).all(): one shape over
    every row, then one entry changed at the first, a middle and the last row, past the
    64-row prefix and inside it; group_rows' answer equal both ways each time."""
    from specaudit.invariants import row_groups
    kern = compiled.kernels(SORT_KERNELS, rows=compiled.MIN_ROWS)
    row = np.arange(-1, N0 - 1, dtype=dtype)
    for R in (1, 2, 70, 9000):
        P = np.tile(row, (R, 1))
        V = row_groups._words(P)
        assert kern.rows_same(np.ascontiguousarray(V)) is True
        for r, i in ((0, 0), (R // 2, N0 - 1), (R - 1, N0 // 2), (min(R - 1, 65), 0)):
            Q = P.copy()
            Q[r, i] += 3
            W = np.ascontiguousarray(row_groups._words(Q))
            assert kern.rows_same(W) == bool((W == W[0]).all()), (R, r, i)
            want, got = row_groups.group_rows(Q), row_groups.group_rows(Q, kern)
            assert all(g.dtype == w.dtype and np.array_equal(g, w) for g, w in zip(got, want)), (R, r, i)


@pytest.mark.parametrize("on", [False, True])
def test_uniform_structure_against_list_lengths(on, tmp_path, switch):
    """A uniform-N batch (every node_tokens list N long) whose other per-node lists are
    not: shapes_ok and too_many_nodes as the list lengths say, row by row (the uniform
    batch's structure check skips only the lists that share node_tokens' lengths)."""
    from specaudit.trace.schema import MAX_NODES
    batches, cfg = _synthetic_batches(tmp_path, "chain", 8, False, steps=6000, rows=2048)
    b = batches[1]
    col = lambda n: b.column(b.schema.get_field_index(n))
    changed = {}
    for k, name in enumerate(("parents", "positions", "target_argmax")):
        v = col(name).to_pylist()
        for r in range(5 + k, b.num_rows, 97 + k):
            v[r] = v[r][:-1] if (r + k) % 2 else v[r] + [0]
        changed[name] = pa.array(v, type=col(name).type)
    b = _with(b, **changed)
    switch(on)
    f = StepFrame(b, carry=Carry(), **cfg)
    assert f.uniform_n and (f._sk is not None) == on
    length = lambda n: np.array([len(x) if x is not None else -1 for x in col(n).to_pylist()])[f.order] \
        if n not in changed else np.array([len(x) for x in changed[n].to_pylist()])[f.order]
    n = length("node_tokens")
    want = (n >= 1) & (n <= MAX_NODES) & (length("accepted_path") >= 1) & (length("committed_tokens") >= 0)
    for name in ("parents", "positions", "target_argmax"):
        want &= length(name) == n
    assert np.array_equal(f.too_many_nodes, n > MAX_NODES) and f.too_many_nodes.dtype == bool
    assert f.shapes_ok.dtype == bool and np.array_equal(f.shapes_ok, want)
    assert 0 < (~want).sum() < len(want)


@pytest.mark.parametrize("kind", ["null value", "large_string", "int64"])
def test_request_id_dictionaries_equal_numpy(kind, tmp_path, switch):
    """request_id dictionaries other than plain strings (a null among the values, some rows
    coded to it; large_string values; integer values): every frame attribute and finding
    as numpy's read gives them."""
    batches, cfg = _synthetic_batches(tmp_path, "chain", 8, False, steps=6000, rows=2048)
    out = []
    for i, b in enumerate(batches):
        rid = b.column(b.schema.get_field_index("request_id"))
        values, codes = rid.dictionary, rid.indices
        if kind == "null value":
            values = pa.array(values.to_pylist() + [None], type=values.type)
            idx = codes.to_numpy().copy()
            idx[3 + i:: 211] = len(values) - 1
            codes = pa.array(idx, type=codes.type)
        elif kind == "large_string":
            values = values.cast(pa.large_string())
        else:
            values = pa.array([int(v.rsplit("-", 1)[-1], 36) if "-" in v else len(v) for v in values.to_pylist()],
                              type=pa.int64())
        out.append(_with(b, request_id=pa.DictionaryArray.from_arrays(codes, values)))
    _assert_same(out, cfg, switch)


@pytest.mark.parametrize("on", [False, True])
@pytest.mark.parametrize("encoded", [True, False])
def test_run_id_and_algo_codes_per_row(on, encoded, tmp_path, switch):
    """run_id and algo with nulls and a second value (dictionary-encoded, or plain
    strings): each sorted row's run_id, algo and the flags read from them as the column
    says, row by row."""
    batches, cfg = _synthetic_batches(tmp_path, "chain", 8, False, steps=6000, rows=2048)
    b = batches[1]
    col = lambda n: b.column(b.schema.get_field_index(n))
    runs, algos = col("run_id").to_pylist(), col("algo").to_pylist()
    for r in range(3, len(runs), 101):
        runs[r] = None if r % 2 else "another-run"
    for r in range(7, len(algos), 89):
        algos[r] = None if r % 2 else "tree"
    arrays = {n: pa.array(v, type=pa.string()) for n, v in (("run_id", runs), ("algo", algos))}
    if encoded:
        arrays = {n: a.dictionary_encode() for n, a in arrays.items()}
    switch(on)
    f = StepFrame(_with(b, **arrays), carry=Carry(), **cfg)
    assert (f._sk is not None) == on
    run_s = np.array(["<null>" if v is None else v for v in runs], dtype=object)[f.order]
    algo_s = np.array(["<null>" if v is None else v for v in algos], dtype=object)[f.order]
    assert list(f.row_run_id) == list(run_s) and list(f.algo) == list(algo_s)
    assert np.array_equal(f.run_id_ok, run_s == cfg["run_id"])
    assert np.array_equal(f.is_chain, algo_s == "chain")
    assert np.array_equal(f.algo_known, (algo_s == "chain") | (algo_s == "tree"))
    assert 0 < f.run_id_ok.sum() < f.R and 0 < f.is_chain.sum() < f.R
