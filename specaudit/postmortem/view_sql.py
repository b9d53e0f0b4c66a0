"""The SQL text of the views: the Parquet views over the trace's files, nodes (one row per
node, depths from parents), figures (derived beside reported), the rollup_* views, and the
SQL-only forms the duckdb CLI needs (depths without Python, the agreement rule as a macro).
What each view holds: postmortem/views.py.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from specaudit.postmortem.dataset import Dataset
from specaudit.postmortem.sql_guard import sql_str
from specaudit.postmortem.tables import finite_number
from specaudit.trace.rollup import CALIB_BINS, KIND_COLUMNS, REQUEST_KINDS, STEP_KINDS, TIME_GRAIN_S, kind_sql
from specaudit.trace.rollup import ROLLUP_SCHEMA as _ROLLUP_SCHEMA


def duck_type(t: pa.DataType) -> str:
    """The DuckDB type of an Arrow type of the contract (lists of them too)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return duck_type(t.value_type) + "[]"
    return {pa.string(): "VARCHAR", pa.int32(): "INTEGER", pa.int64(): "BIGINT",
            pa.uint64(): "UBIGINT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE",
            pa.bool_(): "BOOLEAN"}[t]


def empty_select(schema: pa.Schema) -> str:
    cols = ", ".join(f"NULL::{duck_type(f.type)} AS {f.name}" for f in schema)
    return f"SELECT {cols} WHERE false"


# accepted_path as a bit set (nodes 0..63) so per-node membership is a shift, not a search
PATH_BITS = ("list_aggregate(list_transform(accepted_path, lambda i: CASE WHEN i BETWEEN 0 AND 63 "
             "THEN (1::UBIGINT << i) ELSE 0::UBIGINT END), 'bit_or')")
# Depth of every node, from parents. connect() registers specaudit_depths(parents), a
# vectorised numpy UDF; the duckdb CLI cannot call Python, so the shell gets SQL: a chain
# (checked, not assumed) is its index, a tree folds parents left to right (parents[i] < i)
# with list_reduce on duckdb >= 2.0, or with pointer doubling (12 rounds: 2^12 = MAX_NODES)
# on older CLIs whose list_reduce cannot carry a list.
CHAIN_TEST = "parents = range(-1, len(parents) - 1)::INTEGER[]"
DEPTHS_REDUCE = (f"CASE WHEN {CHAIN_TEST} THEN range(len(parents))::INTEGER[] "
                 "ELSE list_reduce(parents[2:], lambda acc, p: list_append(acc, "
                 "CASE WHEN p >= 0 AND p < len(acc) THEN acc[p + 1] + 1 ELSE NULL END), [0]) END")


def doubling_source(rounds: int = 12) -> str:
    """steps plus _dep (node depths) by pointer doubling, one subquery per round.

    Round k: _anc[i] = the 2^k-th ancestor of i (-1 past the root), _dep[i] =
    min(2^k, depth(i)); each round jumps every node by its own _anc. Subqueries keep the
    SQL linear in rounds (inlining the lists would grow it 3x per round).
    """
    q = ("SELECT *, parents AS _anc, "
         "list_transform(parents, lambda p: CASE WHEN p >= 0 THEN 1 ELSE 0 END) AS _dep FROM steps")
    for _ in range(rounds):
        q = ("SELECT * REPLACE ("
             "list_transform(range(len(_anc)), lambda i: CASE WHEN _anc[i + 1] >= 0 "
             "THEN _anc[_anc[i + 1] + 1] ELSE -1 END) AS _anc, "
             "list_transform(range(len(_anc)), lambda i: CASE WHEN _anc[i + 1] >= 0 "
             "THEN _dep[i + 1] + _dep[_anc[i + 1] + 1] ELSE _dep[i + 1] END) AS _dep) "
             f"FROM ({q})")
    return f"({q})"


def nodes_view_sql(depths: str = "specaudit_depths(parents)", source: str = "steps") -> str:
    """CREATE VIEW nodes: one row per node (postmortem/views.py says what each column is)."""
    return f"""
CREATE VIEW nodes AS
SELECT run_id, request_id, step, algo, budget, topk, batch_size, seq_len, n_nodes,
       node, depth, token, parent, position, draft_logprob, target_argmax, target_margin,
       CASE WHEN n_nodes <= 64 THEN ((path_bits >> node) & 1) = 1
            ELSE list_contains(accepted_path, node) END AS accepted,
       CASE WHEN parent IS NULL OR parent < 0 THEN NULL
            WHEN n_nodes <= 64 THEN ((path_bits >> parent) & 1) = 1
            ELSE list_contains(accepted_path, parent) END AS parent_accepted
FROM (
  SELECT run_id, request_id, step, algo, budget, topk, batch_size, seq_len,
         len(node_tokens) AS n_nodes, accepted_path, {PATH_BITS} AS path_bits,
         unnest(range(len(node_tokens)))::INTEGER AS node,
         unnest({depths}) AS depth,
         unnest(node_tokens) AS token,
         unnest(parents) AS parent,
         unnest(positions) AS position,
         unnest(draft_logprob) AS draft_logprob,
         unnest(target_argmax) AS target_argmax,
         unnest(target_margin) AS target_margin
  FROM {source}
)
"""


# figures: derived beside reported. tokens_per_s: generated tokens (the requests' output,
# else committed tokens + one first token per request) over the run's reported wall_s (the
# clock; the steps' own span when run.json has none). Means follow the run's declared mean
# convention (pooled or per request); the accept rate is accepted drafts / drafted nodes.
FIGURES_VIEW_SQL = """
CREATE VIEW figures AS
WITH per_req AS (
    SELECT run_id, request_id, sum(n) AS n, sum(depth_sum) AS depth, sum(committed) AS commit,
           sum(drafted) AS drafted, min(t0) AS t0, max(t1) AS t1
    FROM rollup_request GROUP BY ALL
), per_run AS (
    SELECT run_id, sum(n) AS steps, sum(depth) AS depth, sum(commit) AS commit,
           sum(drafted) AS drafted, count(*) AS n_req,
           avg(depth / n) AS pr_depth, avg(commit / n) AS pr_commit, max(t1) - min(t0) AS span
    FROM per_req GROUP BY ALL
), outs AS (
    SELECT run_id, sum(generated) AS generated FROM rollup_outputs GROUP BY ALL
), d AS (
    SELECT r.run_id, r.config, r.mean_convention,
           CASE WHEN r.mean_convention = 'per_request' THEN p.pr_depth ELSE p.depth / p.steps END
               AS mean_accepted_depth,
           CASE WHEN r.mean_convention = 'per_request' THEN p.pr_commit ELSE p.commit / p.steps END
               AS mean_commit_len,
           p.depth / nullif(p.drafted, 0) AS accept_rate,
           coalesce(o.generated, p.commit + p.n_req)
               / nullif(coalesce(r.reported_wall_s, p.span), 0) AS tokens_per_s,
           CASE WHEN r.reported_wall_s IS NULL THEN 'the steps'' span' ELSE 'run.json wall_s' END AS clock,
           r.reported_mean_accepted_depth, r.reported_mean_commit_len,
           r.reported_accepted_tokens / nullif(r.reported_drafted_tokens, 0) AS reported_accept_rate,
           r.reported_gen_throughput_tps
    FROM runs AS r JOIN per_run AS p USING (run_id) LEFT JOIN outs AS o USING (run_id)
), long AS (
    SELECT run_id, config, unnest([
        {'i': 1, 'metric': 'mean_accepted_depth', 'derived': mean_accepted_depth,
         'reported': reported_mean_accepted_depth, 'derived_from': 'len(accepted_path) - 1'},
        {'i': 2, 'metric': 'mean_commit_len', 'derived': mean_commit_len,
         'reported': reported_mean_commit_len, 'derived_from': 'len(committed_tokens)'},
        {'i': 3, 'metric': 'accept_rate', 'derived': accept_rate, 'reported': reported_accept_rate,
         'derived_from': 'accepted path / drafted nodes'},
        {'i': 4, 'metric': 'tokens_per_s', 'derived': tokens_per_s, 'reported': reported_gen_throughput_tps,
         'derived_from': 'output tokens / ' || clock}
    ]) AS f
    FROM d
)
SELECT run_id, config, f.i AS i, f.metric AS metric, f.derived AS derived, f.reported AS reported,
       CASE WHEN f.reported IS NULL THEN 'derived only'
            ELSE specaudit_agrees(f.reported, f.derived) END AS verdict,
       f.derived_from AS derived_from
FROM long
"""

# The duckdb CLI cannot call Python: the shell gets this macro, the same rule in SQL
# (printed precision read as the fewest decimals, up to 12, that round(r, k) keeps; more
# than that: full precision, relative 1e-9). connect() registers compare.agrees itself.
AGREES_MACRO_SQL = """
CREATE MACRO specaudit_agrees(r, d) AS (
    CASE WHEN r IS NULL OR d IS NULL OR isnan(r) OR isnan(d) OR isinf(r) OR isinf(d) THEN 'no verdict'
         WHEN list_filter(range(13), lambda k: round(r, k::INTEGER) = r)[1] IS NULL
             THEN CASE WHEN abs(r - d) <= 1e-9 * greatest(abs(r), abs(d)) THEN 'agrees' ELSE 'disagrees' END
         WHEN r - 0.5 * pow(10, -list_filter(range(13), lambda k: round(r, k::INTEGER) = r)[1]) <= d
              AND d < r + 0.5 * pow(10, -list_filter(range(13), lambda k: round(r, k::INTEGER) = r)[1])
             THEN 'agrees' ELSE 'disagrees' END)
"""


def parquet_view(name: str, files: list[Path], schema: pa.Schema, ds: Dataset | None = None) -> str:
    """CREATE VIEW name over files. union_by_name (columns matched by name, a file without
    the contract v2 columns padded with NULL) unless ds saw the same columns in every file:
    then DuckDB reads one footer to bind the view, not all of them (0.1 s at 53 files)."""
    if not files:
        return f"CREATE VIEW {name} AS {empty_select(schema)}"
    lst = ", ".join(sql_str(f) for f in files)
    union = "false" if ds is not None and ds.same_columns(files) else "true"
    return (f"CREATE VIEW {name} AS SELECT * FROM read_parquet([{lst}], union_by_name = {union}, "
            f"hive_partitioning = false)")


# the bins acceptance_vs_draft_logprob asks for (--param bins, default 10); getvariable()
# folds to a constant when a query is planned, so a filter on it prunes whole scans
CALIB_BINS_EXPR = "coalesce(getvariable('bins'), 10)::INTEGER"
CALIB_NB = f"SELECT {CALIB_BINS_EXPR} AS bins"


def read_parquet_sql(files) -> str:
    """read_parquet over files, columns matched by name."""
    lst = ", ".join(sql_str(f) for f in files)
    return f"read_parquet([{lst}], union_by_name = true, hive_partitioning = false)"


def rollup_views_sql(ds: Dataset, bins=None) -> list[str]:
    """CREATE VIEW rollup_<kind> for every rollup kind: the rows of the rollup files that
    stand in for their data files, UNION ALL the same rows computed by the same SQL
    (trace/rollup.py KIND_SQL) from the raw files that have no usable rollup. The canned
    queries, the figures view and the report read these views; `steps` and `requests`
    stay the raw rows. bins: the calibration bins asked for at connect (--param bins);
    when the writers stored them, rollup_calib never binds the raw step files (binding
    reads every file's footer), and a later `SET VARIABLE bins` to a count they did not
    store is an error naming the way to ask for it, never a silently empty result."""
    out = []
    need_raw_bins = bins is not None and finite_number(bins, int) not in CALIB_BINS
    for kinds, data in ((STEP_KINDS, ds.step_files), (REQUEST_KINDS, ds.request_files)):
        have = list(dict.fromkeys(ds.rollups[f] for f in data if f in ds.rollups))   # a run rollup: once
        raw = [f for f in data if f not in ds.rollups]
        for kind in kinds:
            cols = ", ".join(KIND_COLUMNS[kind])
            parts = []
            if have:
                cond = f"kind = '{kind}'"
                if kind == "calib":
                    cond += f" AND bins = {CALIB_BINS_EXPR}"
                parts.append(f"SELECT {cols} FROM {read_parquet_sql(have)} WHERE {cond}")
            if raw:
                parts.append(kind_sql(kind, read_parquet_sql(raw), nb=CALIB_NB))
            if have and kind == "calib":
                stored = ", ".join(str(b) for b in CALIB_BINS)
                if need_raw_bins:
                    # bins the writers did not store: those files' nodes come from the raw rows
                    # (a constant-false filter for stored bins: nothing is scanned)
                    src = f"(SELECT * FROM {read_parquet_sql([f for f in data if f in ds.rollups])} " \
                          f"WHERE {CALIB_BINS_EXPR} NOT IN ({stored}))"
                    parts.append(kind_sql(kind, src, nb=CALIB_NB))
                else:
                    parts.append(
                        "SELECT NULL::VARCHAR AS run_id, NULL::INTEGER AS bins, NULL::INTEGER AS bin, "
                        "NULL::BIGINT AS n, NULL::BIGINT AS accepted, NULL::DOUBLE AS p_sum "
                        f"WHERE CASE WHEN {CALIB_BINS_EXPR} NOT IN ({stored}) THEN error('bins = ' || "
                        f"{CALIB_BINS_EXPR} || ' is not in the rollups (they hold {stored}): pass it when "
                        "connecting (specaudit query --param bins=N) and the views read the raw rows for it')::BOOLEAN "
                        "ELSE false END")
            if not parts:
                parts.append("SELECT " + ", ".join(f"NULL::{duck_type(_ROLLUP_SCHEMA.field(c).type)} AS {c}"
                                                   for c in KIND_COLUMNS[kind]) + " WHERE false")
            body = " UNION ALL ".join(parts)
            if kind == "time":   # the grain travels with the cells (throughput_over_time reads it)
                body = f"SELECT *, {TIME_GRAIN_S!r}::DOUBLE AS grain_s FROM ({body})"
            out.append(f"CREATE VIEW rollup_{kind} AS " + body)
    return out
