"""Trace datasets as DuckDB views, read-only and offline: the connection and what it holds.

    from specaudit.postmortem.canned import canned
    from specaudit.postmortem.sql_guard import fetch_arrow
    con = connect(["traces/"], findings=findings)      # findings: the checker's, optional
    tbl = fetch_arrow(con, "SELECT * FROM steps LIMIT 5")
    tbl = fetch_arrow(con, canned("acceptance_by_depth").sql)

Views (one DuckDB connection, in memory):
    steps       the step rows of every run (the contract's columns, as written)
    requests    the request rows
    runs        one row per run: the manifest flattened (config label, models, reported.*)
    nodes       one row per node of every step: node, depth (from parents), token, parent,
                position, draft_logprob, target_argmax, target_margin, accepted (on the
                accepted path), parent_accepted (reached: its parent is on the path)
    violations  the checker's findings (empty when none were passed in)
    figures     one row per (run, metric) for mean_accepted_depth, mean_commit_len,
                accept_rate and tokens_per_s: `derived` (re-derived from the raw
                tensors: len(accepted_path) - 1, len(committed_tokens), the requests'
                output tokens over the run's clock) beside `reported` (run.json, the
                figure under audit) and `verdict` from specaudit_agrees(reported,
                derived), the one comparison rule (specaudit.audit.compare)

    rollup_*    request, hist, time, calib, outputs: the aggregates of trace/rollup.py
                (one row per request / (commit length, depth) / 0.5 s time cell / draft-
                probability bin / run's requests), from each data file's rollup where its
                fingerprint matches the file, else computed by the same SQL from the raw
                rows (runs.rollups says which); connect(rollups=False) never reads them

Derived beside reported, never instead: every canned query reads commit lengths from
len(committed_tokens) and depths from len(accepted_path) - 1, never from the counters
commit_len / accepted_depth, which appear only in columns named reported_*. The canned
queries, `figures` and the report read the rollup_* views (kept small by the writers'
rollups), so they answer in a fraction of a second on tens of millions of steps.


The parts, one idea per module: sql_guard.py (read-only and offline: the refusals, the
locked connection, the only way a statement runs), dataset.py (which runs and files, which
rollups), tables.py (the runs and violations tables), view_sql.py (the views' SQL),
udfs.py (the Python functions registered in DuckDB), canned.py (the canned queries) and
shell.py (the same views in the duckdb CLI).

Readers never import each other: the command layer runs the checker and passes its
findings in (Finding objects, dicts, or an Arrow table).
"""
from __future__ import annotations

import pyarrow as pa

from specaudit.postmortem.dataset import Dataset, find_dataset
from specaudit.postmortem.sql_guard import check_threads, guarded_connection, lock, one_line
from specaudit.postmortem.tables import config_label, findings_table, runs_table
from specaudit.postmortem.udfs import register_agrees, register_depths
from specaudit.postmortem.view_sql import FIGURES_VIEW_SQL, nodes_view_sql, parquet_view, rollup_views_sql
from specaudit.trace.safe_io import InputError
from specaudit.trace.schema import REQUESTS_SCHEMA, STEPS_SCHEMA

VIEWS = ("steps", "requests", "runs", "nodes", "violations", "figures", "rollup_request", "rollup_hist",
         "rollup_time", "rollup_calib", "rollup_outputs")


def connect_tables(tables: dict, *, threads: int | None = None, variables: dict | None = None):
    """A locked, in-memory DuckDB connection holding only these Arrow tables (engine
    outputs' `windows` and `findings`, specaudit.postmortem.engine_views): the same
    hardening as connect(), with no file on allowed_paths at all."""
    check_threads(threads)
    con = guarded_connection(threads, [])
    try:
        for name, table in tables.items():
            load_table(con, name, table)
        register_agrees(con)
        lock(con, variables)
    except BaseException:
        con.close()
        raise
    return con


def connect(paths, findings=None, *, threads: int | None = None, variables: dict | None = None,
            dataset: Dataset | None = None, rollups: bool = True, extra_tables: dict | None = None):
    """A locked, in-memory DuckDB connection with the views (VIEWS) over the trace at paths.

    findings: the checker's findings (Finding objects, dicts or an Arrow table) for the
    `violations` view; None leaves it empty. variables: {name: value} for getvariable()
    in canned queries (set before the lock). threads: DuckDB worker threads (default: all).
    rollups=False: every figure from the raw rows (rollup files ignored). extra_tables:
    {name: Arrow table} loaded beside the views (engine outputs' windows and findings).
    """
    import duckdb

    check_threads(threads)
    ds = dataset or find_dataset(paths, rollups=rollups)
    con = guarded_connection(threads, ds.files)
    try:
        # from here on DuckDB reads only the trace's own Parquet files
        try:
            con.execute(parquet_view("steps", ds.step_files, STEPS_SCHEMA, ds))
            con.execute(parquet_view("requests", ds.request_files, REQUESTS_SCHEMA, ds))
            for sql in rollup_views_sql(ds, bins=(variables or {}).get("bins", 10)):
                con.execute(sql)
        except duckdb.Error as e:
            raise InputError(None, f"cannot read the trace's Parquet files: {one_line(e)}") from None
        load_table(con, "runs", runs_table(ds.runs, ds.rollup_notes))
        load_table(con, "violations", findings_table(findings))
        register_depths(con)
        register_agrees(con)
        con.execute(nodes_view_sql())
        con.execute(FIGURES_VIEW_SQL)
        for name, table in (extra_tables or {}).items():
            load_table(con, name, table)
        # runs without a manifest: name their config from the step rows
        if any(rf.manifest is None or not config_label(rf.manifest.get("config") or {}) for rf in ds.runs):
            con.execute("""UPDATE runs SET config = s.cfg, algo = s.algo, budget = s.budget, topk = s.topk
                           FROM (SELECT run_id, any_value(algo) AS algo, any_value(budget) AS budget,
                                        any_value(topk) AS topk,
                                        any_value(algo || ' b' || budget || ' k' || topk) AS cfg
                                 FROM steps WHERE run_id IN (SELECT run_id FROM runs WHERE config IS NULL)
                                 GROUP BY run_id) s
                           WHERE runs.run_id = s.run_id AND runs.config IS NULL""")
        lock(con, variables)
    except BaseException:
        con.close()
        raise
    return con


def load_table(con, name: str, table: pa.Table) -> None:
    """Copy a small Arrow table into an in-memory DuckDB table (no Python scan stays registered)."""
    tmp = f"_specaudit_{name}"
    con.register(tmp, table)
    try:
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM {tmp}")
    finally:
        con.unregister(tmp)
