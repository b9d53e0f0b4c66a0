"""Rollups (specaudit/trace/rollup.py) and the requests table in parts.

A rollup must give exactly what the raw rows give: the writers' Arrow/numpy code equals
the SQL definition (also on rows that break the contract), the views answer the same with
and without rollups, a stale rollup is ignored with a note, a forged one is caught by
verify_rollup, and `specaudit check` never reads them. The Parquet sink appends finished
requests as parts (a killed run keeps them), merges them at close, and every reader
counts each request once."""
from __future__ import annotations

import math
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specaudit.audit.check import check_paths
from specaudit.postmortem.canned import canned, canned_queries
from specaudit.postmortem.sql_guard import fetch_arrow
from specaudit.postmortem.views import connect
from specaudit.trace import rollup as R
from specaudit.trace.parquet import ParquetSink
from specaudit.trace.synth import synth_run_rows, write_run, write_synthetic_dataset

KEYS = ("kind", "run_id", "request_id", "commit_len", "depth", "cell", "bins", "bin")


def _rows(t: pa.Table) -> dict:
    return {tuple(r[k] for k in KEYS): r for r in t.to_pylist()}


def _close(a, b, where=""):
    if isinstance(a, float) and isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (where, a, b)
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), (where, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def _same_rollup(a: pa.Table, b: pa.Table):
    A, B = _rows(a), _rows(b)
    assert set(A) == set(B), sorted(set(A) ^ set(B), key=repr)[:5]
    for k in A:
        _close(A[k], B[k], str(k))


def _broken(steps: pa.Table) -> pa.Table:
    """Rows that break the contract in the ways the calibration and length SQL treats
    specially: NULL lists and entries, an empty path, a chain whose path is no prefix,
    a NaN draft log-prob, topk NULL, a draft_logprob shorter than parents, 70 nodes."""
    rows = steps.slice(0, 12).to_pylist()
    rows[0]["accepted_path"] = None
    rows[1]["accepted_path"] = []
    rows[2]["committed_tokens"] = None
    rows[3]["draft_logprob"] = [0.0, float("nan")] + rows[3]["draft_logprob"][2:]
    rows[4]["accepted_path"] = [0, 2, 3]                   # a chain path that skips node 1
    rows[5]["topk"] = None
    rows[6]["draft_logprob"] = rows[6]["draft_logprob"][:2]
    rows[7]["parents"] = [-1] + [None] * (len(rows[7]["parents"]) - 1)
    rows[8]["commit_len"] = None
    rows[9]["accepted_path"] = [0, None, 1]
    n = 70                                                 # wider than the 64-bit path set
    rows[10].update(topk=2, node_tokens=list(range(n)), parents=[-1] + [(i - 1) // 2 for i in range(1, n)],
                    draft_logprob=[-0.1 * (i % 9) for i in range(n)], accepted_path=[0, 2, 5, 12, 26, 54],
                    positions=list(range(n)), target_argmax=list(range(n)), target_margin=[0.5] * n)
    rows[11]["draft_logprob"] = None
    return pa.Table.from_pylist(rows, schema=steps.schema)


@pytest.mark.parametrize("algo,kw", [("chain", {}), ("tree", {"topk": 3, "budget": 12}),
                                     ("tree", {"topk": 2, "budget": 7, "ragged": True})])
def test_writer_rows_equal_the_sql_definition(algo, kw):
    steps, reqs, _ = synth_run_rows(60, algo=algo, seed=5, **kw)
    _same_rollup(R.compute_rollup(steps), R.compute_rollup_sql(steps))
    _same_rollup(R.compute_rollup(reqs, "requests"), R.compute_rollup_sql(reqs, "requests"))
    bad = _broken(steps)
    _same_rollup(R.compute_rollup(bad), R.compute_rollup_sql(bad))
    # two runs in one table, and an empty table
    two = pa.concat_tables([steps, synth_run_rows(5, algo=algo, seed=6, run_id="other", **kw)[0]])
    _same_rollup(R.compute_rollup(two), R.compute_rollup_sql(two))
    _same_rollup(R.compute_rollup(steps.slice(0, 0)), R.compute_rollup_sql(steps.slice(0, 0)))


def test_rollup_counts_are_the_rows_counts():
    steps, reqs, _ = synth_run_rows(30, algo="tree", seed=2)
    t = R.compute_rollup(steps)
    by = {k: t.filter(pa.compute.equal(t["kind"], k)) for k in R.STEP_KINDS}
    n = steps.num_rows
    for k in ("request", "hist", "time"):
        assert pa.compute.sum(by[k]["n"]).as_py() == n
    clen = pa.compute.list_value_length(steps["committed_tokens"])
    assert pa.compute.sum(by["request"]["committed"]).as_py() == pa.compute.sum(clen).as_py()
    assert by["request"].num_rows == len(set(steps["request_id"].to_pylist()))


def _dataset(tmp_path, rollups: bool):
    root = tmp_path / ("with" if rollups else "without")
    for i, (algo, kw) in enumerate((("chain", {}), ("tree", {"topk": 3, "budget": 12}))):
        s, r, m = synth_run_rows(40, algo=algo, seed=i, run_id=f"r{i}", **kw)
        write_run(root, s, r, m, n_files=3, rollups=rollups)
    return root


def _answers(path, only=None, **kw):
    con = connect([path], variables=kw.pop("variables", None), **kw)
    try:
        out = {n: fetch_arrow(con, q.sql).to_pylist() for n, q in canned_queries().items()
               if only is None or n in only}
        if only is None:
            out["figures"] = fetch_arrow(con, "SELECT * FROM figures ORDER BY run_id, i").to_pylist()
        notes = {r["run_id"]: r["rollups"] for r in fetch_arrow(con, "SELECT run_id, rollups FROM runs").to_pylist()}
    finally:
        con.close()
    return out, notes


def test_views_answer_the_same_with_and_without_rollups(tmp_path):
    with_, without = _dataset(tmp_path, True), _dataset(tmp_path, False)
    a, notes_a = _answers(with_)
    b, notes_b = _answers(without)
    c, notes_c = _answers(with_, rollups=False)
    assert set(notes_a.values()) == {"rollups for 4 of 4 files"}
    assert set(notes_b.values()) == {"no rollups: raw rows"}
    assert set(notes_c.values()) == {"raw rows (rollups not used)"}
    _close(a, b, "with vs without")
    _close(a, c, "with vs rollups=False")
    assert a["acceptance_by_depth"] and a["throughput_over_time"] and len(a["figures"]) == 8
    # bins the writers did not store come from the raw rows
    d, _ = _answers(with_, only={"acceptance_vs_draft_logprob"}, variables={"bins": 20})
    e, _ = _answers(without, only={"acceptance_vs_draft_logprob"}, variables={"bins": 20})
    _close(d["acceptance_vs_draft_logprob"], e["acceptance_vs_draft_logprob"], "bins=20")
    assert max(r["bin"] for r in d["acceptance_vs_draft_logprob"]) > 9


def test_a_stale_rollup_is_ignored_with_a_note_and_a_forged_one_is_caught(tmp_path):
    ds = _dataset(tmp_path, True)
    run = ds / "run_id=r0"
    want, _ = _answers(ds, only={"latency_breakdown"})
    # the step file rewritten with one row fewer: its rollup no longer matches
    f = run / "steps-000001.parquet"
    t = pq.read_table(f)
    pq.write_table(t.slice(1), f, compression="zstd")
    got, notes = _answers(ds, only={"latency_breakdown"})
    assert "stale: rollup-steps-000001.parquet" in notes["r0"] and "rollups for 3 of 4 files" in notes["r0"]
    assert notes["r1"] == "rollups for 4 of 4 files"
    assert got["latency_breakdown"][0]["steps"] == want["latency_breakdown"][0]["steps"] - 1
    assert R.rollup_problem(f, t.num_rows - 1).startswith("stale")
    # a forged rollup (values changed, fingerprint kept): the views cannot tell, verify can
    g = run / "steps-000002.parquet"
    assert R.verify_rollup(g) == []
    rp = R.rollup_path(g)
    meta = pq.read_schema(rp).metadata
    rt = pq.read_table(rp)
    n = rt["n"].to_numpy(zero_copy_only=False).copy()
    n[0] += 5
    pq.write_table(rt.set_column(rt.schema.get_field_index("n"), "n", pa.array(n)).replace_schema_metadata(meta), rp)
    assert R.rollup_problem(g, pq.read_metadata(g).num_rows) is None
    diffs = R.verify_rollup(g)
    assert diffs and "n is" in diffs[0]
    # time cells of another grain (a rollup from before a grain change): ignored
    other = {R.META_KEY: meta[R.META_KEY].replace(b'"time_grain_s": 0.5', b'"time_grain_s": 0.1')}
    assert other[R.META_KEY] != meta[R.META_KEY]
    pq.write_table(rt.replace_schema_metadata(other), rp)
    assert "time cells of 0.1 s" in R.rollup_problem(g, pq.read_metadata(g).num_rows)
    # no fingerprint / unreadable: ignored with the reason
    pq.write_table(rt.replace_schema_metadata({}), rp)
    assert "no fingerprint" in R.rollup_problem(g, pq.read_metadata(g).num_rows)
    rp.write_bytes(b"not parquet")
    assert "unreadable" in R.rollup_problem(g, pq.read_metadata(g).num_rows)


def test_check_never_reads_rollups(tmp_path):
    ds = _dataset(tmp_path, True)
    clean = check_paths([ds])
    assert clean.exit_code == 0 and not clean.findings
    # garbage where a rollup should be changes nothing the checker says
    for rp in ds.rglob("rollup-*.parquet"):
        rp.write_bytes(b"garbage")
    again = check_paths([ds])
    assert again.exit_code == 0 and not again.findings and not again.bad_files


def test_synth_writes_the_sinks_rollups(tmp_path):
    run = write_synthetic_dataset(tmp_path, 3000, n_nodes=8, chunk_steps=1000, seed=1)
    steps = sorted(run.glob("steps-*.parquet"))
    assert len(steps) >= 3
    # the sink's layout: one rollup for the step files (written at the end), one for requests
    rows = {f.name: pq.read_metadata(f).num_rows for f in steps}
    assert R.run_rollup_covers(run, rows) == ([f.name for f in steps], None)
    assert R.verify_run_rollup(run) == []
    assert not [f for f in steps if R.rollup_path(f).exists()]
    f = run / "requests.parquet"
    assert R.rollup_problem(f, pq.read_metadata(f).num_rows) is None
    assert R.verify_rollup(f) == []
    off = write_synthetic_dataset(tmp_path / "off", 1000, n_nodes=8, seed=1, rollups=False)
    assert not list(off.glob("rollup-*"))


# ----------------------------------------------------------------- requests in parts


def _sink_run(tmp_path, n_flushes=3, close=True):
    steps, reqs, manifest = synth_run_rows(12, algo="chain", seed=3, run_id="parts", concurrency=2)
    sink = ParquetSink(tmp_path / "ds", "parts", flush_steps=10**9, flush_s=10**9)
    sink.open_run({k: v for k, v in manifest.items() if k != "finished_at"})
    req_rows = reqs.to_pylist()
    by_req = {r: [] for r in reqs["request_id"].to_pylist()}
    for i, rid in enumerate(steps["request_id"].to_pylist()):
        by_req[rid].append(i)
    chunks = np.array_split(np.arange(len(req_rows)), n_flushes)
    sizes = []
    for c in chunks:
        idx = [i for j in c for i in by_req[req_rows[j]["request_id"]]]
        sink.write_steps(steps.take(idx).to_batches()[0])
        for j in c:
            sink.write_request(req_rows[j])
        sink.flush(force=True)
        sizes.append({p.name: p.stat().st_mtime_ns for p in sink.run_dir.glob("requests-*.parquet")})
    if close:
        sink.close_run(manifest)
    return sink, steps, reqs, sizes


def test_requests_are_appended_as_parts_never_rewritten(tmp_path):
    sink, steps, reqs, seen = _sink_run(tmp_path, close=False)
    run = sink.run_dir
    parts = sorted(run.glob("requests-*.parquet"))
    assert [p.name for p in parts] == [f"requests-{i:06d}.parquet" for i in range(3)]
    for a, b in zip(seen, seen[1:]):                       # a flush leaves earlier parts untouched
        assert all(b[k] == v for k, v in a.items())
    assert not (run / "requests.parquet").exists()         # as after SIGKILL: no close
    got = pa.concat_tables([pq.read_table(p) for p in parts])
    assert sorted(got["request_id"].to_pylist()) == sorted(reqs["request_id"].to_pylist())
    # killed before close: no rollup at all (a flush writes none), the views read the rows
    assert not list(run.glob("rollup-*"))
    # every reader takes the parts: check (incomplete, nothing unreadable), the views
    res = check_paths([run])
    assert res.counts["SA001"] == 1 and not res.bad_files and res.requests == reqs.num_rows
    con = connect([run])
    n_req = fetch_arrow(con, "SELECT count(*) AS n FROM requests").column(0)[0].as_py()
    figs = fetch_arrow(con, "SELECT sum(n)::BIGINT AS n FROM rollup_outputs").column(0)[0].as_py()
    con.close()
    assert n_req == figs == reqs.num_rows


def test_close_merges_the_parts_and_a_crash_after_the_merge_counts_once(tmp_path):
    sink, steps, reqs, _ = _sink_run(tmp_path)
    run = sink.run_dir
    assert not list(run.glob("requests-*")) and not list(run.glob("rollup-requests-0*"))
    merged = pq.read_table(run / "requests.parquet")
    assert sorted(merged["request_id"].to_pylist()) == sorted(reqs["request_id"].to_pylist())
    assert R.verify_rollup(run / "requests.parquet") == []
    res = check_paths([run])
    assert res.exit_code == 0 and not res.findings and res.requests == reqs.num_rows
    # killed between the merge and the removal of the parts: both on disk, counted once
    shutil.copy(run / "requests.parquet", run / "requests-000000.parquet")
    res = check_paths([run])
    assert res.exit_code == 0 and res.requests == reqs.num_rows
    con = connect([run])
    assert fetch_arrow(con, "SELECT count(*) FROM requests").column(0)[0].as_py() == reqs.num_rows
    con.close()


def test_sink_without_rollups_and_a_failing_rollup_keep_the_record(tmp_path, monkeypatch):
    from specaudit.trace import parquet as P
    def boom(*a, **k):
        raise ValueError("boom")
    monkeypatch.setattr(R, "compute_rollup", boom)
    monkeypatch.setattr(R, "_steps_partials", boom)
    sink, steps, reqs, _ = _sink_run(tmp_path)
    assert list(sink.run_dir.glob("steps-*.parquet")) and not list(sink.run_dir.glob("rollup-*"))
    assert check_paths([sink.run_dir]).exit_code == 0
    assert P.write_with_rollup(tmp_path / "x.parquet", steps, rollups=False) is False


def test_spark_plans_every_request_part_before_the_steps_and_combines_them(tmp_path):
    from specaudit.audit.check import CheckResult
    from specaudit.audit.spark import combine_run, file_tasks
    from specaudit.trace.schema import discover
    sink, steps, reqs, _ = _sink_run(tmp_path)              # a finished run whose table is in parts
    whole = sink.run_dir / "requests.parquet"
    t = pq.read_table(whole)
    for i, part in enumerate((t.slice(0, 5), t.slice(5))):
        pq.write_table(part, sink.run_dir / f"requests-{i:06d}.parquet")
    whole.unlink()
    (rf,) = discover([sink.run_dir])
    tasks = file_tasks([(0, rf)])
    req = [t for t in tasks if t["kind"] == "requests"]
    assert [t["path"].rsplit("/", 1)[-1] for t in req] == ["requests-000000.parquet", "requests-000001.parquet"]
    assert [t["file_idx"] for t in req] == [-1, 0]
    assert min(t["file_idx"] for t in tasks if t["kind"] == "steps") == 1

    def combined(bad: int | None):
        st = [{"kind": "requests", "file": t["path"], "ok": i != bad, "opened": True,
               "reason": "bad" if i == bad else None} for i, t in enumerate(req)]
        res = CheckResult()
        return combine_run(rf, 0, st, [], [], res), res
    ok, res = combined(None)
    assert ok and not res.bad_files                          # every part read: complete
    ok, res = combined(0)
    assert not ok and len(res.bad_files) == 1                # the first part unreadable: partial


@pytest.mark.parametrize("buckets", [7, 60])
def test_time_rollup_has_a_fixed_grain_and_over_time_buckets_whole_cells(tmp_path, buckets):
    """The time kind holds one row per (run, TIME_GRAIN_S cell), not per distinct t_start, and
    throughput_over_time puts every cell in one bucket: the same sums numpy gives from the raw
    t_start, with and without rollups."""
    steps, reqs, man = synth_run_rows(40, algo="chain", seed=3, concurrency=2)
    t = steps["t_start"].to_numpy()
    cells = np.floor(t / R.TIME_GRAIN_S).astype(np.int64)
    roll = R.compute_rollup(steps)
    tim = roll.filter(pa.compute.equal(roll["kind"], "time"))
    assert tim.num_rows == len(np.unique(cells)) < len(np.unique(t))
    assert sorted(tim["cell"].to_pylist()) == sorted(np.unique(cells).tolist())
    root = tmp_path / "ds"
    write_run(root, steps, reqs, man, n_files=3, rollups=True)
    m = (cells.max() - cells.min()) // buckets + 1
    bucket = (cells - cells.min()) // m
    clen = np.array([len(x) for x in steps["committed_tokens"].to_pylist()])
    want = {int(b): (int((bucket == b).sum()), int(clen[bucket == b].sum())) for b in np.unique(bucket)}
    for rollups in (True, False):
        con = connect([root], variables={"buckets": buckets}, rollups=rollups)
        try:
            rows = fetch_arrow(con, canned("throughput_over_time").sql).to_pylist()
        finally:
            con.close()
        assert {r["bucket"]: (r["steps"], r["committed_tokens"]) for r in rows} == want
        assert len(rows) <= buckets
        for r in rows:
            assert r["bucket_s"] == pytest.approx(m * R.TIME_GRAIN_S)
            assert r["tokens_per_s"] == pytest.approx(r["committed_tokens"] / (m * R.TIME_GRAIN_S))


def test_time_cell_is_null_for_a_missing_or_non_finite_start():
    steps, _, _ = synth_run_rows(4, algo="chain", seed=1)
    t = steps["t_start"].to_pylist()
    t[0], t[1], t[2], t[3] = None, float("inf"), 2e15, float("nan")
    bad = steps.set_column(steps.schema.get_field_index("t_start"), "t_start", pa.array(t, pa.float64()))
    assert R.time_cells(bad["t_start"]).to_pylist()[:4] == [None, None, None, None]
    # (NaN left out of the full comparison: request t0/t1 min/max treat NaN differently in
    # Arrow and DuckDB, a difference that predates the time grain)
    bad = pa.concat_tables([bad.slice(0, 3), bad.slice(4)])
    _same_rollup(R.compute_rollup(bad), R.compute_rollup_sql(bad))


def test_sink_writes_one_step_rollup_at_close_and_the_views_agree(tmp_path, monkeypatch):
    """No rollup file per flush; at close one rollup-steps.parquet naming every step file,
    equal to the rows' own rollup; the views answer the same from it and from the raw rows;
    rows digested in batches (DIGEST_ROWS) and partial sums merged early (COMPACT_EVERY)
    change nothing."""
    monkeypatch.setattr(R, "COMPACT_EVERY", 2)
    monkeypatch.setattr(R, "DIGEST_ROWS", 40)
    sink, steps, reqs, _ = _sink_run(tmp_path, n_flushes=5)
    run = sink.run_dir
    files = sorted(run.glob("steps-*.parquet"))
    assert len(files) == 5 and sorted(p.name for p in run.glob("rollup-*")) == [
        "rollup-requests.parquet", "rollup-steps.parquet"]
    covered, problem = R.run_rollup_covers(run, {f.name: pq.read_metadata(f).num_rows for f in files})
    assert problem is None and covered == [f.name for f in files]
    assert R.verify_run_rollup(run) == []
    whole = R.compute_rollup(pa.concat_tables([pq.read_table(f) for f in files]))
    _same_rollup(pq.read_table(run / R.RUN_ROLLUP).select(R.ROLLUP_SCHEMA.names), whole)
    a, notes = _answers(run)
    b, _ = _answers(run, rollups=False)
    assert notes == {"parts": "rollups for 6 of 6 files"}
    _close(a, b, "run rollup vs raw rows")
    # a step file rewritten after close: the run rollup is stale, ignored with a note
    t = pq.read_table(files[1])
    pq.write_table(t.slice(1), files[1], compression="zstd")
    c, notes = _answers(run, only={"latency_breakdown"})
    assert "rollup-steps.parquet: stale" in notes["parts"] and "rollups for 1 of 6 files" in notes["parts"]
    assert c["latency_breakdown"][0]["steps"] == a["latency_breakdown"][0]["steps"] - 1


def test_a_killed_sink_leaves_steps_that_check_clean_and_no_rollup(tmp_path):
    sink, steps, reqs, _ = _sink_run(tmp_path, close=False)
    run = sink.run_dir
    assert not (run / R.RUN_ROLLUP).exists()
    res = check_paths([run])
    assert set(res.counts) == {"SA001"} and not res.bad_files and res.steps == steps.num_rows
    a, notes = _answers(run, only={"latency_breakdown"})
    assert notes == {"parts": "no rollups: raw rows"} and a["latency_breakdown"][0]["steps"] == steps.num_rows
