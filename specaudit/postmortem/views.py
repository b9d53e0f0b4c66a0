"""Trace datasets as DuckDB views, read-only and offline, plus the canned post-mortem queries.

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

Read-only and offline, also when the SQL asks otherwise. Two layers:
  1. statements that touch files or extensions are refused before DuckDB sees them:
     COPY, EXPORT, ATTACH, INSTALL/LOAD, PREPARE/EXECUTE, UPDATE EXTENSIONS;
  2. DuckDB itself is locked: enable_external_access=false with only the trace's Parquet
     files on allowed_paths, extension autoinstall/autoload off, community extensions
     and extension repositories off, no temp directory (no spill files), Python
     replacement scans off, then lock_configuration=true so no SET can undo any of it.
Layer 1 matters because DuckDB lets a statement *write* to a path on allowed_paths
(COPY ... TO a trace file with USE_TMP_FILE false overwrote it in a test).

Readers never import each other: the command layer runs the checker and passes its
findings in (Finding objects, dicts, or an Arrow table).
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import pyarrow as pa

from specaudit.trace.rollup import (
    CALIB_BINS,
    KIND_COLUMNS,
    REQUEST_KINDS,
    RUN_ROLLUP,
    STEP_KINDS,
    TIME_GRAIN_S,
    kind_sql,
    rollup_problem,
    run_rollup_covers,
)
from specaudit.trace.rollup import ROLLUP_SCHEMA as _ROLLUP_SCHEMA
from specaudit.trace.rollup import rollup_path as _rollup_path
from specaudit.trace.schema import (
    REPORTED_KEYS,
    REQUESTS_SCHEMA,
    STEPS_SCHEMA,
    InputError,
    check_table_schema,
    declared_size_problem,
    discover,
    tree_depths,
)

VIEWS = ("steps", "requests", "runs", "nodes", "violations", "figures", "rollup_request", "rollup_hist",
         "rollup_time", "rollup_calib", "rollup_outputs")

# ------------------------------------------------------------------------ refusals


class QueryRefused(ValueError):
    """A statement or an access that the read-only, offline session refuses."""


# statement type -> why it is refused (one line each)
REFUSED = {
    "COPY": "COPY reads or writes files; this session is read-only (save a result with -o FILE)",
    "COPY_DATABASE": "COPY FROM DATABASE writes a database; this session is read-only",
    "EXPORT": "EXPORT DATABASE writes files; this session is read-only (save a result with -o FILE)",
    "ATTACH": "ATTACH opens database files; this session only reads the trace views",
    "DETACH": "DETACH is not needed: this session has no attached databases",
    "LOAD": "INSTALL/LOAD of DuckDB extensions is disabled (offline, no extensions)",
    "EXTENSION": "extension management is disabled (offline, no extensions)",
    "PREPARE": "PREPARE/EXECUTE are not supported here (pass parameters with --param KEY=VALUE)",
    "EXECUTE": "PREPARE/EXECUTE are not supported here (pass parameters with --param KEY=VALUE)",
    "LOGICAL_PLAN": "this statement type is not allowed here",
    "RELATION": "this statement type is not allowed here",
    "INVALID": "this statement type is not allowed here",
}

# SQL prefixes that parse but whose StatementType is not one of the above or fails to map
_REFUSED_PREFIX = re.compile(r"^\s*(install|force\s+install|load|update\s+extensions|attach|copy|export)\b",
                             re.IGNORECASE)


def one_line(msg: str) -> str:
    """DuckDB's multi-line error (message, LINE n: context, caret line) as one line."""
    lines = [ln.strip() for ln in str(msg).splitlines()]
    lines = [ln for ln in lines if ln and not set(ln) <= {"^", " "}]
    return " | ".join(lines)


def check_statements(con, sql: str) -> list:
    """Parse sql into statements and refuse those that could touch files or extensions.

    Raises QueryRefused (one line naming the statement) or ValueError (a parse error in
    DuckDB's words). Returns the parsed statements.
    """
    import duckdb
    try:
        stmts = con.extract_statements(sql)
    except duckdb.Error as e:
        raise ValueError(f"SQL error: {one_line(e)}") from None
    except ValueError:
        # a statement type this duckdb build cannot name (e.g. UPDATE EXTENSIONS)
        raise QueryRefused("refused: this statement type is not allowed in a read-only session") from None
    if not stmts:
        raise ValueError("SQL error: no statement in the query")
    for st in stmts:
        try:
            kind = st.type.name
        except ValueError:  # a statement type this duckdb build cannot name (UPDATE EXTENSIONS)
            raise QueryRefused(f"refused: this statement type is not allowed in a read-only session: "
                               f"{_snippet(getattr(st, 'query', '') or sql)}") from None
        text = getattr(st, "query", "") or ""
        if kind in REFUSED:
            raise QueryRefused(f"refused: {REFUSED[kind]}: {_snippet(text)}")
        if kind == "PRAGMA" and re.match(r"^\s*copy\b", text, re.IGNORECASE):
            raise QueryRefused(f"refused: {REFUSED['COPY_DATABASE']}: {_snippet(text)}")
        if _REFUSED_PREFIX.match(text):
            raise QueryRefused(f"refused: this statement touches files or extensions: {_snippet(text)}")
    return stmts


def _snippet(text: str, n: int = 60) -> str:
    t = " ".join(text.split())
    return t if len(t) <= n else t[: n - 3] + "..."


def translate_error(e: Exception) -> Exception:
    """A duckdb.Error as a one-line ValueError/QueryRefused the CLI prints with exit 2."""
    import duckdb
    msg = one_line(e)
    if isinstance(e, duckdb.PermissionException) or "disabled by configuration" in msg:
        return QueryRefused(f"refused (read-only, offline session): {msg}")
    m = re.search(r"in the (\w+) extension|extension \"?(\w+)\"? (?:is not loaded|not found)", msg)
    if m or "autoinstall_known_extensions" in msg or "autoload_known_extensions" in msg:
        first = one_line(str(e).splitlines()[0]) if str(e).strip() else msg
        return QueryRefused(f"refused (offline, no extensions: nothing is installed or loaded): {first}")
    if "configuration has been locked" in msg:
        return QueryRefused(f"refused (settings are locked in a read-only session): {msg}")
    return ValueError(f"SQL error: {msg}")


# -------------------------------------------------------------------- type mapping

def duck_type(t: pa.DataType) -> str:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return duck_type(t.value_type) + "[]"
    return {pa.string(): "VARCHAR", pa.int32(): "INTEGER", pa.int64(): "BIGINT",
            pa.uint64(): "UBIGINT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE",
            pa.bool_(): "BOOLEAN"}[t]


def _empty_select(schema: pa.Schema) -> str:
    cols = ", ".join(f"NULL::{duck_type(f.type)} AS {f.name}" for f in schema)
    return f"SELECT {cols} WHERE false"


def sql_str(s) -> str:
    """A SQL string literal."""
    return "'" + str(s).replace("'", "''") + "'"


# ------------------------------------------------------------------------ findings

VIOLATION_SCHEMA = pa.schema([
    ("code", pa.string()), ("name", pa.string()), ("severity", pa.string()),
    ("message", pa.string()), ("run_id", pa.string()), ("request_id", pa.string()),
    ("step", pa.int64()), ("file", pa.string()), ("line", pa.int64()),
    ("values", pa.string()),  # JSON text: the numbers, machine-readable
])


def findings_table(findings) -> pa.Table:
    """Findings (Finding objects, dicts, or an Arrow table) -> the `violations` table."""
    if findings is None:
        return VIOLATION_SCHEMA.empty_table()
    if isinstance(findings, pa.Table):
        rows = findings.to_pylist()
    else:
        rows = [f.to_dict() if hasattr(f, "to_dict") else dict(f) for f in findings]
    cols = {f.name: [] for f in VIOLATION_SCHEMA}
    for r in rows:
        for name in cols:
            v = r.get(name)
            if name == "values":
                if not isinstance(v, str):      # already JSON text when it comes from this table
                    v = json.dumps(v if v is not None else {}, default=str, sort_keys=True)
            elif name in ("step", "line") and v is not None:
                v = int(v)
            elif v is not None:
                v = str(v)
            cols[name].append(v)
    return pa.table(cols, schema=VIOLATION_SCHEMA)


# ---------------------------------------------------------------------------- runs

RUN_COLUMNS = [
    ("run_id", pa.string()), ("config", pa.string()), ("algo", pa.string()),
    ("budget", pa.int64()), ("topk", pa.int64()), ("block_size", pa.int64()),
    ("concurrency", pa.int64()), ("max_new_tokens", pa.int64()), ("dtype", pa.string()),
    ("device", pa.string()), ("seed", pa.int64()), ("fault", pa.string()),
    ("engine", pa.string()), ("engine_version", pa.string()),
    ("target_model", pa.string()), ("target_sha256", pa.string()),
    ("drafter_model", pa.string()), ("drafter_sha256", pa.string()),
    ("hostname", pa.string()), ("started_at", pa.float64()), ("finished_at", pa.float64()),
    ("complete", pa.bool_()), ("accept_length_convention", pa.string()),
    ("mean_convention", pa.string()),
] + [(f"reported_{k}", pa.float64()) for k in REPORTED_KEYS] + [
    ("step_files", pa.int64()), ("run_dir", pa.string()), ("problems", pa.string()),
    ("manifest", pa.string()), ("rollups", pa.string()),
]
RUNS_SCHEMA = pa.schema(RUN_COLUMNS)


def config_label(cfg: dict) -> str | None:
    """'chain b7 k1 c4' (+ ' fault=NAME'): the name a config goes by in queries and plots."""
    if not cfg or not cfg.get("algo"):
        return None
    s = f"{cfg.get('algo')} b{cfg.get('budget')} k{cfg.get('topk')} c{cfg.get('concurrency', 1)}"
    if cfg.get("fault"):
        s += f" fault={cfg['fault']}"
    return s


def _num(v, typ=float):
    try:
        if v is None or isinstance(v, bool):
            return None
        x = typ(v)
        return None if isinstance(x, float) and not math.isfinite(x) else x
    except (TypeError, ValueError):
        return None


def runs_table(runs, rollups: dict | None = None) -> pa.Table:
    """RunFiles (from schema.discover) -> the `runs` table: one row per run, manifest flattened.
    rollups: run_dir -> what the views made of the run's rollups, in words (Dataset.rollup_notes)."""
    cols = {name: [] for name, _ in RUN_COLUMNS}
    strings = {name for name, t in RUN_COLUMNS if t == pa.string()}
    for rf in runs:
        m = rf.manifest or {}
        cfg = m.get("config") or {}
        eng = m.get("engine") or {}
        models = m.get("models") or {}
        rep = m.get("reported") or {}
        conv = m.get("conventions") or {}
        host = m.get("host") or {}
        row = {
            "run_id": rf.run_id, "config": config_label(cfg), "algo": cfg.get("algo"),
            "budget": _num(cfg.get("budget"), int), "topk": _num(cfg.get("topk"), int),
            "block_size": _num(cfg.get("block_size"), int),
            "concurrency": _num(cfg.get("concurrency"), int),
            "max_new_tokens": _num(cfg.get("max_new_tokens"), int),
            "dtype": cfg.get("dtype"), "device": cfg.get("device"), "seed": _num(cfg.get("seed"), int),
            "fault": cfg.get("fault"),
            "engine": eng.get("name") if isinstance(eng, dict) else str(eng),
            "engine_version": eng.get("version") if isinstance(eng, dict) else None,
            "target_model": (models.get("target") or {}).get("name"),
            "target_sha256": (models.get("target") or {}).get("sha256"),
            "drafter_model": (models.get("drafter") or {}).get("name"),
            "drafter_sha256": (models.get("drafter") or {}).get("sha256"),
            "hostname": host.get("hostname") if isinstance(host, dict) else str(host),
            "started_at": _num(m.get("started_at")), "finished_at": _num(m.get("finished_at")),
            "complete": rf.complete,
            "accept_length_convention": conv.get("accept_length"), "mean_convention": conv.get("mean"),
            "step_files": len(rf.step_files), "run_dir": str(rf.run_dir),
            "problems": "; ".join(str(p) for p in rf.problems) or None,
            "manifest": json.dumps(m, sort_keys=True, default=str) if m else None,
            "rollups": (rollups or {}).get(str(rf.run_dir)),
        }
        for k in REPORTED_KEYS:
            row[f"reported_{k}"] = _num(rep.get(k))
        for name in cols:
            v = row[name]
            cols[name].append(str(v) if v is not None and name in strings else v)
    return pa.table(cols, schema=RUNS_SCHEMA)


# ---------------------------------------------------------------------- view SQL

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


def _doubling_source(rounds: int = 12) -> str:
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
    """CREATE VIEW nodes: one row per node (see the module docstring)."""
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


# The catalog rules the figures view computes again (invariants/homes.py reads it): metric
# -> the code whose verdict its `verdict` column gives (tests/test_rule_homes.py runs each
# rule's catalog fixtures through the view). accept_rate has no rule of its own: its two
# terms are SA502 and SA503, and SA509 audits the optional reported.accept_rate instead.
FIGURE_RULES = {"mean_accepted_depth": "SA506", "mean_commit_len": "SA507", "tokens_per_s": "SA510"}

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


def depths_udf(parents) -> pa.Array:
    """Arrow UDF body: list<int> parents -> list<int32> depths (root 0), same lengths.

    Vectorised over the chunk: pad to [B, Nmax] with -1 and run schema.tree_depths
    (one pass over node columns). A parent that is not an earlier node gives depth NULL
    (the checker's tree rule reports such rows).
    """
    import numpy as np
    import pyarrow.compute as pc

    if isinstance(parents, pa.ChunkedArray):
        parents = parents.combine_chunks()
    lens = pc.list_value_length(parents).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(parents).to_numpy(zero_copy_only=False).astype(np.int64)
    B = len(lens)
    offs = np.zeros(B + 1, np.int64)
    np.cumsum(lens, out=offs[1:])
    nmax = int(lens.max()) if B else 0
    if nmax == 0:
        vals = np.zeros(0, np.int32)
        valid = np.zeros(0, bool)
    else:
        row = np.repeat(np.arange(B), lens)
        col = np.arange(len(flat)) - offs[:-1][row]
        P = np.full((B, nmax), -1, np.int64)
        P[row, col] = flat
        D = tree_depths(P)
        bad = (P >= np.arange(nmax)) | ((P < 0) & (np.arange(nmax) > 0))  # not an earlier node
        badrow = np.zeros((B, nmax), bool)
        # a node under a bad node is bad too: propagate left to right (parents precede children)
        for i in range(1, nmax):
            p = np.clip(P[:, i], 0, nmax - 1)
            badrow[:, i] = bad[:, i] | badrow[np.arange(B), p]
        vals = D[row, col].astype(np.int32)
        valid = ~badrow[row, col]
    values = pa.array(vals, pa.int32(), mask=~valid if len(valid) else None)
    out = pa.ListArray.from_arrays(pa.array(offs.astype(np.int32)), values)
    if parents.null_count:
        out = pc.if_else(pc.is_null(parents), pa.scalar(None, out.type), out)
    return out


def _parquet_view(name: str, files: list[Path], schema: pa.Schema, ds: Dataset | None = None) -> str:
    """CREATE VIEW name over files. union_by_name (columns matched by name, a file without
    the contract v2 columns padded with NULL) unless ds saw the same columns in every file:
    then DuckDB reads one footer to bind the view, not all of them (0.1 s at 53 files)."""
    if not files:
        return f"CREATE VIEW {name} AS {_empty_select(schema)}"
    lst = ", ".join(sql_str(f) for f in files)
    union = "false" if ds is not None and ds.same_columns(files) else "true"
    return (f"CREATE VIEW {name} AS SELECT * FROM read_parquet([{lst}], union_by_name = {union}, "
            f"hive_partitioning = false)")


@dataclass
class Dataset:
    """What connect() found: the run partitions and their files."""

    runs: list
    step_files: list[Path] = field(default_factory=list)
    request_files: list[Path] = field(default_factory=list)
    skipped: list = field(default_factory=list)      # InputError per file left out
    # data file -> its rollup, for the rollups whose fingerprint matches (trace/rollup.py)
    rollups: dict = field(default_factory=dict)
    rollup_notes: dict = field(default_factory=dict)  # run_dir -> what was used, in words
    schemas: dict = field(default_factory=dict)       # data file -> its Arrow schema (as read)

    def same_columns(self, files) -> bool:
        """Every file's schema known and equal (names, order, types)."""
        got = [self.schemas.get(f) for f in files]
        return bool(got) and got[0] is not None and all(g is not None and g.equals(got[0]) for g in got[1:])

    @property
    def files(self) -> list[Path]:
        return self.step_files + self.request_files + list(dict.fromkeys(self.rollups.values()))


def find_dataset(paths, rollups: bool = True) -> Dataset:
    """discover() the runs under paths (InputError when there are none).

    A file that is not readable Parquet, or lacks a required column or has it with the
    wrong type, is left out of the views and named in its run's `problems` (and in
    Dataset.skipped): the rest of the trace stays queryable; `specaudit check` reports
    such files as SA000. rollups=False reads every figure from the raw rows; otherwise
    a data file's rollup stands in for it when its fingerprint (name, rows, bytes)
    matches, and the run's `rollups` column says which were used and why others were not.
    """
    runs = discover([str(p) for p in paths])
    if not runs:
        raise InputError(None, "no trace runs found")
    # a run copied into a second folder (same run id) is counted once: the first folder
    dups = [rf for rf in runs if rf.duplicate_of is not None]
    runs = [rf for rf in runs if rf.duplicate_of is None]
    ds = Dataset(runs=runs)
    ds.skipped += [InputError(rf.run_dir, f"run {rf.run_id} is also in {rf.duplicate_of}: left out "
                                          "(a copy; specaudit check warns SA002)") for rf in dups]
    for rf in runs:
        used, files, why = 0, 0, []
        usable = []
        for f, expected, out in [(f, STEPS_SCHEMA, ds.step_files) for f in rf.step_files] + \
                                [(f, REQUESTS_SCHEMA, ds.request_files) for f in rf.request_files]:
            rows = _usable(rf, f, expected, ds)
            if rows is not None:
                usable.append((f, rows, out))
        # the run's step rollup (written at close) stands in for the step files it names
        covered: set = set()
        if rollups and rf.step_files:
            names, problem = run_rollup_covers(rf.run_dir, {f.name: r for f, r, o in usable if o is ds.step_files})
            covered = set(names)
            if problem not in (None, "absent"):
                why.append(f"{RUN_ROLLUP}: {problem}")
        for f, rows, out in usable:
            out.append(f.resolve())
            files += 1
            if not rollups:
                continue
            if out is ds.step_files and f.name in covered:
                ds.rollups[f.resolve()] = (Path(rf.run_dir) / RUN_ROLLUP).resolve()
                used += 1
                continue
            problem = rollup_problem(f, rows)
            if problem is None:
                ds.rollups[f.resolve()] = _rollup_path(f).resolve()
                used += 1
            elif problem != "absent":
                why.append(f"{f.name}: {problem}")
        if files:
            note = ("raw rows (rollups not used)" if not rollups else "no rollups: raw rows" if not used
                    else f"rollups for {used} of {files} files" + (", the rest from raw rows" if used < files else ""))
            if why:
                note += "; ignored: " + "; ".join(why[:5]) + (f" (and {len(why) - 5} more)" if len(why) > 5 else "")
            ds.rollup_notes[str(rf.run_dir)] = note
    if not ds.step_files and not ds.request_files and all(rf.manifest is None for rf in runs):
        # no readable step or request file and no manifest: nothing here is a trace, and
        # empty views would read as "all clean"
        errs = ds.skipped + [p for rf in runs for p in rf.problems]
        e = errs[0] if errs else InputError(runs[0].run_dir, "no step files")
        more = f" (and {len(errs) - 1} more problems)" if len(errs) > 1 else ""
        raise InputError(getattr(e, "path", None), f"not a trace run: {getattr(e, 'reason', e)}{more}")
    return ds


def _usable(rf, path: Path, expected: pa.Schema, ds: Dataset) -> int | None:
    """The file's row count when it can be read with the expected columns, else None
    (the problem recorded on the run and in ds.skipped)."""
    import pyarrow.parquet as pq
    try:
        md = pq.read_metadata(path)
        schema = md.schema.to_arrow_schema()
        check_table_schema(path, schema, expected)
        too_big = declared_size_problem(md)   # a row declared above MAX_NODES: never given to DuckDB
        if too_big:
            raise InputError(path, too_big)
        ds.schemas[path.resolve()] = schema.remove_metadata()
        return md.num_rows
    except InputError as e:
        err = e
    except Exception as e:
        err = InputError(path, f"not readable Parquet ({type(e).__name__}: {one_line(e)})")
    rf.problems.append(err)
    ds.skipped.append(err)
    return None


# ------------------------------------------------------------------ rollup views

# the bins acceptance_vs_draft_logprob asks for (--param bins, default 10); getvariable()
# folds to a constant when a query is planned, so a filter on it prunes whole scans
CALIB_BINS_EXPR = "coalesce(getvariable('bins'), 10)::INTEGER"
CALIB_NB = f"SELECT {CALIB_BINS_EXPR} AS bins"


def _read(files) -> str:
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
    need_raw_bins = bins is not None and _num(bins, int) not in CALIB_BINS
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
                parts.append(f"SELECT {cols} FROM {_read(have)} WHERE {cond}")
            if raw:
                parts.append(kind_sql(kind, _read(raw), nb=CALIB_NB))
            if have and kind == "calib":
                stored = ", ".join(str(b) for b in CALIB_BINS)
                if need_raw_bins:
                    # bins the writers did not store: those files' nodes come from the raw rows
                    # (a constant-false filter for stored bins: nothing is scanned)
                    src = f"(SELECT * FROM {_read([f for f in data if f in ds.rollups])} " \
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


# settings applied before the views exist (order matters: allowed_paths, then the switch)
HARDEN = [
    ("autoinstall_known_extensions", "false"),
    ("autoload_known_extensions", "false"),
    ("allow_community_extensions", "false"),
    ("allow_unsigned_extensions", "false"),
    ("allow_extension_repositories", "'forbidden'"),   # duckdb >= 2.0
    ("python_enable_replacements", "false"),
    ("temp_directory", "''"),                          # no spill files
    ("allow_persistent_secrets", "false"),
    ("parquet_metadata_cache", "true"),                # each file's footer parsed once per session
]
REQUIRED_SETTINGS = ("enable_external_access", "lock_configuration", "autoinstall_known_extensions",
                     "autoload_known_extensions")


def _set(con, name: str, value: str, required: bool) -> None:
    import duckdb
    try:
        con.execute(f"SET {name} = {value}")
    except duckdb.Error:
        if required or name in REQUIRED_SETTINGS:
            raise


def _check_threads(threads) -> None:
    most = 4 * (os.cpu_count() or 1)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or not 1 <= threads <= most):
        # 100000 spawned 31k threads and hung; -1 was a traceback
        raise InputError(None, f"--threads must be between 1 and {most} (4 x this machine's cores), got {threads}")


def _set_variables(con, variables) -> None:
    for k, v in (variables or {}).items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
            raise ValueError(f"--param {k!r}: names are letters, digits and '_'")
        con.execute(f"SET VARIABLE {k} = $v", {"v": v})


def connect_tables(tables: dict, *, threads: int | None = None, variables: dict | None = None):
    """A locked, in-memory DuckDB connection holding only these Arrow tables (engine
    outputs' `windows` and `findings`, specaudit.postmortem.engine_views): the same
    hardening as connect(), with no file on allowed_paths at all."""
    import duckdb

    _check_threads(threads)
    config = {"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    if threads:
        config["threads"] = str(int(threads))
    con = duckdb.connect(":memory:", config=config)
    try:
        for name, value in HARDEN:
            _set(con, name, value, required=False)
        con.execute("SET allowed_paths = []")
        con.execute("SET allowed_directories = []")
        con.execute("SET enable_external_access = false")
        for name, table in tables.items():
            _load_table(con, name, table)
        _register_agrees(con)
        _set_variables(con, variables)
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def connect(paths, findings=None, *, threads: int | None = None, variables: dict | None = None,
            dataset: Dataset | None = None, rollups: bool = True, extra_tables: dict | None = None):
    """A locked, in-memory DuckDB connection with the five views over the trace at paths.

    findings: the checker's findings (Finding objects, dicts or an Arrow table) for the
    `violations` view; None leaves it empty. variables: {name: value} for getvariable()
    in canned queries (set before the lock). threads: DuckDB worker threads (default: all).
    rollups=False: every figure from the raw rows (rollup files ignored). extra_tables:
    {name: Arrow table} loaded beside the views (engine outputs' windows and findings).
    """
    import duckdb

    _check_threads(threads)
    ds = dataset or find_dataset(paths, rollups=rollups)
    config = {"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    if threads:
        config["threads"] = str(int(threads))
    con = duckdb.connect(":memory:", config=config)
    try:
        for name, value in HARDEN:
            _set(con, name, value, required=False)
        allowed = ", ".join(sql_str(f) for f in ds.files)
        con.execute(f"SET allowed_paths = [{allowed}]")
        con.execute("SET allowed_directories = []")
        con.execute("SET enable_external_access = false")
        # from here on DuckDB reads only the trace's own Parquet files
        try:
            con.execute(_parquet_view("steps", ds.step_files, STEPS_SCHEMA, ds))
            con.execute(_parquet_view("requests", ds.request_files, REQUESTS_SCHEMA, ds))
            for sql in rollup_views_sql(ds, bins=(variables or {}).get("bins", 10)):
                con.execute(sql)
        except duckdb.Error as e:
            raise InputError(None, f"cannot read the trace's Parquet files: {one_line(e)}") from None
        _load_table(con, "runs", runs_table(ds.runs, ds.rollup_notes))
        _load_table(con, "violations", findings_table(findings))
        _register_depths(con)
        _register_agrees(con)
        con.execute(nodes_view_sql())
        con.execute(FIGURES_VIEW_SQL)
        for name, table in (extra_tables or {}).items():
            _load_table(con, name, table)
        # runs without a manifest: name their config from the step rows
        if any(rf.manifest is None or not config_label(rf.manifest.get("config") or {}) for rf in ds.runs):
            con.execute("""UPDATE runs SET config = s.cfg, algo = s.algo, budget = s.budget, topk = s.topk
                           FROM (SELECT run_id, any_value(algo) AS algo, any_value(budget) AS budget,
                                        any_value(topk) AS topk,
                                        any_value(algo || ' b' || budget || ' k' || topk) AS cfg
                                 FROM steps WHERE run_id IN (SELECT run_id FROM runs WHERE config IS NULL)
                                 GROUP BY run_id) s
                           WHERE runs.run_id = s.run_id AND runs.config IS NULL""")
        _set_variables(con, variables)
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def _register_depths(con) -> None:
    import duckdb
    integer = duckdb.sqltype("INTEGER") if hasattr(duckdb, "sqltype") else duckdb.typing.INTEGER
    il = duckdb.list_type(integer)
    con.create_function("specaudit_depths", depths_udf, [il], il, type="arrow",
                        null_handling="special", side_effects=False)


def _register_agrees(con) -> None:
    """specaudit_agrees(reported DOUBLE, derived DOUBLE) -> 'agrees' | 'disagrees' | 'no verdict':
    specaudit.audit.compare.verdict, the rule every surface uses."""
    from specaudit.audit.compare import verdict
    con.create_function("specaudit_agrees", lambda r, d: verdict(r, d), ["DOUBLE", "DOUBLE"], "VARCHAR",
                        null_handling="special", side_effects=False)


def _load_table(con, name: str, table: pa.Table) -> None:
    """Copy a small Arrow table into an in-memory DuckDB table (no Python scan stays registered)."""
    tmp = f"_specaudit_{name}"
    con.register(tmp, table)
    try:
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM {tmp}")
    finally:
        con.unregister(tmp)


# statement types whose result is rows worth printing; others run and print nothing
ROW_TYPES = {"SELECT", "EXPLAIN", "PRAGMA", "CALL", "MULTI"}


def execute(con, sql: str):
    """Run (possibly several) statements after the refusal check.

    Returns a DuckDB relation for the last statement when it yields rows, else None.
    Errors come back as one-line ValueError / QueryRefused.
    """
    import duckdb
    stmts = check_statements(con, sql)
    try:
        for st in stmts[:-1]:
            con.execute(st.query)
        last = stmts[-1]
        if last.type.name not in ROW_TYPES:
            con.execute(last.query)
            return None
        return con.sql(last.query)
    except duckdb.Error as e:
        raise translate_error(e) from None


def fetch_arrow(con, sql: str) -> pa.Table:
    """execute() and fetch the last statement's rows as an Arrow table (empty when none)."""
    import duckdb
    rel = execute(con, sql)
    if rel is None:
        return pa.table({})
    try:
        return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
    except duckdb.Error as e:
        raise translate_error(e) from None


def fetch_batches(con, sql: str, rows_per_batch: int = 65536):
    """execute() and stream the result: (schema, iterator of RecordBatch), or (None, empty)."""
    import duckdb
    rel = execute(con, sql)
    if rel is None:
        return None, iter(())
    try:
        reader = (rel.to_arrow_reader(rows_per_batch) if hasattr(rel, "to_arrow_reader")
                  else rel.record_batch(rows_per_batch))
    except duckdb.Error as e:
        raise translate_error(e) from None

    def _it():
        try:
            yield from reader
        except duckdb.Error as e:
            raise translate_error(e) from None
        except OSError as e:  # pyarrow wraps errors raised inside the stream
            raise ValueError(f"SQL error: {one_line(e)}") from None
    return reader.schema, _it()


# ------------------------------------------------------------------ canned queries

@dataclass
class Canned:
    """One documented SQL file from specaudit/postmortem/queries/."""

    name: str
    title: str
    doc: str            # the header comment, without the leading '-- '
    params: dict        # name -> description (with its default)
    sql: str            # the whole file (header included: it is a comment)


def _parse_canned(name: str, text: str) -> Canned:
    head = []
    for line in text.splitlines():
        if line.startswith("--"):
            head.append(line[2:].removeprefix(" "))
        elif line.strip():
            break
        else:
            head.append("")
    title = head[0].strip() if head else name
    params = {}
    for ln in head:
        m = re.match(r"^param\s+([A-Za-z_]\w*)\s*:\s*(.*)$", ln.strip())
        if m:
            params[m.group(1)] = m.group(2)
    return Canned(name=name, title=title, doc="\n".join(head).strip(), params=params, sql=text)


def canned_queries() -> dict[str, Canned]:
    """All canned queries by name (file stem), in file-name order."""
    root = resources.files("specaudit.postmortem").joinpath("queries")
    out = {}
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".sql"):
            name = entry.name[:-4]
            out[name] = _parse_canned(name, entry.read_text(encoding="utf-8"))
    return out


def canned(name: str) -> Canned:
    """The canned query called name; ValueError listing the known ones otherwise."""
    qs = canned_queries()
    if name not in qs:
        raise ValueError(f"unknown canned query {name!r}; known: {', '.join(qs)} "
                         "(specaudit query --list describes them)")
    return qs[name]


def describe_canned() -> str:
    """The --list text: name, title, parameters."""
    lines = []
    for q in canned_queries().values():
        lines.append(f"{q.name:30s} {q.title}")
        for p, d in q.params.items():
            lines.append(f"{'':30s}   --param {p}=...  {d}")
    return "\n".join(lines)


# ------------------------------------------------------------- interactive shell

def _values_sql(name: str, table: pa.Table) -> str:
    """CREATE TABLE name AS VALUES ... for the duckdb CLI (it cannot take Arrow from us)."""
    cols = ", ".join(f"{f.name} {duck_type(f.type)}" for f in table.schema)
    out = [f"CREATE TABLE {name} ({cols});"]
    rows = table.to_pylist()
    for i in range(0, len(rows), 500):
        vals = []
        for r in rows[i:i + 500]:
            vals.append("(" + ", ".join(_literal(r[f.name]) for f in table.schema) + ")")
        out.append(f"INSERT INTO {name} VALUES {', '.join(vals)};")
    return "\n".join(out)


def _literal(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else "NULL"
    return sql_str(v)


def shell_setup_sql(paths, findings=None, dataset: Dataset | None = None, lock: bool = True,
                    duckdb_major: int = 2) -> str:
    """The SQL that gives the duckdb CLI the same views and settings as connect().

    lock=False leaves out the final `enable_external_access = false` and
    `lock_configuration = true`: the CLI's `.safe_mode`, run right after, does both (and
    a SET after it would fail as locked). allowed_paths is set before any view exists.
    """
    ds = dataset or find_dataset(paths)
    parts = [f"SET {k} = {v};" for k, v in HARDEN if k not in ("allow_extension_repositories",
                                                                "python_enable_replacements")]
    allowed = ", ".join(sql_str(f) for f in ds.files)
    parts.append(f"SET allowed_paths = [{allowed}];")
    if lock:
        parts.append("SET enable_external_access = false;")
    parts.append(_parquet_view("steps", ds.step_files, STEPS_SCHEMA) + ";")
    parts.append(_parquet_view("requests", ds.request_files, REQUESTS_SCHEMA) + ";")
    parts += [sql + ";" for sql in rollup_views_sql(ds, bins=0)]   # the shell may SET any bins
    parts.append(_values_sql("runs", runs_table(ds.runs, ds.rollup_notes)))
    parts.append(_values_sql("violations", findings_table(findings)))
    if duckdb_major >= 2:
        view = nodes_view_sql(DEPTHS_REDUCE)
    else:
        view = nodes_view_sql(f"CASE WHEN {CHAIN_TEST} THEN range(len(parents))::INTEGER[] ELSE _dep END",
                              source=_doubling_source())
    parts.append(view.strip() + ";")
    parts.append(AGREES_MACRO_SQL.strip() + ";")
    parts.append(FIGURES_VIEW_SQL.strip() + ";")
    if lock:
        parts.append("SET lock_configuration = true;")
    return "\n".join(parts)
