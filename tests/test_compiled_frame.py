"""StepFrame through the compiled kernels (invariants/frame_kernels.py) equals StepFrame
in numpy, its definition: every array the kernels fill, the carry after finish_carry and
every step rule's findings, on the whole fixture corpus (each rule's pass and fail runs)
and on corrupted big synthetic batches; MIN_ROWS is patched to 0 so that small batches
take the compiled path. The test machine has a C compiler (scripts/test.sh): nothing here
skips without one."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from specaudit.invariants import DEFINED, all_rules, compiled, load_rules
from specaudit.invariants.carry import Carry
from specaudit.invariants.fixtures import FixtureRun
from specaudit.invariants.frame import StepFrame, to_np
from specaudit.invariants.frame_link import KERNELS

from specaudit.audit.check import check_paths
from specaudit.audit.check.core import emit_hits, run_config
from specaudit.audit.check.result import CheckResult
from specaudit.audit.check.stream import STEP_READ_COLUMNS, _file_batches, proven_diagnostics
from specaudit.trace.synth import write_synthetic_dataset

# what the kernels fill (path_commit: the first 6, link_rows), and derived arrays that read
# them, or that numpy builds on first use beside them (path_k ... commit_k)
FILLED = ("path_struct_bad", "last_node", "bonus", "commit_mismatch_at", "commit_eos_at", "commit_last",
          "has_prev", "prev_step", "prev_seq_end", "prev_last", "prev_finished", "out_before", "contiguous")
DERIVED = ("path_ok", "group_first", "true_depth", "commit_row", "path_row", "path_k", "path_glob",
           "expected_commit", "commit_k")
TRACE_RULES = [r for r in all_rules() if r.scope != "source"]


@pytest.fixture
def kernels_on(monkeypatch):
    """Every batch through the kernels (MIN_ROWS 0), kernels switched on."""
    monkeypatch.setattr(compiled, "MIN_ROWS", 0)
    monkeypatch.delenv(compiled.ENV, raising=False)
    assert compiled.kernels(KERNELS, rows=1) is not None, "the frame kernels failed to load"
    return monkeypatch


def _frames(batches, cfg, on: bool, monkeypatch):
    """(per batch: the FILLED and DERIVED arrays and every step rule's findings, the
    carry's fields after the last batch), with the kernels on or off."""
    monkeypatch.setenv(compiled.ENV, "1" if on else "0")
    load_rules()
    rules = [r() for r in DEFINED.values() if r.scope == "step"]
    carry, out, rows = Carry(), [], 0
    for b in batches:
        f = StepFrame(b, carry=carry, row_offset=rows, **cfg)
        rows += b.num_rows
        assert (f._kern is not None) == on
        sampling = any(c in f.columns for c in ("accept_u", "sampled_token"))
        if on and not sampling:   # the kernel pass filled them in __init__
            assert all(k in f.__dict__ for k in FILLED[:6])
        arrays = {k: getattr(f, k) for k in FILLED + DERIVED}
        res = CheckResult(max_per_code=0)
        for rule in rules:
            emit_hits(rule, rule.check(f), f, res, kind="step")
        f.finish_carry()
        out.append((arrays, [x.to_dict() for x in res.findings]))
    fields = {k: carry.view(k).copy() for k in Carry.FIELDS}
    carry.close()
    return out, fields


def _assert_same(batches, cfg, monkeypatch) -> int:
    """The kernels' frames equal numpy's: arrays (values and dtypes), findings, carry.
    -> the number of findings compared."""
    want, want_carry = _frames(batches, cfg, False, monkeypatch)
    got, got_carry = _frames(batches, cfg, True, monkeypatch)
    n = 0
    for i, ((wa, wf), (ga, gf)) in enumerate(zip(want, got)):
        for k in wa:
            assert ga[k].dtype == wa[k].dtype, (i, k, ga[k].dtype, wa[k].dtype)
            assert np.array_equal(ga[k], wa[k]), (i, k, np.flatnonzero(ga[k] != wa[k])[:5])
        assert gf == wf, i
        n += len(wf)
    for k in Carry.FIELDS:
        assert got_carry[k].dtype == want_carry[k].dtype and np.array_equal(got_carry[k], want_carry[k]), k
    return n


def _fixture_batches(run: FixtureRun, parts: int = 3):
    """A fixture run's steps as record batches (several: the carry links them), and its
    frame configuration."""
    st, _ = run.tables()
    st = st.combine_chunks()
    size = max(1, -(-st.num_rows // parts))
    eos_id, max_new, conv = run_config(run.manifest)
    cfg = dict(run_id=run.manifest.get("run_id", ""), eos_id=eos_id, max_new_tokens=max_new,
               manifest=run.manifest, conventions=conv)
    return st.to_batches(max_chunksize=size), cfg


def _corpus():
    for rule in TRACE_RULES:
        for kind in ("pass", "fail"):
            yield pytest.param(rule, kind, id=f"{rule.code}-{kind}")


@pytest.mark.parametrize("rule, kind", list(_corpus()))
def test_fixture_frames_equal_numpy(rule, kind, kernels_on):
    run = FixtureRun.make(rule.fixture_algo)
    rule.passing(run) if kind == "pass" else rule.fail(run)
    try:
        batches, cfg = _fixture_batches(run)
        numpy_frames = _frames(batches, cfg, False, kernels_on)
    except Exception as e:   # a fixture that breaks the schema on purpose: the check refuses it
        with pytest.raises(type(e)):
            _frames(batches, cfg, True, kernels_on)
        return
    del numpy_frames
    _assert_same(batches, cfg, kernels_on)


@pytest.mark.parametrize("rule", TRACE_RULES, ids=lambda r: r.code)
def test_fixture_findings_equal_numpy(rule, tmp_path, kernels_on):
    """The whole check's findings, kernels on and off, on the rule's fail fixture (and its pass)."""
    for kind in ("pass", "fail"):
        run = FixtureRun.make(rule.fixture_algo)
        rule.passing(run) if kind == "pass" else rule.fail(run)
        path = run.write(tmp_path / kind)
        got = {}
        for env in ("0", "1"):
            kernels_on.setenv(compiled.ENV, env)
            res = check_paths([path])
            got[env] = (dict(res.counts), [x.to_dict() for x in res.findings])
        assert got["1"] == got["0"], (rule.code, kind)


# ------------------------------------------------------------------ big synthetic batches
def _relist(arr, fn):
    return pa.array(fn(arr.to_pylist()), type=arr.type)


def _corrupt(batch, seed: int):
    """A copy of a batch with broken rows: commits (a token, a short commit, an EOS),
    paths (out of range, skipping a node, not at the root, empty), parents, steps out of
    order or repeated, finished flags."""
    rng = np.random.default_rng(seed)
    R = batch.num_rows
    pick = lambda k: rng.choice(R, size=min(k, R), replace=False)
    cols = {n: batch.column(i) for i, n in enumerate(batch.schema.names)}

    def commits(v):
        for r in pick(40):
            if v[r]:
                v[r][-1] = (v[r][-1] % 250) + 1
        for r in pick(20):
            v[r] = v[r][:-1]
        for r in pick(10):
            v[r] = v[r] + [0, 5]
        return v

    def paths(v):
        for j, r in enumerate(pick(40)):
            v[r] = [v[r] + [99], [0] + v[r][2:], [1] + v[r][1:], []][j % 4]
        return v

    def parents(v):
        for j, r in enumerate(pick(20)):
            v[r][min(len(v[r]) - 1, 1 + j % 3)] = -1 if j % 2 else 7
        return v
    cols["committed_tokens"] = _relist(cols["committed_tokens"], commits)
    cols["accepted_path"] = _relist(cols["accepted_path"], paths)
    cols["parents"] = _relist(cols["parents"], parents)
    step = to_np(cols["step"]).copy()
    step[pick(10)] += 3
    step[pick(5)] = 0
    cols["step"] = pa.array(step, type=cols["step"].type)
    fin = to_np(cols["finished"]).copy()
    fin[pick(30)] ^= True
    cols["finished"] = pa.array(fin)
    return pa.RecordBatch.from_arrays(list(cols.values()), schema=batch.schema)


def _synthetic_batches(tmp_path, algo, n_nodes, ragged, steps=12000, rows=4096):
    """A valid synthetic run's step batches as the check reads them, and its frame configuration."""
    run_dir = write_synthetic_dataset(tmp_path, steps, n_nodes=n_nodes, algo=algo, seed=3, ragged=ragged,
                                      run_id=f"k-{algo}", rollups=False)
    batches = []
    for path in sorted(run_dir.glob("steps-*.parquet")):
        pf = pq.ParquetFile(path, read_dictionary=["run_id", "request_id", "algo"])
        skip = proven_diagnostics(pf.metadata)
        cols = [c for c in STEP_READ_COLUMNS if c in pf.schema_arrow.names and c not in skip]
        batches += [b for b in _file_batches(pf, path, rows, cols) if b.num_rows]
    manifest = json.loads((run_dir / "run.json").read_text())
    eos_id, max_new, conv = run_config(manifest)
    return batches, dict(run_id=manifest["run_id"], eos_id=eos_id, max_new_tokens=max_new, manifest=manifest,
                         conventions=conv)


@pytest.mark.parametrize("algo, n_nodes, ragged", [("chain", 8, False), ("tree", 16, False), ("tree", 12, True)])
def test_big_corrupted_batches_equal_numpy(algo, n_nodes, ragged, tmp_path, kernels_on):
    batches, cfg = _synthetic_batches(tmp_path, algo, n_nodes, ragged)
    assert len(batches) >= 3
    mixed = [_corrupt(b, seed=i) if i % 2 else b for i, b in enumerate(batches)]
    assert _assert_same(batches, cfg, kernels_on) == 0    # a valid run: no finding either way
    assert _assert_same(mixed, cfg, kernels_on) > 0       # the corruptions are found, the same


def test_paged_carry_equal_numpy(tmp_path, kernels_on):
    """A carry paged out (pages of 16 requests, 64 in memory): the kernels read and fold
    the rows carry.rows gives, as numpy does."""
    from specaudit.invariants import carry as carry_mod
    kernels_on.setattr(carry_mod, "PAGE_SLOTS", 16)
    kernels_on.setattr(carry_mod, "SPILL_SLOTS", 64)
    run_dir = write_synthetic_dataset(tmp_path, 6000, n_nodes=8, algo="chain", seed=5, run_id="k-paged",
                                      rollups=False)
    pf = pq.ParquetFile(next(run_dir.glob("steps-*.parquet")))
    batches = [_corrupt(b, seed=i) if i % 2 else b for i, b in enumerate(pf.iter_batches(batch_size=1000))]
    manifest = json.loads((run_dir / "run.json").read_text())
    eos_id, max_new, conv = run_config(manifest)
    cfg = dict(run_id=manifest["run_id"], eos_id=eos_id, max_new_tokens=max_new, manifest=manifest,
               conventions=conv)
    c = Carry()
    c.index([str(i) for i in range(100)])
    assert c.paged, "the test's carry should page"
    c.close()
    assert _assert_same(batches, cfg, kernels_on) > 0


def test_numpy_when_switched_off(monkeypatch):
    monkeypatch.setattr(compiled, "MIN_ROWS", 0)
    monkeypatch.setenv(compiled.ENV, "0")
    run = FixtureRun.make("chain")
    batches, cfg = _fixture_batches(run, parts=1)
    f = StepFrame(batches[0], carry=Carry(), **cfg)
    assert f._kern is None and "commit_mismatch_at" not in f.__dict__
