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
  compute_rollup    Arrow compute and numpy: what writers run (the Parquet sink, synth), the
                    same rows in milliseconds instead of DuckDB's fixed planning cost; and
                    what verify_rollup recomputes a rollup file with.

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
counters: trace/derived.py's definition, its SQL and Arrow forms); rep_commit / rep_depth are sums of the counters commit_len / accepted_depth
(reported, the figures under audit); n_disagree counts steps whose commit_len counter
differs from len(committed_tokens). calib: reached draft nodes (see CALIB_SQL) binned by
exp(draft_logprob) into `bins` equal bins; the writer stores bins in CALIB_BINS.
time: the steps whose t_start falls in one cell of the fixed grain TIME_GRAIN_S, cell =
floor(t_start / TIME_GRAIN_S) (NULL when t_start is NULL, NaN, infinite or beyond 1e15 s):
one row per (run, cell), so its size follows the run's duration, not its step count (one row
per distinct t_start was 7.5M rows at 20M steps). throughput_over_time buckets whole cells.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from specaudit.trace.derived import commit_sql, depth_sql, step_commit, step_depth
from specaudit.trace.schema import atomic_write_bytes

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


def _lens(col) -> pa.Array:
    import pyarrow.compute as pc
    return pc.list_value_length(col).cast(pa.int64())


def _group(table: pa.Table, keys: list[str], aggs: list) -> pa.Table:
    """GROUP BY keys (NULL is a key like any other), pyarrow's hash aggregation."""
    return table.group_by(keys, use_threads=False).aggregate(aggs)


def _kind_table(kind: str, t: pa.Table, rename: dict) -> pa.Table:
    """t's columns renamed to ROLLUP_SCHEMA's, the kind's missing columns as NULL."""
    t = t.rename_columns([rename.get(c, c) for c in t.column_names])
    n = t.num_rows
    import numpy as np
    k = kind.encode()
    cols = {"kind": pa.StringArray.from_buffers(n, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * len(k)),
                                                pa.py_buffer(k * n))}
    for f in ROLLUP_SCHEMA:
        if f.name == "kind":
            continue
        cols[f.name] = t[f.name].cast(f.type) if f.name in t.column_names else pa.nulls(n, f.type)
    return pa.table(cols, schema=ROLLUP_SCHEMA)


def time_cells(t_start) -> pa.Array:
    """floor(t_start / TIME_GRAIN_S) as int64, NULL where _CELL_SQL gives NULL (the same
    IEEE division and floor as DuckDB's, so both give the same cell)."""
    import numpy as np
    import pyarrow.compute as pc
    t = pc.fill_null(t_start.cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(t) & (np.abs(t) < 1e15)
        cell = np.floor(np.where(ok, t, 0.0) / TIME_GRAIN_S).astype(np.int64)
    return pa.array(cell, pa.int64(), mask=~ok)


def _steps_partials(t: pa.Table) -> dict:
    """kind -> the kind's rows of one step table, narrow (only KIND_COLUMNS[kind], no `kind`
    column): the per-flush work; _merge_partials sums any number of them."""
    import pyarrow.compute as pc
    count_all = pc.CountOptions(mode="all")
    clen, dlen = step_commit(t["committed_tokens"]), step_depth(t["accepted_path"])   # trace/derived.py
    rep_commit = t["commit_len"].cast(pa.int64())
    fin = pc.fill_null(t["finished"], False).cast(pa.int64())
    # IS DISTINCT FROM: one side NULL, or both set and different
    a_null, b_null = pc.is_null(rep_commit), pc.is_null(clen)
    disagree = pc.or_(pc.xor(a_null, b_null), pc.fill_null(pc.not_equal(rep_commit, clen), False))
    w = pa.table({
        "run_id": t["run_id"], "request_id": t["request_id"], "t_start": t["t_start"],
        "clen": clen, "dlen": dlen, "drafted": pc.subtract(_lens(t["node_tokens"]), 1),
        "rep_commit": rep_commit, "rep_depth": t["accepted_depth"].cast(pa.int64()), "fin": fin,
        "dis": disagree.cast(pa.int64()), "step_s": t["step_s"], "draft_s": t["draft_s"],
        "verify_s": t["verify_s"], "t1": pc.add(t["t_start"], t["step_s"]), "cell": time_cells(t["t_start"]),
    })

    def named(g: pa.Table, rename: dict) -> pa.Table:
        return g.rename_columns([rename.get(c, c) for c in g.column_names])
    req = named(_group(w, ["run_id", "request_id"], [
        ("fin", "count", count_all), ("fin", "sum"), ("clen", "sum"), ("dlen", "sum"), ("drafted", "sum"),
        ("rep_commit", "sum"), ("rep_depth", "sum"), ("step_s", "sum"), ("draft_s", "sum"),
        ("verify_s", "sum"), ("t_start", "min"), ("t1", "max")]), {
        "fin_count": "n", "fin_sum": "n_finished", "clen_sum": "committed", "dlen_sum": "depth_sum",
        "drafted_sum": "drafted", "rep_commit_sum": "rep_commit", "rep_depth_sum": "rep_depth",
        "step_s_sum": "step_s", "draft_s_sum": "draft_s", "verify_s_sum": "verify_s", "t_start_min": "t0",
        "t1_max": "t1"})
    hist = named(_group(w, ["run_id", "clen", "dlen"], [
        ("fin", "count", count_all), ("fin", "sum"), ("rep_commit", "sum"), ("dis", "sum")]),
        {"clen": "commit_len", "dlen": "depth", "fin_count": "n", "fin_sum": "n_finished",
         "rep_commit_sum": "rep_commit", "dis_sum": "n_disagree"})
    tim = named(_group(w, ["run_id", "cell"], [
        ("fin", "count", count_all), ("clen", "sum"), ("dlen", "sum"), ("rep_commit", "sum"),
        ("rep_depth", "sum")]), {"fin_count": "n", "clen_sum": "committed", "dlen_sum": "depth_sum",
                                 "rep_commit_sum": "rep_commit", "rep_depth_sum": "rep_depth"})
    return {"request": req, "hist": hist, "time": tim, "calib": _calib_rollup(t)}


# kind -> (key columns, value columns merged by min / max; the rest by sum): partial rows of
# the same key (one request's steps in two flushes) add up to what one GROUP BY would give
# (sum and min/max skip NULLs, all-NULL stays NULL, as in SQL)
MERGE_KEYS = {"request": ("run_id", "request_id"), "hist": ("run_id", "commit_len", "depth"),
              "time": ("run_id", "cell"), "calib": ("run_id", "bins", "bin")}
MERGE_MIN, MERGE_MAX = {"t0"}, {"t1"}


def _merge_partials(parts: list) -> dict:
    """Many _steps_partials results -> one (same keys summed; min t0, max t1)."""
    if len(parts) == 1:
        return parts[0]
    out = {}
    for kind, keys in MERGE_KEYS.items():
        t = pa.concat_tables([p[kind].cast(parts[0][kind].schema) for p in parts])
        vals = [c for c in KIND_COLUMNS[kind] if c not in keys]
        aggs = [(c, "min" if c in MERGE_MIN else "max" if c in MERGE_MAX else "sum") for c in vals]
        g = _group(t, list(keys), aggs)
        out[kind] = g.rename_columns([c.rsplit("_", 1)[0] if c.endswith(("_sum", "_min", "_max")) else c
                                      for c in g.column_names])
    return out


def _partials_table(p: dict) -> pa.Table:
    """One merged partial -> the rollup rows (ROLLUP_SCHEMA), kinds in STEP_KINDS order."""
    return pa.concat_tables([_kind_table(k, p[k], {}) for k in STEP_KINDS])


def _steps_rollup(t: pa.Table) -> list[pa.Table]:
    p = _steps_partials(t)
    return [_kind_table(k, p[k], {}) for k in STEP_KINDS]


def _calib_rollup(t: pa.Table, bins_list=CALIB_BINS) -> pa.Table:
    """KIND_SQL["calib"] in numpy: reached draft nodes per (run, bin)."""
    import numpy as np
    import pyarrow.compute as pc

    def flat(col):
        """(values as float64/int64 with NaN/-1 for NULL, row offsets [B+1], row is-null)"""
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        lens = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        offs = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=offs[1:])
        vals = pc.list_flatten(arr)   # drops the values of NULL lists (their length is 0 here)
        return vals, offs, pc.is_null(arr).to_numpy(zero_copy_only=False)

    B = t.num_rows
    run = t["run_id"].combine_chunks()
    run_codes = pc.dictionary_encode(run) if B else run
    lp_v, lp_o, lp_null = flat(t["draft_logprob"])
    lp = pc.fill_null(lp_v.cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)
    ap_v, ap_o, ap_null = flat(t["accepted_path"])
    ap = pc.fill_null(ap_v.cast(pa.int64()), -1).to_numpy(zero_copy_only=False)
    pa_v, pa_o, pa_null = flat(t["parents"])
    par = pc.fill_null(pa_v.cast(pa.int64()), -2).to_numpy(zero_copy_only=False)   # -2: NULL entry
    topk = pc.fill_null(t["topk"].cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)  # NULL: a tree
    lp_len, ap_len, pa_len = np.diff(lp_o), np.diff(ap_o), np.diff(pa_o)
    is_chain = (topk == 1) & ~lp_null
    is_tree = ~(topk == 1) & ~lp_null
    idx_rows, idx_lp, idx_acc = [], [], []
    # chains: d = len(accepted_path) - 1 (NULL path: no node); accepted 1..d, rejected d + 1
    rows = np.nonzero(is_chain & ~ap_null)[0]
    if len(rows):
        d = ap_len[rows] - 1
        hi = np.minimum(d, lp_len[rows] - 1)              # accepted nodes 1 .. min(d, len - 1)
        cnt = np.maximum(hi, 0)
        r_rep = np.repeat(rows, cnt)
        start = np.repeat(np.cumsum(cnt) - cnt, cnt)
        node = np.arange(len(r_rep)) - start + 1
        idx_rows.append(r_rep)
        idx_lp.append(lp_o[r_rep] + node)
        idx_acc.append(np.ones(len(r_rep), bool))
        rej = rows[d + 2 <= lp_len[rows]]
        idx_rows.append(rej)
        idx_lp.append(lp_o[rej] + ap_len[rej])                # 0-based node d + 1
        idx_acc.append(np.zeros(len(rej), bool))
    # trees: node i > 0 (i < len(parents) and i < len(draft_logprob)) whose parent is on the path
    rows = np.nonzero(is_tree & ~pa_null & ~ap_null)[0]
    if len(rows):
        m = np.minimum(pa_len[rows], lp_len[rows])
        cnt = np.maximum(m - 1, 0)
        r_rep = np.repeat(rows, cnt)
        start = np.repeat(np.cumsum(cnt) - cnt, cnt)
        node = np.arange(len(r_rep)) - start + 1
        parent = par[pa_o[r_rep] + node]
        n_row = pa_len[r_rep]
        ok = (parent >= 0) & (parent < n_row)
        # path membership marked in place: on[pa_o[row] + x] for every x < len(parents) on
        # the row's accepted path (no [B, N] matrix, no sort)
        on = np.zeros(len(par) + 1, bool)
        ap_row = np.repeat(np.arange(B, dtype=np.int64), ap_len)
        good = (ap >= 0) & (ap < pa_len[ap_row]) & is_tree[ap_row]
        on[pa_o[ap_row[good]] + ap[good]] = True
        base = pa_o[r_rep]
        par_on = np.zeros(len(r_rep), bool)
        par_on[ok] = on[base[ok] + parent[ok]]
        keep = ok & par_on
        idx_rows.append(r_rep[keep])
        idx_lp.append(lp_o[r_rep[keep]] + node[keep])
        idx_acc.append(on[base[keep] + node[keep]])
    r_all = np.concatenate(idx_rows) if idx_rows else np.zeros(0, np.int64)
    v = lp[np.concatenate(idx_lp)] if idx_lp else np.zeros(0)
    acc = np.concatenate(idx_acc) if idx_acc else np.zeros(0, bool)
    keep = ~np.isnan(v)
    r_all, v, acc = r_all[keep], v[keep], acc[keep]
    p = np.exp(v)
    codes = (run_codes.indices.to_numpy(zero_copy_only=False) if B else np.zeros(0, np.int64)).astype(np.int64)
    parts = []
    for bins in bins_list:
        with np.errstate(invalid="ignore"):
            b = np.minimum(np.floor(p * bins), bins - 1).astype(np.int64)
        # GROUP BY (run, bin) as bincount over key = run code * bins + bin (0 <= bin < bins)
        key = codes[r_all] * bins + b
        size = (len(run_codes.dictionary) if B else 0) * bins
        n = np.bincount(key, minlength=size)
        nz = np.nonzero(n)[0]
        rid = pc.take(run_codes.dictionary, pa.array(nz // bins)) if B else pa.array([], pa.string())
        g = pa.table({"run_id": rid, "bins": pa.array(np.full(len(nz), bins), pa.int32()),
                      "bin": pa.array((nz % bins).astype(np.int32)), "n": pa.array(n[nz].astype(np.int64)),
                      "accepted": pa.array(np.bincount(key, weights=acc, minlength=size)[nz].astype(np.int64)),
                      "p_sum": pa.array(np.bincount(key, weights=p, minlength=size)[nz])})
        parts.append(g)
    return pa.concat_tables(parts)


def compute_rollup(table: pa.Table, what: str = "steps") -> pa.Table:
    """The rollup rows of one data table (what: 'steps' or 'requests'), ROLLUP_SCHEMA,
    by Arrow compute and numpy: the rows KIND_SQL gives (tests hold them equal)."""
    import pyarrow.compute as pc
    if what == "steps":
        parts = _steps_rollup(table)
    else:
        t = pa.table({"run_id": table["run_id"], "gen": _lens(table["output_tokens"])})
        g = _group(t, ["run_id"], [("gen", "count", pc.CountOptions(mode="all")), ("gen", "sum")])
        parts = [_kind_table("outputs", g, {"gen_count": "n", "gen_sum": "generated"})]
    return pa.concat_tables(parts)


def fingerprint(data_name: str, rows: int, size: int) -> dict:
    return {"version": ROLLUP_VERSION, "source": data_name, "rows": int(rows), "bytes": int(size),
            "time_grain_s": TIME_GRAIN_S}


def rollup_bytes(rollup: pa.Table, data_name: str, rows: int, size: int) -> bytes:
    """The rollup file's bytes: zstd Parquet with the data file's fingerprint."""
    return _file_bytes(rollup, fingerprint(data_name, rows, size))


def _file_bytes(rollup: pa.Table, fp: dict) -> bytes:
    import pyarrow.compute as pc
    meta = {META_KEY: json.dumps(fp, sort_keys=True).encode()}
    schema = ROLLUP_SCHEMA.with_metadata(meta)
    buf = io.BytesIO()
    # one row group (or more) per kind: a reader's `kind = 'x'` skips the others by their
    # min/max statistics instead of decoding them
    with pq.ParquetWriter(buf, schema, compression="zstd") as w:
        for kind in dict.fromkeys(rollup["kind"].to_pylist()) if rollup.num_rows else ():
            w.write_table(rollup.filter(pc.equal(rollup["kind"], kind)).cast(schema), row_group_size=1 << 20)
        if not rollup.num_rows:
            w.write_table(rollup.cast(schema))
    return buf.getvalue()


def write_rollup(data_file, table: pa.Table, size: int, what: str = "steps") -> Path:
    """Compute and write (atomically) the rollup of data_file, whose rows are `table` and
    whose size on disk is `size` bytes. Returns the rollup's path."""
    data_file = Path(data_file)
    path = rollup_path(data_file)
    atomic_write_bytes(path, rollup_bytes(compute_rollup(table, what), data_file.name, table.num_rows, size))
    return path


def rollup_problem(data_file, data_rows: int, rollup_file=None) -> str | None:
    """None when rollup_file (default: beside data_file) may stand in for data_file's rows;
    else why not, in words (absent, unreadable, another version, stale)."""
    data_file = Path(data_file)
    rp = Path(rollup_file) if rollup_file is not None else rollup_path(data_file)
    fp, problem = _fingerprint_of(rp)
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


def _fingerprint_of(rp: Path) -> tuple[dict | None, str | None]:
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
COMPACT_EVERY = 64                       # partials kept before they are merged into one
DIGEST_ROWS = 32768                      # step rows held (zero-copy, ~10-30 MB) per partial


class RollupAccumulator:
    """A run's step rollup built flush by flush, written once.

    add() keeps a zero-copy reference to the columns of one step file just written; every
    DIGEST_ROWS rows they become partial sums (the GROUP BYs and calibration bins: their
    cost is mostly fixed per call, so large batches make it small per step), and the rows
    are let go. write() merges the partials into RUN_ROLLUP at the run's close,
    fingerprinted with every source file's name, rows and bytes. No file is written before
    the close: a run killed before it has no step rollup, and readers compute the same rows
    from the step files."""

    def __init__(self, digest_rows: int | None = None):
        self.parts: list[dict] = []
        self.sources: list[dict] = []
        self.digest_rows = DIGEST_ROWS if digest_rows is None else digest_rows
        self._tables: list[pa.Table] = []
        self._rows = 0

    def add(self, data_file, table: pa.Table, size: int) -> None:
        self.sources.append({"source": Path(data_file).name, "rows": int(table.num_rows), "bytes": int(size)})
        self._tables.append(table.select([c for c in STEP_COLUMNS if c in table.column_names]))
        self._rows += table.num_rows
        if self._rows >= self.digest_rows:
            self._digest()

    def _digest(self) -> None:
        if self._tables:
            t = pa.concat_tables(self._tables, promote_options="default")
            self._tables, self._rows = [], 0
            self.parts.append(_steps_partials(t))
        if len(self.parts) >= COMPACT_EVERY:          # bounded memory on a long run
            self.parts = [_merge_partials(self.parts)]

    def table(self) -> pa.Table:
        self._digest()
        if not self.parts:
            return ROLLUP_SCHEMA.empty_table()
        return _partials_table(_merge_partials(self.parts))

    def write(self, run_dir) -> Path | None:
        """Write run_dir/RUN_ROLLUP (atomically); None when no step file was added."""
        if not self.sources:
            return None
        fp = {"version": ROLLUP_VERSION, "time_grain_s": TIME_GRAIN_S, "sources": self.sources}
        path = Path(run_dir) / RUN_ROLLUP
        atomic_write_bytes(path, _file_bytes(self.table(), fp))
        return path


def run_rollup_covers(run_dir, step_rows: dict) -> tuple[list[str], str | None]:
    """step_rows: the run's step file names -> their row counts. ([the step files that
    run_dir/RUN_ROLLUP stands in for], None) when every source it names is on disk with
    its rows and bytes, else ([], why not) ("absent" when there is none)."""
    rp = Path(run_dir) / RUN_ROLLUP
    fp, problem = _fingerprint_of(rp)
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


def verify_rollup(data_file, rollup_file=None, rel_tol: float = 1e-9) -> list[str]:
    """Recompute data_file's rollup from its raw rows and compare it with the stored one,
    value by value: [] when they agree, else the differences in words (at most 20).
    Float sums may differ by summation order, hence rel_tol."""
    data_file = Path(data_file)
    rp = Path(rollup_file) if rollup_file is not None else rollup_path(data_file)
    what = "requests" if data_file.name.startswith("requests") else "steps"
    return _diff(compute_rollup(pq.read_table(data_file), what), rp, rel_tol)


def verify_run_rollup(run_dir, rel_tol: float = 1e-9) -> list[str]:
    """verify_rollup for run_dir/RUN_ROLLUP: recomputed from the step files it names."""
    rp = Path(run_dir) / RUN_ROLLUP
    fp, problem = _fingerprint_of(rp)
    if problem:
        return [problem]
    acc = RollupAccumulator()
    for src in fp.get("sources") or []:
        f = Path(run_dir) / src["source"]
        acc.add(f, pq.read_table(f), f.stat().st_size)
    return _diff(acc.table(), rp, rel_tol)


def _diff(fresh: pa.Table, rp: Path, rel_tol: float) -> list[str]:
    import math
    stored = pq.read_table(rp).select(ROLLUP_SCHEMA.names).cast(ROLLUP_SCHEMA)
    keys = ("kind", "run_id", "request_id", "commit_len", "depth", "cell", "bins", "bin")

    def index(t):
        out = {}
        for r in t.to_pylist():
            out[tuple(r[k] for k in keys)] = r
        return out
    a, b = index(fresh), index(stored)
    diffs = []
    for k in sorted(set(a) | set(b), key=repr):
        if k not in b:
            diffs.append(f"missing row {k}")
        elif k not in a:
            diffs.append(f"extra row {k}")
        else:
            for c in ROLLUP_SCHEMA.names:
                x, y = a[k][c], b[k][c]
                if isinstance(x, float) and isinstance(y, float):
                    same = x == y or math.isclose(x, y, rel_tol=rel_tol, abs_tol=1e-12)
                else:
                    same = x == y
                if not same:
                    diffs.append(f"{k}: {c} is {y!r} in the rollup, {x!r} from the rows")
        if len(diffs) >= 20:
            break
    return diffs


STEP_COLUMNS = ("run_id", "request_id", "t_start", "step_s", "draft_s", "verify_s", "finished", "commit_len",
                "accepted_depth", "committed_tokens", "accepted_path", "node_tokens", "parents", "draft_logprob",
                "topk")


def refresh_rollups(root) -> int:
    """Rewrite the rollups under root that are missing, stale or of an older version or
    grain (for a dataset written before a rollup change: the views would read its raw
    rows): each run's RUN_ROLLUP from its step files (per-file step rollups removed) and
    each requests file's own. Returns how many rollup files were written."""
    n = 0
    for run_dir in sorted({f.parent for f in Path(root).rglob("steps-*.parquet")}
                          | {f.parent for f in Path(root).rglob("requests*.parquet")}):
        steps = sorted(run_dir.glob("steps-*.parquet"))
        rows = {f.name: pq.read_metadata(f).num_rows for f in steps}
        covered, _ = run_rollup_covers(run_dir, rows)
        if steps and sorted(covered) != sorted(rows):
            acc = RollupAccumulator()
            for f in steps:
                acc.add(f, pq.read_table(f, columns=list(STEP_COLUMNS)), f.stat().st_size)
            acc.write(run_dir)
            n += 1
        for f in steps:
            rollup_path(f).unlink(missing_ok=True)
        for f in sorted(run_dir.glob("requests*.parquet")):
            if rollup_problem(f, pq.read_metadata(f).num_rows) is not None:
                write_rollup(f, pq.read_table(f, columns=["run_id", "output_tokens"]), f.stat().st_size, "requests")
                n += 1
    return n
