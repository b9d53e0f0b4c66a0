"""Derived mean accepted depth and commit length: the one definition, with the conventions.

trace-schema.md's words, as every figure derived from step rows reads them (the summary of
`specaudit run`, `specaudit diff`, the rollups and their SQL, the synthetic runs' `reported`):

    per step (the tensors, never the counters accepted_depth / commit_len under audit):
        depth  = len(accepted_path) - 1     accepted draft tokens, the root not counted
        commit = len(committed_tokens)      tokens appended: the accepted drafts + the bonus,
                                            cut at EOS or at the token limit
        a null list is a null value (SQL's len(NULL)); sums skip it, as SQL's sum does
    per run, under its declared conventions (run.json `conventions`, trace/schema.py):
        mean "pooled"        sum over every step / number of steps
        mean "per_request"   mean over requests with >= 1 step of (the request's sum / its steps)
        accept length        mean depth + 1 ("includes_bonus", the contract's) or mean depth
                             ("excludes_bonus": an engine whose accept length leaves the bonus out)

step_depth / step_commit are the pyarrow form, DEPTH_SQL / COMMIT_SQL the DuckDB form of the
same per-step definition; means() applies the conventions to per-request sums [R] (numpy),
mean_sql() in DuckDB (the post-mortem's figures view), and run_means() reads a run's step
files into them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from specaudit.trace.schema import manifest_conventions

MEANS = ("mean_accepted_depth", "mean_commit_len", "mean_accept_length")

# the per-step definitions in words (what a derived figure says it was derived from), and in
# DuckDB over a step relation ({s}: its alias and a dot, or nothing)
DEPTH_WORDS = "len(accepted_path) - 1"
COMMIT_WORDS = "len(committed_tokens)"
DEPTH_SQL = "(len({s}accepted_path) - 1)"
COMMIT_SQL = "len({s}committed_tokens)"


def depth_sql(alias: str | None = "s") -> str:
    """'(len(s.accepted_path) - 1)' for alias 's'; no alias: the bare column."""
    return DEPTH_SQL.format(s=f"{alias}." if alias else "")


def commit_sql(alias: str | None = "s") -> str:
    return COMMIT_SQL.format(s=f"{alias}." if alias else "")


def mean_sql(convention: str, total: str, steps: str, per_request_mean: str) -> str:
    """The run's mean under its declared `mean` convention, in DuckDB: `convention` an
    expression holding 'pooled' or 'per_request', `total` / `steps` the pooled mean's sum and
    step count, `per_request_mean` the mean over requests of (a request's sum / its steps)."""
    return f"CASE WHEN {convention} = 'per_request' THEN {per_request_mean} ELSE {total} / {steps} END"


def step_depth(accepted_path) -> pa.Array:
    """[rows] int64 len(accepted_path) - 1, null where the path is null."""
    import pyarrow.compute as pc  # (lazily, as trace/rollup.py: the writers import this module)
    return pc.subtract(pc.list_value_length(accepted_path).cast(pa.int64()), 1)


def step_commit(committed_tokens) -> pa.Array:
    """[rows] int64 len(committed_tokens), null where the list is null."""
    import pyarrow.compute as pc
    return pc.list_value_length(committed_tokens).cast(pa.int64())


def bonus(conventions: dict | None) -> int:
    """What the accept length adds to the mean depth: 1 (the bonus counted), 0 (excluded)."""
    return 0 if (conventions or {}).get("accept_length") == "excludes_bonus" else 1


def per_request_means(n_steps, sums) -> np.ndarray:
    """[R'] float64: each request's mean (its sum / its steps), for the requests with >= 1
    step, in order: the terms the per_request convention averages (means() takes their
    numpy mean; the checker sums them exactly, so its figure is the same however the
    requests are grouped)."""
    n = np.asarray(n_steps, dtype=np.float64).reshape(-1)
    s = np.asarray(sums, dtype=np.float64).reshape(-1)
    has = n > 0
    return s[has] / n[has]


def mean_in(convention: str | None, total, steps, per_request_mean):
    """A run's mean under its declared `mean` convention: `per_request_mean` for
    "per_request", else total / steps (pooled; None without steps)."""
    if convention == "per_request":
        return per_request_mean
    return total / steps if steps else None


def means(n_steps, depth_sum, commit_sum, conventions: dict | None) -> dict:
    """Per-request step counts and sums ([R] each, any integer or float arrays) -> the run's
    {mean_accepted_depth, mean_commit_len, mean_accept_length} under `conventions`
    (floats; None each when no request has a step)."""
    n = np.asarray(n_steps, dtype=np.float64).reshape(-1)
    D = np.asarray(depth_sum, dtype=np.float64).reshape(-1)
    C = np.asarray(commit_sum, dtype=np.float64).reshape(-1)
    has = n > 0
    if not has.any():
        return dict.fromkeys(MEANS)
    n, D, C = n[has], D[has], C[has]
    conv = (conventions or {}).get("mean")
    d = mean_in(conv, D.sum(), n.sum(), float(per_request_means(n, D).mean()) if conv == "per_request" else None)
    c = mean_in(conv, C.sum(), n.sum(), float(per_request_means(n, C).mean()) if conv == "per_request" else None)
    d, c = float(d), float(c)
    return {"mean_accepted_depth": d, "mean_commit_len": c, "mean_accept_length": d + bonus(conventions)}


def request_sums(table: pa.Table) -> pa.Table:
    """A step table (request_id, accepted_path, committed_tokens) -> one row per request:
    request_id, n (steps), depth_sum, commit_sum; requests in first-seen order."""
    import pyarrow.compute as pc
    t = pa.table({"request_id": table["request_id"],
                  "d": pc.fill_null(step_depth(table["accepted_path"]), 0),
                  "c": pc.fill_null(step_commit(table["committed_tokens"]), 0),
                  "one": pa.array(np.ones(table.num_rows, dtype=np.int64))})
    g = t.group_by("request_id", use_threads=False).aggregate([("one", "sum"), ("d", "sum"), ("c", "sum")])
    return g.rename_columns(["request_id", "n", "depth_sum", "commit_sum"])


def run_means(run_dir, conventions: dict | None = None) -> dict:
    """A run folder's derived means from its steps-*.parquet, under `conventions` (default:
    its run.json's declared ones); None each when it has no step row."""
    import json

    import pyarrow.parquet as pq
    run_dir = Path(run_dir)
    if conventions is None:
        man = run_dir / "run.json"
        conventions = manifest_conventions(json.loads(man.read_text()) if man.is_file() else {})
    cols = ["request_id", "accepted_path", "committed_tokens"]
    parts = [request_sums(pq.read_table(f, columns=cols)) for f in sorted(run_dir.glob("steps-*.parquet"))]
    if not parts:
        return dict.fromkeys(MEANS)
    # one file's sums per request, read file by file; a request's rows may span files
    g = pa.concat_tables(parts).group_by("request_id", use_threads=False).aggregate(
        [("n", "sum"), ("depth_sum", "sum"), ("commit_sum", "sum")])
    return means(g["n_sum"].to_numpy(), g["depth_sum_sum"].to_numpy(), g["commit_sum_sum"].to_numpy(), conventions)
