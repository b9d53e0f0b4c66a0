"""The compiled "anything bad?" tests of SA201, SA304, SA305, SA103, SA403, SA202, SA102,
SA401, SA301, SA302, SA308, SA105, SA311 (invariants/rule_kernels.py), and RunSums' C pass,
answer exactly as the rules' numpy masks, and the rules find the same with and without them.

compiled.MIN_ROWS is patched to 0 so that small batches take the compiled path; the
reference runs with SPECAUDIT_COMPILED=0 (numpy only). The test machine has a C compiler:
nothing here is skipped without one (a kernel library that cannot be built fails `test_kernels_load`)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import specaudit.invariants.sa2_positions as sa2
import specaudit.invariants.sa3_path as sa3
from specaudit.invariants import all_rules, compiled, get_rule
from specaudit.invariants.carry import Carry
from specaudit.invariants.fixtures import FixtureRun
from specaudit.invariants.frame import StepFrame

from specaudit.audit.check import check_paths
from specaudit.trace.synth import synth_run_rows

KERNELS = "specaudit.invariants.rule_kernels"
CODES = ("SA201", "SA304", "SA305", "SA103", "SA403", "SA202", "SA102", "SA401", "SA301", "SA302", "SA308", "SA105",
         "SA311", "SA402", "SA307")
MAX_NEW = 48   # synth_run_rows' max_new_tokens: SA311 is asked only when the frame knows it
TRACE_RULES = [r for r in all_rules() if r.scope != "source"]


@pytest.fixture
def small_batches(monkeypatch):
    """Every batch takes the compiled path when SPECAUDIT_COMPILED is not 0."""
    monkeypatch.setattr(compiled, "MIN_ROWS", 0)
    monkeypatch.delenv(compiled.ENV, raising=False)
    return monkeypatch


def _numpy(monkeypatch):
    monkeypatch.setenv(compiled.ENV, "0")


def _compiled(monkeypatch):
    monkeypatch.delenv(compiled.ENV, raising=False)


def test_kernels_load(small_batches):
    kern = compiled.kernels(KERNELS, rows=1)
    assert kern is not None, "the test machine has a C compiler: the rule kernels must build and load"
    _numpy(small_batches)
    assert compiled.kernels(KERNELS, rows=10**9) is None      # SPECAUDIT_COMPILED=0: numpy


# ------------------------------------------------------------------ fixtures

def _findings(res):
    return [(f.code, f.request_id, f.step, f.message) for f in res.findings], dict(res.counts)


@pytest.mark.parametrize("rule", TRACE_RULES, ids=lambda r: r.code)
@pytest.mark.parametrize("which", ["pass", "fail"])
def test_fixture_findings_equal(rule, which, small_batches, tmp_path):
    """Every rule's pass and fail fixture: the same findings with the kernels as without."""
    run = FixtureRun.make(rule.fixture_algo)
    (rule.passing if which == "pass" else rule.fail)(run)
    path = run.write(tmp_path / which)
    got = {}
    for mode in ("numpy", "compiled"):
        (_numpy if mode == "numpy" else _compiled)(small_batches)
        got[mode] = _findings(check_paths([path], batch_rows=16))   # several batches per run
    assert got["compiled"] == got["numpy"]
    if which == "fail":
        assert rule.code in got["numpy"][1]


# ------------------------------------------------------------ frame level

def _frame(batch):
    return StepFrame(batch, run_id=batch.column(batch.schema.names.index("run_id"))[0].as_py(),
                     carry=Carry(), max_new_tokens=MAX_NEW)


def _hits_of(f, h):
    """A rule's hits on frame f: {batch row: message values}."""
    return {} if h is None else {int(f.order[i]): h.at(int(i)) for i in h.rows()}


NOT_ASKED = "numpy only"   # a batch the rule has no kernel for (SA202 on trees: numpy as today)


def _answer(code, f, kern):
    """The kernel's fast test for rule `code` on frame f (True: something is bad), None
    where the rule returns before asking it, NOT_ASKED where it has no kernel for f."""
    ok = f.path_ok & ~f.sampled
    if code == "SA102":
        return bool(kern.node_count_bad(f.n_raw, f.n, f.budget, f.too_many_nodes))
    if code == "SA103":
        return bool(kern.root_parent_bad(f.root_parent_bad, f.n))
    if code == "SA403":
        return bool(kern.root_continuity_bad(f.has_prev, f.step, f.prev_step, f.prev_last, f.start, f.n,
                                             f.tokens, f.inv))
    if code == "SA202":   # asked only for a uniform batch of chains
        chains = f.uniform_n and f.chain_shaped.all()
        return bool(kern.hash_differs(f.mask_hash, np.uint64(f._chain_hash(f.n[:1])[0]))) if chains else NOT_ASKED
    if code == "SA201":
        return None if f.T == 0 else bool(sa2._positions_bad(kern, f))
    if code == "SA401":
        return kern.step_bad(f.step, f.has_prev, f.prev_step)
    if code == "SA301":
        return kern.commit_len_bad(f.accepted_depth, f.commit_len, f.finished)
    if code == "SA302":
        return kern.path_depth_bad(f.path_len, f.accepted_depth)
    if code == "SA308":
        return kern.eos_inside_commit(f.commit_eos_at, f.commit_n)
    if code == "SA105":
        if f.T > 0 and f.chain_shaped.all():
            return kern.children_over_topk_chain(f.ok, f.n, f.topk)
        return kern.children_over_topk(f.ok, f.children_max, f.topk)
    if code == "SA311":
        return kern.token_limit_bad(f.max_new_tokens, f.eos_id, f.out_before, f.commit_n, f.commit_last,
                                    f.contiguous, f.path_ok, f.finished)
    if code == "SA402":
        return kern.seq_len_bad(f.step, f.has_prev, f.prev_step, f.seq_len, f.prev_seq_end)
    if code == "SA307":
        return kern.committed_tokens_bad(f.path_ok, f.finished, f.commit_n, f.path_len, f.commit_mismatch_at)
    if code == "SA304":
        if not len(f.path) or not ok.any():
            return None
        return bool(sa3._path_argmax_bad(kern, f, ok))
    if f.T == 0 or not ok.any():
        return None
    return bool(sa3._path_not_maximal(kern, f, ok))


def _agree(batch, monkeypatch):
    """For each rule: the kernel says bad exactly when numpy's mask has a hit, and the
    hits and their values are the same both ways. -> codes that found something.
    One frame per mode answers every rule, as in a check (a frame per rule and mode made
    this module the suite's slowest in CPU: 60 frames of the same batch)."""
    _numpy(monkeypatch)
    f = _frame(batch)
    numpy_any, want = {}, {}
    for code in CODES:
        h = get_rule(code).check(f)
        numpy_any[code] = h is not None and bool(h.mask.any())
        want[code] = _hits_of(f, h)
    _compiled(monkeypatch)
    f = _frame(batch)
    kern = compiled.kernels(KERNELS, rows=f.R)
    assert kern is not None
    found = set()
    for code in CODES:
        answer = _answer(code, f, kern)
        assert answer is numpy_any[code] or answer is None and not numpy_any[code] or answer is NOT_ASKED, \
            (code, answer, numpy_any[code])
        assert _hits_of(f, get_rule(code).check(f)) == want[code], code
        found |= {code} if want[code] else set()
    return found


def _rows(algo, n_nodes, seed, ragged=False, n=24):
    steps, _, _ = synth_run_rows(n, algo=algo, n_nodes=n_nodes, seed=seed, concurrency=5, ragged=ragged)
    cols = [c for c in steps.column_names if c not in ("t_start", "draft_s", "verify_s", "step_s")]
    b = steps.select(cols).combine_chunks().to_batches()[0]
    return b.to_pylist(), b.schema


def _children(row):
    kids = {}
    for i, p in enumerate(row["parents"]):
        kids.setdefault(p, []).append(i)
    return kids


def _corrupt(rng, rows, kind, last=False):
    """One row of `rows` (a copy) broken as `kind`, a random one or the last that can be;
    None when no row can be."""
    order = range(len(rows) - 1, -1, -1) if last else rng.permutation(len(rows))
    for i in order:
        r = dict(rows[i], **{k: list(v) for k, v in rows[i].items() if isinstance(v, list)})   # copied on a visit
        path, n = r["accepted_path"], len(r["node_tokens"])
        if kind == "position":                                    # SA201: one node shifted
            j = int(rng.integers(0, n))
            r["positions"][j] += int(rng.choice([-1, 1, 7]))
        elif kind == "position_all":                              # SA201: every node shifted
            r["positions"] = [p + 1 for p in r["positions"]]
        elif kind == "argmax" and len(path) >= 2:                 # SA304: argmax along the path
            k = int(rng.integers(0, len(path) - 1))
            r["target_argmax"][path[k]] = (r["target_argmax"][path[k]] + 1) % 250 + 1
        elif kind == "token" and len(path) >= 2:                  # SA304: a drafted token on the path
            k = int(rng.integers(1, len(path)))
            r["node_tokens"][path[k]] = (r["node_tokens"][path[k]] + 3) % 250 + 1
        elif kind == "stop_early" and len(path) >= 2:             # SA305: the path cut short
            r["accepted_path"] = path[:-1]
        elif kind == "child_matches":                             # SA305: a child carries the bonus
            kids = _children(r).get(path[-1], [])
            if not kids:
                continue
            r["node_tokens"][kids[int(rng.integers(0, len(kids)))]] = r["target_argmax"][path[-1]]
        elif kind == "root_parent":                               # SA103
            r["parents"][0] = int(rng.choice([0, 3, -2]))
        elif kind == "root_token" and r["step"] >= 1:             # SA403: the root is not the last commit
            r["node_tokens"][0] = (r["node_tokens"][0] + 5) % 250 + 1
        elif kind == "budget":                                    # SA102: N above budget + 1
            r["budget"] = n - 2 - int(rng.integers(0, 3))
        elif kind == "no_nodes":                                  # SA102: a row without nodes
            for k in ("node_tokens", "parents", "positions", "target_argmax"):
                r[k] = []
        elif kind == "mask_hash":                                 # SA202
            r["mask_hash"] = (r["mask_hash"] + int(rng.integers(1, 1 << 40))) % (1 << 64)
        elif kind == "bad_parent" and n >= 3:                     # a row no deeper rule trusts
            r["parents"][-1] = n + 2
        elif kind == "short_positions" and n >= 2:                # a per-node list too short (int64)
            r["positions"] = r["positions"][:-1]
        elif kind == "bad_path_node":                             # SA303: out of the tree
            r["accepted_path"] = path[:-1] + [n + 5]
        elif kind == "step_gap":                                  # SA401: a step skipped
            r["step"] += 2
        elif kind == "commit_len":                                # SA301: past accepted_depth + 1
            r["commit_len"] = r["accepted_depth"] + 2
        elif kind == "accepted_depth":                            # SA302 (and SA301)
            r["accepted_depth"] += int(rng.choice([-1, 1]))
        elif kind == "eos_inside" and len(r["committed_tokens"]) >= 2:   # SA308: tokens after EOS
            r["committed_tokens"][0] = 0
        elif kind == "topk" and n >= 2:                           # SA105: more children than topk
            r["topk"] = 0
        elif kind == "seq_len" and r["step"] >= 1:                # SA402: seq_len not where it ended
            r["seq_len"] += int(rng.choice([-1, 2]))
        elif kind == "no_commit":                                 # SA310 (and others): nothing committed
            r["committed_tokens"] = []
        elif kind == "commit_token" and r["committed_tokens"]:    # SA307: a committed token changed
            k = int(rng.integers(0, len(r["committed_tokens"])))
            r["committed_tokens"][k] = (r["committed_tokens"][k] + 7) % 250 + 1
        elif kind == "finish_early" and not r["finished"] and r["committed_tokens"][-1:] != [0]:   # SA311
            r["finished"] = True
        else:
            continue
        return rows[:i] + [r] + rows[i + 1:]
    return None


KINDS = ["position", "position_all", "argmax", "token", "stop_early", "child_matches", "root_parent",
         "root_token", "mask_hash", "budget", "no_nodes", "bad_parent", "short_positions", "bad_path_node",
         "step_gap", "commit_len", "accepted_depth", "eos_inside", "topk", "finish_early", "seq_len", "no_commit",
         "commit_token"]
CASES = [("chain", 8, False), ("chain", 3, False), ("chain", 4, False), ("chain", 16, False), ("tree", 6, False),
         ("tree", 9, False), ("tree", 32, False), ("chain", 8, True), ("tree", 9, True)]


@pytest.mark.parametrize("algo,n_nodes,ragged", CASES, ids=lambda v: str(v))
def test_clean_batches_agree(algo, n_nodes, ragged, small_batches):
    rows, schema = _rows(algo, n_nodes, seed=n_nodes, ragged=ragged)
    assert not _agree(pa.RecordBatch.from_pylist(rows, schema=schema), small_batches)


@pytest.mark.parametrize("algo,n_nodes,ragged", CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("seed", range(3))
def test_corrupted_batches_agree(algo, n_nodes, ragged, seed, small_batches):
    """Single rows broken one way at a time, at random places, then several at once."""
    rows, schema = _rows(algo, n_nodes, seed=100 + seed, ragged=ragged, n=32)
    rng = np.random.default_rng(seed)
    found = set()
    for kind in KINDS:
        bad = _corrupt(rng, rows, kind)
        if bad is not None:
            found |= _agree(pa.RecordBatch.from_pylist(bad, schema=schema), small_batches)
    many = rows
    for kind in rng.choice(KINDS, size=6):
        many = _corrupt(rng, many, kind) or many
    _agree(pa.RecordBatch.from_pylist(many, schema=schema), small_batches)
    assert set(CODES) <= found, found


@pytest.mark.parametrize("algo,n_nodes", [("chain", 8), ("tree", 32)])
def test_one_bad_row_at_the_end_of_a_big_batch(algo, n_nodes, small_batches):
    """Kernels stop at the first bad block: a single bad row in the batch's last rows
    (past several blocks of rows and of path entries) is still seen."""
    rows, schema = _rows(algo, n_nodes, seed=11, n=300)
    assert len(rows) > 3000
    rng = np.random.default_rng(2)
    for kind, code in (("position", "SA201"), ("argmax", "SA304"), ("stop_early", "SA305"),
                       ("root_parent", "SA103"), ("root_token", "SA403"), ("mask_hash", "SA202"),
                       ("budget", "SA102"), ("step_gap", "SA401"), ("commit_len", "SA301"),
                       ("accepted_depth", "SA302"), ("eos_inside", "SA308"), ("topk", "SA105"),
                       ("finish_early", "SA311"), ("seq_len", "SA402"), ("commit_token", "SA307")):
        assert code in _agree(pa.RecordBatch.from_pylist(_corrupt(rng, rows, kind, last=True), schema=schema),
                              small_batches), kind


def test_uniform_batch_with_refused_rows_takes_the_parents_kernel(small_batches):
    """A uniform tree batch with a broken row: no shapes grouped by the frame, so SA201
    and SA305 use the kernels over the safe parents; they still answer as numpy."""
    rows, schema = _rows("tree", 9, seed=5, n=16)
    rows[3]["parents"][-1] = 40
    b = pa.RecordBatch.from_pylist(rows, schema=schema)
    f = _frame(b)
    assert f.uniform_n and "_shapes" not in f.__dict__ and not f.chain_shaped.all()
    assert not _agree(b, small_batches) - {"SA201", "SA202"}   # (the refused row: its safe parents)
    rng = np.random.default_rng(1)
    for kind in ("position", "stop_early", "child_matches"):
        _agree(pa.RecordBatch.from_pylist(_corrupt(rng, rows, kind), schema=schema), small_batches)


def test_chain_rows_above_max_nodes(small_batches):
    """Chains longer than MAX_NODES (refused rows, derived hash 0): SA202's kernel compares
    with 0 as derived_mask_hash does, and every kernel answers as numpy."""
    from specaudit.trace.schema import MAX_NODES
    rows, schema = _rows("chain", 4, seed=3, n=2)
    rows = [dict(r) for r in rows[:5]]
    N = MAX_NODES + 1
    for r in rows:
        r["node_tokens"] = (r["node_tokens"] * N)[:N]
        r["target_argmax"] = (r["target_argmax"] * N)[:N]
        r["parents"] = list(range(-1, N - 1))
        r["positions"] = [r["seq_len"] + i for i in range(N)]
        for k in ("draft_logprob", "target_margin"):
            if r.get(k) is not None:
                r[k] = (r[k] * N)[:N]
    b = pa.RecordBatch.from_pylist(rows, schema=schema)
    assert "SA202" in _agree(b, small_batches)           # (recorded hashes are not 0)
    for r in rows:
        r["mask_hash"] = 0
    assert "SA202" not in _agree(pa.RecordBatch.from_pylist(rows, schema=schema), small_batches)


@pytest.mark.parametrize("pos_dt", [np.int32, np.int64])
@pytest.mark.parametrize("seq_dt", [np.int32, np.int64])
@pytest.mark.parametrize("N0", [1, 3, 4, 8, 16])
def test_positions_bad_chain_every_width(pos_dt, seq_dt, N0, small_batches):
    """SA201's chain kernel (seq_len in batch order, no gather) == numpy's
    (pos != seq[:, None] + arange(N0)).any() for each width, one bad node anywhere."""
    kern = compiled.kernels(KERNELS, rows=1)
    rng = np.random.default_rng(N0)
    R = 1000
    seq = rng.integers(0, 2**31 - 64, R).astype(seq_dt)
    pos = (seq.astype(np.int64)[:, None] + np.arange(N0)).astype(pos_dt)
    assert kern.positions_bad_chain(pos, seq) is False
    for b in (0, 255, 256, 511, R - 1, int(rng.integers(0, R))):
        for i in {0, N0 - 1, int(rng.integers(0, N0))}:
            bad = pos.copy()
            bad[b, i] += 1
            want = bool((bad.astype(np.int64) != seq.astype(np.int64)[:, None] + np.arange(N0)).any())
            assert kern.positions_bad_chain(bad, seq) is want is True
    assert kern.positions_bad_chain(pos.astype(np.int16), seq) is True     # other widths: "maybe"


# ------------------------------------------------------------ run totals (RunSums)

def _run_sums(batches, monkeypatch, mode):
    from specaudit.audit.check.core import RunSums
    (_numpy if mode == "numpy" else _compiled)(monkeypatch)
    rs, carry = RunSums(), Carry()
    for i, b in enumerate(batches):
        f = StepFrame(b, run_id=b.column(b.schema.names.index("run_id"))[0].as_py(), carry=carry)
        rs.add(f, f"part{i % 2}")
        f.finish_carry()
    return rs.total, rs.parts, rs.depth_hist.tolist(), rs.depth_hist.dtype


@pytest.mark.parametrize("algo,n_nodes,ragged", CASES, ids=lambda v: str(v))
def test_run_sums_identical(algo, n_nodes, ragged, small_batches):
    """RunSums.add's totals, per-part sums and depth histogram: the C pass (sums_kernels)
    == numpy's per_row sums and bincount, on clean and corrupted batches."""
    rows, schema = _rows(algo, n_nodes, seed=7 + n_nodes, ragged=ragged, n=32)
    rng = np.random.default_rng(n_nodes)
    batches = [pa.RecordBatch.from_pylist(rows, schema=schema)]
    for kind in KINDS:
        bad = _corrupt(rng, rows, kind)
        if bad is not None:
            batches.append(pa.RecordBatch.from_pylist(bad, schema=schema))
    assert compiled.kernels("specaudit.audit.check.sums_kernels", rows=1) is not None
    want = _run_sums(batches, small_batches, "numpy")
    assert want[0]["refused"] > 0 and want[0]["steps"] > 0
    assert _run_sums(batches, small_batches, "compiled") == want


def test_run_sums_kernel_edges(small_batches):
    """run_sums on made-up columns: negative and huge values, depths past the histogram's
    last bin, sums that wrap int64 as numpy's do; R = 0 and 1."""
    from types import SimpleNamespace

    from specaudit.audit.check import sums_kernels
    from specaudit.audit.check.core import RunSums
    rng = np.random.default_rng(3)
    big = np.iinfo(np.int64).max // 3
    for R in (0, 1, 2, 255, 1000):
        cols = {k: rng.integers(-5, 6000, R) for k in ("n", "true_depth", "accepted_depth", "commit_n",
                                                       "commit_len", "budget")}
        if R > 2:
            cols["commit_len"][:4] = big      # wraps as numpy's int64 sum
            cols["true_depth"][1] = 10**9     # clipped to the last bin
        f = SimpleNamespace(R=R, ok=rng.random(R) < 0.7, **cols)
        vals, hist = sums_kernels.run_sums(f)
        assert vals == {k: int(v.sum()) for k, v in RunSums.per_row(f).items()}
        want = np.bincount(RunSums.depth_bins(f))
        assert hist.dtype == want.dtype and hist.tolist() == want.tolist()
