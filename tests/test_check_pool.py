"""Many tiny runs checked as one pool (issue 19 item 7): the same report as checking
each run alone, whatever the runs hold and however many worker processes run.

The pool only confirms clean runs; a run with any finding is checked again alone. So
the test that matters is equality: a dataset of clean tiny runs beside every catalog
rule's failing and passing fixture (each its own run), checked with pooling off, on,
and on with two worker processes, gives the same findings in the same order, the same
counts, files, runs, steps and requests.
"""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from specaudit.invariants import all_rules
from specaudit.invariants.fixtures import FixtureRun

from specaudit.audit import check as C
from specaudit.audit.check import core, pool, pool_read
from specaudit.trace.synth import synth_run_rows

TRACE_RULES = [r for r in all_rules() if r.scope != "source"]


def _tiny(out, i: int, **kw):
    """A clean tiny run t<i> (one request, a few steps) written as the sink writes one."""
    s, r, m = synth_run_rows(1, run_id=f"t{i}", seed=i, max_new_tokens=8, **kw)
    d = out / f"run_id=t{i}"
    d.mkdir(parents=True)
    pq.write_table(s, d / "steps-000000.parquet")
    pq.write_table(r, d / "requests.parquet")
    (d / "run.json").write_text(json.dumps(m))
    return d


def _report(res: C.CheckResult) -> dict:
    return {"findings": [f.to_dict() for f in res.findings], "counts": dict(res.counts),
            "files": res.files_checked, "bad": res.bad_files, "incomplete": res.incomplete_runs,
            "runs": res.runs, "steps": res.steps, "requests": res.requests, "exit": res.exit_code}


def _three_ways(monkeypatch, paths, **kw) -> tuple[dict, dict, dict]:
    """(alone, pooled in this process, pooled in two workers with small pools)."""
    with monkeypatch.context() as m:
        m.setattr(pool, "POOL_RUN_BYTES", 0)                 # nothing pools: every run alone
        alone = _report(C.check_paths(paths, **kw))
    pooled = _report(C.check_paths(paths, workers=1, **kw))
    with monkeypatch.context() as m:
        m.setattr(pool, "POOL_RUNS", 5)                      # many tasks: the executor starts
        workers = _report(C.check_paths(paths, workers=2, **kw))
    return alone, pooled, workers


@pytest.fixture(scope="module")
def catalog_dataset(tmp_path_factory):
    """Clean tiny runs interleaved with every trace rule's failing and passing fixture."""
    out = tmp_path_factory.mktemp("pool") / "ds"
    i = 0
    for rule in TRACE_RULES:
        for kind in ("fail", "pass"):
            _tiny(out, i)
            i += 1
            run = FixtureRun.make(rule.fixture_algo, run_id=f"{kind}-{rule.code}")
            (rule.fail if kind == "fail" else rule.passing)(run)
            run.write(out)
    for j in range(12):                                   # a second configuration, pooled apart
        _tiny(out, i + j, algo="tree", budget=7)
    return out


def test_pooled_report_equals_alone_on_every_rules_fixtures(catalog_dataset, monkeypatch):
    alone, pooled, workers = _three_ways(monkeypatch, [catalog_dataset])
    assert alone["counts"], "the failing fixtures must report something"
    for rule in TRACE_RULES:   # every rule's own failing fixture is still caught
        assert rule.code in alone["counts"], rule.code
    assert pooled == alone
    assert workers == alone


def test_pooled_report_equals_alone_with_capped_findings(catalog_dataset, monkeypatch):
    alone, pooled, workers = _three_ways(monkeypatch, [catalog_dataset], max_per_code=2)
    assert any(n > 2 for n in alone["counts"].values())   # the cap did cut something
    assert pooled == alone and workers == alone


def test_pool_confirms_clean_runs_without_checking_them_alone(tmp_path, monkeypatch):
    """The speed-up is real: clean tiny runs never reach check_run; a broken one does."""
    for i in range(30):
        _tiny(tmp_path / "ds", i)
    bad = tmp_path / "ds" / "run_id=t7" / "steps-000000.parquet"
    t = pq.read_table(bad)
    cl = t.column("commit_len").to_pylist()
    cl[1] += 1                                            # a counter bug in one row
    pq.write_table(t.set_column(t.schema.get_field_index("commit_len"), "commit_len",
                                pa.array(cl, pa.int32())), bad)
    with monkeypatch.context() as m:
        m.setattr(pool, "POOL_RUN_BYTES", 0)
        alone = C.check_paths([tmp_path / "ds"])
    alone_runs = []
    real = pool.check_run
    monkeypatch.setattr(pool, "check_run", lambda rf, *a, **k: (alone_runs.append(rf.run_id), real(rf, *a, **k)))
    res = C.check_paths([tmp_path / "ds"], workers=1)
    assert alone_runs == ["t7"]
    assert len(res.runs) == 30 and res.runs == alone.runs
    assert res.errors and {f.run_id for f in res.findings} == {"t7"}
    assert _report(res) == _report(alone)


def test_run_rules_see_the_same_aggregates_pooled(tmp_path, monkeypatch):
    """Per run, the partial the run rules read is the one check_group makes alone."""
    for i in range(20):
        _tiny(tmp_path / "ds", i)
    seen: dict = {"alone": {}, "pooled": {}}
    real = core.check_run_rules

    def spy(mode):
        def f(partial, *, run_id, **kw):
            seen[mode][run_id] = json.loads(json.dumps(partial))
            return real(partial, run_id=run_id, **kw)
        return f
    with monkeypatch.context() as m:
        m.setattr(pool, "POOL_RUN_BYTES", 0)
        m.setattr(core, "check_run_rules", spy("alone"))   # a run checked alone (stream.check_run)
        m.setattr(pool, "check_run_rules", spy("alone"))
        C.check_paths([tmp_path / "ds"])
    with monkeypatch.context() as m:
        m.setattr(core, "check_run_rules", spy("pooled"))
        m.setattr(pool, "check_run_rules", spy("pooled"))  # a pooled run's own aggregates
        C.check_paths([tmp_path / "ds"], workers=1)
    assert len(seen["alone"]) == 20
    assert seen["pooled"] == seen["alone"]


def test_listing_findings_keep_their_place(tmp_path, monkeypatch):
    """SA002 (a run copied into a second folder) and SA000 (a bad file) come out where
    listing met them, between the pooled runs' own findings."""
    ds = tmp_path / "ds"
    for i in range(8):
        _tiny(ds, i)
    import shutil
    shutil.copytree(ds / "run_id=t3", ds / "backup" / "run_id=t3")
    (ds / "run_id=t5" / "steps-000000.parquet").write_bytes(b"not parquet")
    alone, pooled, workers = _three_ways(monkeypatch, [ds])
    assert {"SA000", "SA002"} <= set(alone["counts"])
    assert pooled == alone and workers == alone


def test_a_worker_that_dies_has_its_pool_redone(tmp_path, monkeypatch):
    """A worker killed (out of memory, say) loses nothing: its pool is checked here."""
    import os
    for i in range(12):
        _tiny(tmp_path / "ds", i)
    alone = _report(C.check_paths([tmp_path / "ds"], workers=1))
    parent = os.getpid()
    real = pool._pool_task

    def dying(members):
        if os.getpid() != parent and members[0].run_id == "t1":
            os._exit(9)
        return real(members)
    monkeypatch.setattr(pool, "_pool_task", dying)
    monkeypatch.setattr(pool, "POOL_RUNS", 3)
    assert _report(C.check_paths([tmp_path / "ds"], workers=2)) == alone


def test_check_workers_bounds():
    assert pool.check_workers(1) == 1
    assert pool.check_workers(0) == 1
    assert 1 <= pool.check_workers() <= 8


USER_RULE = """
from specaudit.invariants import Hits, Rule

class RunNamed(Rule):
    \"\"\"What: every step of run t3 (a user's rule that reads the run id).

    Why: a user rule may read anything of the frame; pooling must not change its answer.

    Example: run t3.
    \"\"\"
    code = "SA961"
    name = "run-named-t3"
    severity = "warning"
    scope = "step"
    message = "run {run}"

    def check(self, f):
        import numpy as np
        return Hits(np.full(f.R, f.run_id == "t3"), run=f.run_id)
"""


def test_a_user_rule_sees_each_run_as_its_own(tmp_path):
    """With a user rule loaded (it may read the frame's run id), runs are not pooled."""
    from specaudit.invariants import DEFINED
    saved = dict(DEFINED)
    try:
        d = tmp_path / "rules"
        d.mkdir()
        (d / "named.py").write_text(USER_RULE)
        for i in range(6):
            _tiny(tmp_path / "ds", i)
        res = C.check_paths([tmp_path / "ds"], invariants_dirs=[d], workers=1)
        steps_t3 = pq.read_table(tmp_path / "ds" / "run_id=t3" / "steps-000000.parquet").num_rows
        assert steps_t3 and res.counts["SA961"] == steps_t3
        assert {f.run_id for f in res.findings if f.code == "SA961"} == {"t3"}
    finally:
        DEFINED.clear()
        DEFINED.update(saved)


# ------------------------------------------------ reading a task with polars (workers)
#
# Worker processes read a task's files with one polars scan per table (pool_read.read_with_polars);
# the parent and a single-process check read file by file with Arrow (pool_read.read_with_arrow).
# These run the batch reader in a forked child, as a worker does: a test process that
# imported polars would make every later worker fall back to Arrow.

def _in_fork(fn, *args):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(1, mp_context=mp.get_context("fork")) as ex:
        return ex.submit(fn, *args).result()


def _batch_and_files(members):
    return pool_read.read_with_polars(members), [pool_read.read_with_arrow(rf) for rf in members]


def _members(ds):
    from specaudit.trace.schema import discover
    return sorted(discover([ds]), key=lambda rf: int(rf.run_id[1:]) if rf.run_id[1:].isdigit() else -1)


def test_batch_read_gives_the_tables_arrow_reads(tmp_path):
    """Same rows, same types, same per-run row counts as reading each file with Arrow;
    folder names that are glob patterns or hive partitions change nothing."""
    ds = tmp_path / "ds"
    for i in range(9):
        _tiny(ds, i)
    (ds / "run_id=t4").rename(ds / "run_id=t4[*]?")        # a glob would match nothing here
    members = _members(ds)
    batch, files = _in_fork(_batch_and_files, members)
    assert batch is not None, "plain tiny runs are read in one scan"
    idx, steps, st_n, reqs, rq_n = batch
    assert idx == list(range(9))
    assert list(st_n) == [f[0].num_rows for f in files] and list(rq_n) == [f[1].num_rows for f in files]
    assert steps.equals(pa.concat_tables([f[0] for f in files]), check_metadata=False)
    assert reqs.equals(pa.concat_tables([f[1] for f in files]), check_metadata=False)


def _plain_batch(members):
    return pool_read.plain_rows(members, *pool_read.read_with_polars(members))


def test_a_run_holding_another_runs_rows_is_left_out_of_the_pool(tmp_path):
    """A step row of another run (SA108) is never pooled, whichever reader read it: the
    run is checked alone and the finding made there."""
    ds = tmp_path / "ds"
    for i in range(6):
        _tiny(ds, i)
    f = ds / "run_id=t2" / "steps-000000.parquet"
    t = pq.read_table(f)
    ids = t.column("run_id").to_pylist()
    ids[-1] = "t9"
    pq.write_table(t.set_column(t.schema.get_field_index("run_id"), "run_id", pa.array(ids)), f)
    members = _members(ds)
    (arrow,) = [pool_read.plain_rows(members, *read) for read in pool_read.read_task(members, False)]   # Arrow
    batch = _in_fork(_plain_batch, members)
    for idx, steps, st_n, _, _ in (batch, arrow):
        assert idx == [0, 1, 3, 4, 5]
        assert steps.num_rows == sum(st_n)
        assert set(steps.column("run_id").to_pylist()) == {"t0", "t1", "t3", "t4", "t5"}


def test_batch_read_refuses_files_of_another_schema(tmp_path, monkeypatch):
    """A column of another type in one run (here int64 steps): the scan fails, the task
    is read file by file, and the checker's report is the one every run alone gives."""
    ds = tmp_path / "ds"
    for i in range(6):
        _tiny(ds, i)
    f = ds / "run_id=t3" / "steps-000000.parquet"
    t = pq.read_table(f)
    pq.write_table(t.set_column(t.schema.get_field_index("step"), "step", t.column("step").cast(pa.int64())), f)
    batch, files = _in_fork(_batch_and_files, _members(ds))
    assert batch is None and all(x is not None for x in files)
    alone, pooled, workers = _three_ways(monkeypatch, [ds])
    assert alone["exit"] == 0 and len(alone["runs"]) == 6
    assert pooled == alone and workers == alone


def test_the_parent_never_loads_polars(tmp_path):
    """polars is loaded by worker processes only (its threads do not survive a fork:
    a parent that had it could not fork workers safely)."""
    import subprocess
    import sys
    ds = tmp_path / "ds"
    for i in range(8):
        _tiny(ds, i)
    code = ("import sys; from specaudit.audit.check import check_paths, pool; pool.POOL_RUNS = 3; "
            f"r = check_paths([{str(ds)!r}], workers=2); "
            "assert r.exit_code == 0 and len(r.runs) == 8, r.summary(); "
            "print('polars' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def _worker_flag():
    return pool._WORKER.get("polars")


def test_workers_read_with_polars_unless_the_parent_has_it(monkeypatch):
    import sys

    def flag():
        ex = pool._start_workers(1, [], 0, 10)
        try:
            return ex.submit(_worker_flag).result()
        finally:
            ex.shutdown()
    monkeypatch.delitem(sys.modules, "polars", raising=False)
    assert flag() is True
    monkeypatch.setitem(sys.modules, "polars", object())   # as if this process had loaded it
    assert flag() is False
    monkeypatch.delitem(sys.modules, "polars")
    monkeypatch.setattr(pool, "POOL_POLARS", False)
    assert flag() is False
    assert pool._WORKER.get("polars") is None                 # this process never reads with it
