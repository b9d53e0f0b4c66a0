"""Rollups: small summaries of trace data, written beside it, optional to readers.

    rollup-steps.parquet             a run's rollup of all its step files (the Parquet sink, at close)
    rollup-requests.parquet          the same of its requests table
    rollup-steps-000003.parquet      the rollup of one data file, steps-000003.parquet (older writers)

A rollup holds the aggregates the post-mortem views need (one row per request, per
(commit length, depth), per time cell, per draft-probability bin, per run's requests), so
`specaudit query` and `report` answer without decoding the list columns of millions of step
rows. Its rows have TWO definitions, held equal row for row by tests/test_rollup.py:

  KIND_SQL          the SQL (compute_rollup_sql): the reference, and what the views run over
                    the raw step files whenever a rollup is absent, stale or unreadable;
  compute_rollup    Arrow compute and numpy (trace/rollup_writer.py): what writers run (the
                    Parquet sink, synth), the same rows in milliseconds instead of DuckDB's
                    fixed planning cost; and what verify_rollup recomputes a rollup file with.

This module is the definition and the readers' side (the schema, the SQL, file names,
fingerprints, whether a rollup may stand in for its data); trace/rollup_writer.py computes,
writes, verifies and refreshes rollup files.

A change to one is a change to both. A rollup therefore never holds a figure the raw rows
would not give.

Each rollup records its data file's name, row count and size in bytes (Parquet key-value
metadata, key `specaudit.rollup`). A reader uses a rollup only when all three match the
data file on disk and its columns are ROLLUP_SCHEMA's; otherwise it reads the raw file and
says why (the `runs` view's `rollups` column). The fingerprint catches a stale rollup
(a data file rewritten, truncated, replaced), not a forged one: `verify_rollup` recomputes
from the raw rows and compares every value, and `specaudit check` never reads rollups
(it derives everything from the raw rows), so a rollup can never change a verdict.

kind         key columns                   value columns
request      run_id, request_id            n, n_finished, committed, depth_sum, drafted,
                                           rep_commit, rep_depth, step_s, draft_s, verify_s, t0, t1
hist         run_id, commit_len, depth     n, n_finished, rep_commit, n_disagree
time         run_id, cell                  n, committed, depth_sum, rep_commit, rep_depth
calib        run_id, bins, bin             n, accepted, p_sum
outputs      run_id                        n (requests), generated (output tokens)

commit_len = len(committed_tokens) and depth = len(accepted_path) - 1 (derived, never the
counters: trace/derived.py's definition); rep_commit / rep_depth are sums of the counters
commit_len / accepted_depth (reported, the figures under audit); n_disagree counts steps whose commit_len counter
differs from len(committed_tokens). calib: reached draft nodes (see CALIB_SQL) binned by
exp(draft_logprob) into `bins` equal bins; the writer stores bins in CALIB_BINS.
time: the steps whose t_start falls in one cell of the fixed grain TIME_GRAIN_S, cell =
floor(t_start / TIME_GRAIN_S) (NULL when t_start is NULL, NaN, infinite or beyond 1e15 s):
one row per (run, cell), so its size follows the run's duration, not its step count (one row
per distinct t_start was 7.5M rows at 20M steps). throughput_over_time buckets whole cells.
"""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from specaudit.trace.derived import commit_sql, depth_sql

ROLLUP_VERSION = 2            # 2: `time` keyed by grain cell (was: one row per t_start)
META_KEY = b"specaudit.rollup"
PREFIX = "rollup-"
CALIB_BINS = (10,)            # the default bins of acceptance_vs_draft_logprob (the report's)
TIME_GRAIN_S = 0.5            # the `time` kind's cell width in seconds (a power of two: the division
                              # is exact); a run shorter than 60 cells (30 s) gets fewer than 60
                              # throughput_over_time buckets
_CELL_SQL = (f"CASE WHEN isfinite(s.t_start) AND abs(s.t_start) < 1e15 "
             f"THEN floor(s.t_start / {TIME_GRAIN_S!r}::DOUBLE)::BIGINT END")

ROLLUP_SCHEMA = pa.schema([
    ("kind", pa.string()), ("run_id", pa.string()), ("request_id", pa.string()),
    ("commit_len", pa.int32()), ("depth", pa.int32()), ("cell", pa.int64()),
    ("bins", pa.int32()), ("bin", pa.int32()),
    ("n", pa.int64()), ("n_finished", pa.int64()), ("committed", pa.int64()), ("depth_sum", pa.int64()),
    ("drafted", pa.int64()), ("rep_commit", pa.int64()), ("rep_depth", pa.int64()),
    ("n_disagree", pa.int64()), ("step_s", pa.float64()), ("draft_s", pa.float64()),
    ("verify_s", pa.float64()), ("t0", pa.float64()), ("t1", pa.float64()),
    ("accepted", pa.int64()), ("p_sum", pa.float64()), ("generated", pa.int64()),
])
_DUCK = {pa.string(): "VARCHAR", pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.float64(): "DOUBLE"}

# kind -> SQL over {src} (a relation with the steps' or the requests' columns). calib also
# takes {nb}: a SELECT of the column `bins` (one row per bin count).
KIND_SQL = {
    "request": """
SELECT s.run_id, s.request_id, count(*) AS n, count(*) FILTER (WHERE s.finished) AS n_finished,
       sum(COMMIT)::BIGINT AS committed, sum(DEPTH)::BIGINT AS depth_sum,
       sum(len(s.node_tokens) - 1)::BIGINT AS drafted, sum(s.commit_len)::BIGINT AS rep_commit,
       sum(s.accepted_depth)::BIGINT AS rep_depth, sum(s.step_s) AS step_s, sum(s.draft_s) AS draft_s,
       sum(s.verify_s) AS verify_s, min(s.t_start) AS t0, max(s.t_start + s.step_s) AS t1
FROM {src} AS s GROUP BY s.run_id, s.request_id""",
    "hist": """
SELECT s.run_id, COMMIT::INTEGER AS commit_len, DEPTH::INTEGER AS depth,
       count(*) AS n, count(*) FILTER (WHERE s.finished) AS n_finished, sum(s.commit_len)::BIGINT AS rep_commit,
       count(*) FILTER (WHERE s.commit_len IS DISTINCT FROM COMMIT) AS n_disagree
FROM {src} AS s GROUP BY s.run_id, COMMIT, DEPTH""",
    "time": """
SELECT s.run_id, CELL AS cell, count(*) AS n, sum(COMMIT)::BIGINT AS committed,
       sum(DEPTH)::BIGINT AS depth_sum, sum(s.commit_len)::BIGINT AS rep_commit,
       sum(s.accepted_depth)::BIGINT AS rep_depth
FROM {src} AS s GROUP BY 1, 2""".replace("CELL", _CELL_SQL),
    # Reached nodes: drafted nodes whose parent is on the accepted path. Rows with topk 1
    # (chains) use parents[i] = i - 1 and an accepted path that is a prefix, as the
    # contract requires (specaudit check enforces both): accepted nodes 1 .. d and the first
    # rejected draft d + 1; every other row tests each node's parent against its path (a
    # bit set up to 64 nodes, a '0'/'1' string beyond). Streams carry hash(run_id), an
    # integer, and get the run_id back at the end (grouping millions of nodes on a string
    # is slower).
    "calib": """
WITH nb AS ({nb}),
chain_rows AS (
    SELECT hash(run_id) AS h, DEPTH_BARE AS d, draft_logprob
    FROM {src} WHERE topk = 1 AND draft_logprob IS NOT NULL
),
chain_nodes AS (
    SELECT h, unnest(draft_logprob[2 : d + 1]) AS lp, true AS acc FROM chain_rows
    UNION ALL
    SELECT h, draft_logprob[d + 2] AS lp, false AS acc FROM chain_rows WHERE d + 2 <= len(draft_logprob)
),
tree_rows AS (
    SELECT hash(run_id) AS h, draft_logprob, parents, len(parents) AS n,
           CASE WHEN len(parents) <= 64 THEN
               list_aggregate(list_transform(accepted_path, lambda i: CASE WHEN i BETWEEN 0 AND 63
                   THEN (1::UBIGINT << i) ELSE 0::UBIGINT END), 'bit_or') END AS bits,
           CASE WHEN len(parents) > 64 THEN
               list_aggregate(list_transform(range(len(parents)), lambda i:
                   CASE WHEN list_contains(accepted_path, i) THEN '1' ELSE '0' END), 'string_agg', '')
               END AS mask
    FROM {src} WHERE (topk <> 1 OR topk IS NULL) AND draft_logprob IS NOT NULL
),
tree_unnested AS (
    SELECT h, n, bits, mask, unnest(draft_logprob) AS lp, unnest(parents) AS parent, unnest(range(n)) AS node
    FROM tree_rows
),
tree_nodes AS (
    SELECT h, lp, CASE WHEN n <= 64 THEN ((bits >> node) & 1) = 1
                       ELSE substring(mask, node + 1, 1) = '1' END AS acc
    FROM tree_unnested
    WHERE node > 0 AND parent >= 0 AND parent < n
      AND CASE WHEN n <= 64 THEN ((bits >> parent) & 1) = 1 ELSE substring(mask, parent + 1, 1) = '1' END
),
reached AS (
    SELECT h, lp, acc FROM chain_nodes UNION ALL SELECT h, lp, acc FROM tree_nodes
),
binned AS (
    SELECT h, nb.bins::INTEGER AS bins, least(floor(exp(lp) * nb.bins), nb.bins - 1)::INTEGER AS bin,
           count(*) AS n, count(*) FILTER (WHERE acc) AS accepted, sum(exp(lp)) AS p_sum
    FROM reached, nb
    WHERE lp IS NOT NULL AND NOT isnan(lp)
    GROUP BY ALL
),
ids AS (SELECT DISTINCT hash(run_id) AS h, run_id FROM {src})
SELECT ids.run_id, b.bins, b.bin, b.n, b.accepted, b.p_sum FROM binned AS b LEFT JOIN ids USING (h)""",
    "outputs": """
SELECT r.run_id, count(*) AS n, sum(len(r.output_tokens))::BIGINT AS generated
FROM {src} AS r GROUP BY r.run_id""",
}
# the per-step depth and commit of trace/derived.py (one definition for the SQL and the Arrow path)
KIND_SQL = {k: q.replace("DEPTH_BARE", depth_sql(None)).replace("DEPTH", depth_sql("s"))
            .replace("COMMIT", commit_sql("s")) for k, q in KIND_SQL.items()}
STEP_KINDS = ("request", "hist", "time", "calib")
REQUEST_KINDS = ("outputs",)
# the columns each kind fills (the rest are NULL in its rows)
KIND_COLUMNS = {
    "request": ("run_id", "request_id", "n", "n_finished", "committed", "depth_sum", "drafted", "rep_commit",
                "rep_depth", "step_s", "draft_s", "verify_s", "t0", "t1"),
    "hist": ("run_id", "commit_len", "depth", "n", "n_finished", "rep_commit", "n_disagree"),
    "time": ("run_id", "cell", "n", "committed", "depth_sum", "rep_commit", "rep_depth"),
    "calib": ("run_id", "bins", "bin", "n", "accepted", "p_sum"),
    "outputs": ("run_id", "n", "generated"),
}


def rollup_name(data_name: str) -> str:
    """steps-000003.parquet -> rollup-steps-000003.parquet."""
    return PREFIX + data_name


def rollup_path(data_file) -> Path:
    p = Path(data_file)
    return p.with_name(rollup_name(p.name))


def kind_sql(kind: str, src: str, nb: str | None = None) -> str:
    """KIND_SQL[kind] over src, its columns cast to ROLLUP_SCHEMA's types (no kind column)."""
    body = KIND_SQL[kind].format(src=src, nb=nb or calib_bins_sql(CALIB_BINS))
    cols = ", ".join(f"CAST({c} AS {_DUCK[ROLLUP_SCHEMA.field(c).type]}) AS {c}" for c in KIND_COLUMNS[kind])
    return f"SELECT {cols} FROM ({body})"


def calib_bins_sql(bins) -> str:
    return "SELECT unnest([" + ", ".join(str(int(b)) for b in bins) + "]) AS bins"


def _full_sql(kind: str, src: str) -> str:
    cols = ", ".join(c if c in KIND_COLUMNS[kind] else f"NULL::{_DUCK[f.type]} AS {c}"
                     for f in ROLLUP_SCHEMA for c in [f.name] if c != "kind")
    return f"SELECT '{kind}' AS kind, {cols} FROM ({kind_sql(kind, src)})"


def compute_rollup_sql(table: pa.Table, what: str = "steps") -> pa.Table:
    """The rollup rows of one data table by the definition itself: KIND_SQL run in a
    private in-memory DuckDB (one thread, no file access). About 0.1 s of fixed cost
    (planning), so writers use compute_rollup (Arrow compute, the same rows in
    milliseconds); tests and verify_rollup hold the two equal."""
    import duckdb
    kinds = STEP_KINDS if what == "steps" else REQUEST_KINDS
    con = duckdb.connect(":memory:", config={"threads": "1", "enable_external_access": "false",
                                              "autoinstall_known_extensions": "false",
                                              "autoload_known_extensions": "false"})
    try:
        con.register("_src", table)
        sql = " UNION ALL ".join(_full_sql(k, "_src") for k in kinds)
        rel = con.sql(sql)
        out = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
    finally:
        con.close()
    return out.cast(ROLLUP_SCHEMA)


def fingerprint(data_name: str, rows: int, size: int) -> dict:
    return {"version": ROLLUP_VERSION, "source": data_name, "rows": int(rows), "bytes": int(size),
            "time_grain_s": TIME_GRAIN_S}


def rollup_problem(data_file, data_rows: int, rollup_file=None) -> str | None:
    """None when rollup_file (default: beside data_file) may stand in for data_file's rows;
    else why not, in words (absent, unreadable, another version, stale)."""
    data_file = Path(data_file)
    rp = Path(rollup_file) if rollup_file is not None else rollup_path(data_file)
    fp, problem = fingerprint_of(rp)
    if problem:
        return problem
    try:
        size = data_file.stat().st_size
    except OSError as e:
        return f"{data_file.name} cannot be read ({e.strerror or e})"
    want = fingerprint(data_file.name, data_rows, size)
    for k in ("source", "rows", "bytes"):
        if fp.get(k) != want[k]:
            return f"stale: {rp.name} was written for {k} {fp.get(k)!r}, {data_file.name} has {want[k]!r}"
    return None


def fingerprint_of(rp: Path) -> tuple[dict | None, str | None]:
    """(rp's fingerprint, None) when rp is a rollup this reader knows (version, grain,
    columns), else (None, why not)."""
    if not rp.is_file():
        return None, "absent"
    try:
        schema = pq.read_schema(rp)
    except Exception as e:  # not Parquet, truncated
        return None, f"{rp.name} unreadable ({type(e).__name__})"
    raw = (schema.metadata or {}).get(META_KEY)
    try:
        fp = json.loads(raw) if raw else None
    except ValueError:
        fp = None
    if not isinstance(fp, dict):
        return None, f"{rp.name} has no fingerprint"
    if fp.get("version") != ROLLUP_VERSION:
        return None, f"{rp.name} is rollup version {fp.get('version')!r}, this reader knows {ROLLUP_VERSION}"
    for f in ROLLUP_SCHEMA:
        if f.name not in schema.names or schema.field(f.name).type != f.type:
            return None, f"{rp.name} lacks column {f.name} ({f.type})"
    if fp.get("time_grain_s") != TIME_GRAIN_S:
        return None, f"{rp.name} has time cells of {fp.get('time_grain_s')!r} s, this reader uses {TIME_GRAIN_S}"
    return fp, None


# ------------------------------------------------------------ the run's step rollup

RUN_ROLLUP = PREFIX + "steps.parquet"   # one rollup for all of a run's step files, written at close


def run_rollup_covers(run_dir, step_rows: dict) -> tuple[list[str], str | None]:
    """step_rows: the run's step file names -> their row counts. ([the step files that
    run_dir/RUN_ROLLUP stands in for], None) when every source it names is on disk with
    its rows and bytes, else ([], why not) ("absent" when there is none)."""
    rp = Path(run_dir) / RUN_ROLLUP
    fp, problem = fingerprint_of(rp)
    if problem:
        return [], problem
    srcs = fp.get("sources")
    names = [s.get("source") for s in srcs] if isinstance(srcs, list) and all(isinstance(s, dict) for s in srcs) \
        else []
    if not names or len(set(names)) != len(names):
        return [], f"{rp.name} has no list of sources"
    for src in srcs:
        name = src["source"]
        if name not in step_rows:
            return [], f"{rp.name} covers {name}, which is not among the step files read here"
        try:
            size = (Path(run_dir) / name).stat().st_size
        except OSError as e:
            return [], f"{name} cannot be read ({e.strerror or e})"
        if src.get("rows") != step_rows[name] or src.get("bytes") != size:
            return [], (f"stale: {rp.name} was written for {name} with {src.get('rows')!r} rows, "
                        f"{src.get('bytes')!r} bytes; it has {step_rows[name]} rows, {size} bytes")
    return names, None


STEP_COLUMNS = ("run_id", "request_id", "t_start", "step_s", "draft_s", "verify_s", "finished", "commit_len",
                "accepted_depth", "committed_tokens", "accepted_path", "node_tokens", "parents", "draft_logprob",
                "topk")

