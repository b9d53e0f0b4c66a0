"""Rollup rows by Arrow compute and numpy: what writers run (trace/rollup.py: the definition).

trace/rollup.py's KIND_SQL is the reference definition of a rollup's rows; this module
gives the same rows in milliseconds instead of DuckDB's fixed planning cost, for the
writers (the Parquet sink at each flush, synth) and for verify_rollup's recomputation.
tests/test_rollup.py holds the two equal row for row; a change to one is a change to both.

    compute_rollup(table, "steps")   one data table's rollup rows (ROLLUP_SCHEMA)
    RollupAccumulator                a run's step rollup built flush by flush, written at close

Per step, depth and commit are trace/derived.py's (step_depth, step_commit), as in the SQL.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from specaudit.trace.derived import step_commit, step_depth
from specaudit.trace.rollup import (
    CALIB_BINS,
    KIND_COLUMNS,
    META_KEY,
    ROLLUP_SCHEMA,
    ROLLUP_VERSION,
    RUN_ROLLUP,
    STEP_COLUMNS,
    STEP_KINDS,
    TIME_GRAIN_S,
    fingerprint,
    fingerprint_of,
    rollup_path,
    rollup_problem,
    run_rollup_covers,
)
from specaudit.trace.safe_io import atomic_write_bytes


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


def steps_partials(t: pa.Table) -> dict:
    """kind -> the kind's rows of one step table, narrow (only KIND_COLUMNS[kind], no `kind`
    column): the per-flush work; merge_partials sums any number of them."""
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


def merge_partials(parts: list) -> dict:
    """Many steps_partials results -> one (same keys summed; min t0, max t1)."""
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


def partials_table(p: dict) -> pa.Table:
    """One merged partial -> the rollup rows (ROLLUP_SCHEMA), kinds in STEP_KINDS order."""
    return pa.concat_tables([_kind_table(k, p[k], {}) for k in STEP_KINDS])


def _steps_rollup(t: pa.Table) -> list[pa.Table]:
    p = steps_partials(t)
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



# ------------------------------------------------------------ the run's step rollup

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
            self.parts.append(steps_partials(t))
        if len(self.parts) >= COMPACT_EVERY:          # bounded memory on a long run
            self.parts = [merge_partials(self.parts)]

    def table(self) -> pa.Table:
        self._digest()
        if not self.parts:
            return ROLLUP_SCHEMA.empty_table()
        return partials_table(merge_partials(self.parts))

    def write(self, run_dir) -> Path | None:
        """Write run_dir/RUN_ROLLUP (atomically); None when no step file was added."""
        if not self.sources:
            return None
        fp = {"version": ROLLUP_VERSION, "time_grain_s": TIME_GRAIN_S, "sources": self.sources}
        path = Path(run_dir) / RUN_ROLLUP
        atomic_write_bytes(path, file_bytes(self.table(), fp))
        return path


# ------------------------------------------------------------ files: write, verify, refresh

def rollup_bytes(rollup: pa.Table, data_name: str, rows: int, size: int) -> bytes:
    """The rollup file's bytes: zstd Parquet with the data file's fingerprint."""
    return file_bytes(rollup, fingerprint(data_name, rows, size))


def file_bytes(rollup: pa.Table, fp: dict) -> bytes:
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
    fp, problem = fingerprint_of(rp)
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
