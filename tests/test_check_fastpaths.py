"""The checker's fast paths give what the general paths give.

A batch whose rows all have N nodes is worked on as [R, N] blocks, and trees of one
shape are derived once per shape (invariants/frame.py); Arrow columns are read from
their buffers (invariants/arrow.py to_np) instead of pyarrow's to_numpy, which imports
pandas. Each test below compares a fast path with the general one on the same rows."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import specaudit.invariants.frame_shapes as frame_shapes
import specaudit.invariants.row_groups as row_groups
from specaudit.invariants.arrow import to_np, valid_mask
from specaudit.invariants.carry import Carry
from specaudit.invariants.frame import StepFrame

from specaudit.trace.synth import synth_run_rows, write_run

# --------------------------------------------------------------------- to_np

TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.uint64(),
         pa.float32(), pa.float64(), pa.bool_()]


@pytest.mark.parametrize("typ", TYPES, ids=str)
@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("offset", [0, 3])
def test_to_np_matches_pyarrow(typ, nulls, offset):
    rng = np.random.default_rng(0)
    vals = [bool(v) for v in rng.integers(0, 2, 40)] if typ == pa.bool_() else \
        [int(v) for v in rng.integers(0, 100, 40)]
    if nulls:
        for i in (0, 5, 17, 39):
            vals[i] = None
    arr = pa.array(vals, typ).slice(offset, 30)
    fill = False if typ == pa.bool_() else 0 if pa.types.is_unsigned_integer(typ) else -1
    want = arr.fill_null(fill).to_numpy(zero_copy_only=False)
    got = to_np(arr, fill)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    valid = valid_mask(arr)
    if nulls:
        assert np.array_equal(valid, ~arr.is_null().to_numpy(zero_copy_only=False))
    else:
        assert valid is None


@pytest.mark.parametrize("screened", [False, True])
def test_check_does_not_import_pandas(screened, tmp_path):
    """pyarrow's to_numpy imports pandas on first use (half a second of every check); also
    where big batches are screened (invariants/screen.py: here every batch, alone)."""
    steps, requests, manifest = synth_run_rows(4, algo="tree", seed=3)
    write_run(tmp_path, steps, requests, manifest)
    every = ("from specaudit.invariants import compiled\nfrom specaudit.audit.check import pool\n"
             "compiled.MIN_ROWS = 0\npool.POOL_RUN_BYTES = 0\n") if screened else ""
    code = ("import sys\nfrom specaudit.audit.check import check_paths\n" + every +
            f"r = check_paths([{str(tmp_path)!r}])\n"
            "assert r.steps > 0 and r.exit_code == 0, (r.steps, dict(r.counts))\n"
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------- [R, N] blocks, shapes

@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("width", [1, 4, 7])
@pytest.mark.parametrize("kinds", [1, 5, 80])
@pytest.mark.parametrize("collide", [False, True])
@pytest.mark.parametrize("small", [False, True])   # groups the first rows lack; several chunks
def test_group_rows_groups_equal_rows(dtype, width, kinds, collide, small, monkeypatch):
    if collide:   # every fingerprint equal: the verification must split the groups
        monkeypatch.setattr(row_groups, "_W", np.zeros_like(row_groups._W))
    if small:
        monkeypatch.setattr(row_groups, "_HEAD_ROWS", 7)
        monkeypatch.setattr(row_groups, "_CHUNK", 64)
    rng = np.random.default_rng(kinds * width)
    base = rng.integers(-3, 40, size=(kinds, width)).astype(dtype)
    P = base[rng.integers(0, kinds, size=300)]
    for block in (P, np.asfortranarray(P), P[:, ::-1]):   # views the words cannot be read from
        ids, first = row_groups.group_rows(block)
        assert np.array_equal(block, block[first[ids]])    # every row equals its group's first row
        _, want = np.unique(block, axis=0, return_inverse=True)
        want = want.reshape(-1)
        same = ids[:, None] == ids[None, :]
        if collide:   # split groups allowed, merged ones never
            assert not (same & (want[:, None] != want[None, :])).any()
        else:         # equal rows share an id, exactly
            assert np.array_equal(same, want[:, None] == want[None, :])
            assert len(first) == len(np.unique(want))


PER_ROW = ("ok", "shapes_ok", "root_parent_bad", "parent_order_bad", "chain_shaped", "children_max",
           "derived_mask_hash", "causal_mask_hash", "path_struct_bad", "commit_mismatch_at", "bonus")
FLAT = ("parent_in_row", "parent_flat", "depth", "node_i", "expected_commit")


def _batch(algo: str, n_nodes: int, seed: int, broken: bool):
    steps, _, _ = synth_run_rows(6, algo=algo, n_nodes=n_nodes, seed=seed, concurrency=3)
    cols = [c for c in steps.column_names if c not in ("t_start", "draft_s", "verify_s", "step_s")]
    b = steps.select(cols).combine_chunks().to_batches()[0]
    if broken:   # parents out of order, a root with a parent, a wrong commit token
        rows = b.to_pylist()
        rows[1]["parents"][-1] = len(rows[1]["parents"]) + 2
        rows[2]["parents"][0] = 0
        rows[3]["committed_tokens"][0] += 1
        rows[4]["parents"][-1] = 0
        rows[5]["positions"] = [p + 1 for p in rows[5]["positions"]]            # SA201
        long = [r for r in rows[6:] if len(r["accepted_path"]) >= 3]
        # SA305: a path stops early, its next node not the first child (when a tree has one)
        later = lambda r: r["accepted_path"][-1] != r["parents"].index(r["accepted_path"][-2])
        cut = next((r for r in long if later(r)), long[0])
        cut["accepted_path"] = cut["accepted_path"][:-1]
        skip = next(r for r in long if r is not cut)
        skip["accepted_path"] = [0] + skip["accepted_path"][2:]                 # SA303: skips a node
        b = pa.RecordBatch.from_pylist(rows, schema=b.schema)
    return b


def _with_extra_row(b):
    """The same rows plus one row of another N: the frame takes its general (ragged) path."""
    rows = b.to_pylist()
    extra = dict(rows[0], request_id="zz-extra", step=0)
    n = len(extra["node_tokens"]) + 1
    for k in ("node_tokens", "positions", "target_argmax"):
        extra[k] = (extra[k] + extra[k][-1:])[:n]
    extra["parents"] = list(range(-1, n - 1))
    for k in ("draft_logprob", "target_margin"):
        if extra.get(k) is not None:
            extra[k] = (extra[k] + extra[k][-1:])[:n]
    return pa.RecordBatch.from_pylist(rows + [extra], schema=b.schema)


def _by_batch_row(f, name):
    v = np.asarray(getattr(f, name))
    return v[f.inv] if len(v) == f.R else v


@pytest.mark.parametrize("algo,n_nodes", [("tree", 6), ("tree", 9), ("chain", 5)])
@pytest.mark.parametrize("broken", [False, True])
@pytest.mark.parametrize("collide", [False, True])
def test_uniform_blocks_match_the_general_path(algo, n_nodes, broken, collide, monkeypatch):
    if collide:   # every shape fingerprint collides: each row is verified against its group
        monkeypatch.setattr(frame_shapes, "_POSW", np.ones_like(frame_shapes._POSW))
        monkeypatch.setattr(row_groups, "_W", np.zeros_like(row_groups._W))
    b = _batch(algo, n_nodes, seed=n_nodes, broken=broken)
    fast = StepFrame(b, run_id="synth", carry=Carry())
    slow = StepFrame(_with_extra_row(b), run_id="synth", carry=Carry())
    assert fast.uniform_n and not slow.uniform_n
    R, T = fast.R, fast.T
    if algo == "tree" and not broken:
        assert not fast.chain_shaped.all() and len(fast._shapes[1]) < R   # shapes repeat
    for name in PER_ROW:
        a, s = _by_batch_row(fast, name), _by_batch_row(slow, name)[:R]
        assert a.dtype == s.dtype and np.array_equal(a, s), name
    for name in FLAT:
        a, s = np.asarray(getattr(fast, name)), np.asarray(getattr(slow, name))
        n = len(a) if name == "expected_commit" else T
        assert np.array_equal(a, s[:n]), name
    for flat in ("tokens", "parents"):
        a, s = fast.at_root(getattr(fast, flat))[fast.inv], slow.at_root(getattr(slow, flat))[slow.inv][:R]
        assert a.dtype == s.dtype and np.array_equal(a, s), flat
    if broken:
        assert fast.parent_order_bad.any() and fast.root_parent_bad.any() and (fast.commit_mismatch_at >= 0).any()


@pytest.mark.parametrize("algo,n_nodes", [("tree", 6), ("tree", 9), ("chain", 5)])
@pytest.mark.parametrize("broken", [False, True])
@pytest.mark.parametrize("chunk", [None, 5])   # rules that work by chunks of rows: one, or many
def test_step_rules_find_the_same_on_both_paths(algo, n_nodes, broken, chunk, monkeypatch):
    """Every step rule's hits and message values, per batch row, on [R, N] blocks (shape
    tables: SA201's depths, SA305's children) and on the general path."""
    import specaudit.invariants.sa2_positions as sa2
    import specaudit.invariants.sa3_path as sa3
    from specaudit.invariants import load_rules
    from specaudit.invariants.base import DEFINED
    if chunk:
        monkeypatch.setattr(sa2, "_CHUNK", chunk)
        monkeypatch.setattr(sa3, "_CHUNK", chunk)
    load_rules()
    b = _batch(algo, n_nodes, seed=n_nodes + 1, broken=broken)
    fast = StepFrame(b, run_id="synth", carry=Carry())
    slow = StepFrame(_with_extra_row(b), run_id="synth", carry=Carry())
    found = set()
    for code, cls in DEFINED.items():
        if cls.scope != "step":
            continue
        got = [cls().check(f) for f in (fast, slow)]
        per_row = []
        for f, h in zip((fast, slow), got):
            rows = {} if h is None else {int(f.order[i]): h.at(i) for i in h.rows()}
            per_row.append({r: v for r, v in rows.items() if r < fast.R})
        assert per_row[0] == per_row[1], code
        found |= {code} if per_row[0] else set()
    if broken and algo == "tree":
        assert {"SA201", "SA303", "SA305"} <= found, found


@pytest.mark.parametrize("hi", [1, 4, 300])
def test_list_local_index_is_arange_minus_repeated_starts(hi):
    """The requests table's per-token index (specaudit/audit/check/facts.py) without np.repeat."""
    from specaudit.invariants.arrow import list_local_index
    rng = np.random.default_rng(hi)
    for ln in (rng.integers(0, hi + 1, 500), np.zeros(3, dtype=np.int64), np.array([0, 5, 0, 0, 1, 2, 0])):
        start = np.cumsum(ln) - ln
        want = np.arange(int(ln.sum())) - np.repeat(start, ln)
        got = list_local_index(ln)
        assert got.dtype == np.int64 and np.array_equal(got, want)
