"""`specaudit check --engine spark`: the same catalog over a fleet's trace datasets on Spark.

    from pyspark.sql import SparkSession
    from specaudit.audit.spark import check_spark
    res = check_spark(SparkSession.builder.getOrCreate(), ["s3a://bucket/traces/"], out="findings/")
    res.exit_code, res.counts            # a CheckResult, as the local checker returns

One implementation, two drivers. The local checker (specaudit.audit.check) and this driver call
the same three functions of the core: `check_group` (step and request rules over a
group of whole requests, from Arrow record batches), `combine_partials` and
`check_run_rules` (run rules over sums and counts). Here:

1. discovery (driver): run folders, their run.json (read with Spark's binaryFile
   source for URIs, with the local discovery for plain paths) and step/requests files;
2. read (Spark tasks, `mapInArrow`, one task per file): each file is streamed by the
   checker's own reader, so batches, bad files (SA000) and files read part-way are
   exactly what the local checker sees; every batch is split by a stable hash of
   request_id into `buckets` groups and shipped as Arrow IPC (types kept exactly);
3. group (Spark tasks, `groupBy(run, bucket).applyInArrow`): `check_group` over the
   bucket's batches in file order; request rules are evaluated under both answers
   to "did the run end normally and was every file read", since no task knows;
4. combine (driver): file statuses and partials (a few hundred bytes per group) decide
   each run's completeness, `check_run_rules` runs on the combined partial, and
   the request findings of the other assumption are dropped.

No task holds more than one bucket of one run; the driver holds one partial per
group. Findings are written as a Parquet dataset (FINDINGS_COLUMNS).
"""
from __future__ import annotations

import json
import os
import sys
import warnings
import zlib
from pathlib import Path, PurePosixPath

import pyarrow as pa

from specaudit.audit.check import iter_runs
from specaudit.audit.check.core import BATCH_ROWS, check_group, check_run_rules, combine_partials
from specaudit.audit.check.result import CheckResult, result_bad
from specaudit.audit.check.stream import (
    STEP_READ_COLUMNS,
    iter_step_batches,
    open_requests,
    run_counts,
    run_start,
)
from specaudit.audit.findings import Finding
from specaudit.trace.schema import InputError, RunFiles, discover

# PySpark 4.x warns about pandas 3 on every Arrow function; the Arrow path uses no pandas
warnings.filterwarnings("ignore", message=r".*pandas >= 3\.0\.0.*", category=FutureWarning)

# step bytes per request bucket at most: a group's steps are materialised in one task
BUCKET_BYTES = 64 << 20
# request groups per executor core at least (smaller runs split further): the group stage
# has enough tasks for every core, and hash collisions of (run, bucket) onto partitions
# even out (with one group per core, a collision leaves a core idle for a whole group)
GROUPS_PER_CORE = 4

READ_SCHEMA = ("run_key INT, bucket INT, kind STRING, file_idx INT, seq INT, part STRING, file STRING, "
               "blob BINARY, info STRING")
_READ_ARROW = pa.schema([("run_key", pa.int32()), ("bucket", pa.int32()), ("kind", pa.string()),
                         ("file_idx", pa.int32()), ("seq", pa.int32()), ("part", pa.string()),
                         ("file", pa.string()), ("blob", pa.binary()), ("info", pa.string())])
GROUP_SCHEMA = ("row_kind STRING, run_key INT, when_complete BOOLEAN, code STRING, name STRING, severity STRING, "
                "message STRING, run_id STRING, request_id STRING, step BIGINT, file STRING, line INT, "
                "`values` STRING, payload STRING")
_GROUP_ARROW = pa.schema([("row_kind", pa.string()), ("run_key", pa.int32()), ("when_complete", pa.bool_()),
                          ("code", pa.string()), ("name", pa.string()), ("severity", pa.string()),
                          ("message", pa.string()), ("run_id", pa.string()), ("request_id", pa.string()),
                          ("step", pa.int64()), ("file", pa.string()), ("line", pa.int32()),
                          ("values", pa.string()), ("payload", pa.string())])
# The findings dataset: one row per finding (values: the numbers, a JSON object).
FINDINGS_COLUMNS = ("code", "name", "severity", "message", "run_id", "request_id", "step", "file", "line", "values")


class SparkCheckError(ValueError):
    """Spark failed (not the data): one line for the user (the CLI exits 2), the cause
    chained for logs."""


# ------------------------------------------------------------------ discovery


def is_uri(p) -> bool:
    return "://" in str(p)


def _uri_name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


class UriPath:
    """A file in an object store or HDFS: what the checker's readers need of a Path
    (name, str) plus the URI pyarrow opens (pyarrow.fs picks the file system)."""

    def __init__(self, uri: str, size: int = 0):
        self.uri = uri
        self.size = size            # bytes, as listed (sizes the request buckets)
        self.name = _uri_name(uri)
        self.stem = self.name.rsplit(".", 1)[0]

    def __str__(self):
        return self.uri

    def __fspath__(self):
        # pyarrow.fs infers the file system from the URI; Hadoop's s3a is pyarrow's s3
        return "s3://" + self.uri[6:] if self.uri.startswith("s3a://") else self.uri

    def __lt__(self, other):
        return self.uri < other.uri


def discover_uri(spark, uri: str) -> list[RunFiles]:
    """Runs under a URI, listed with Spark (binaryFile source, contents not read except
    run.json's). Same rules as schema.discover for folders, without symlinks and FIFOs."""
    from specaudit.trace.schema import manifest_from_bytes, step_file_key
    try:
        listing = (spark.read.format("binaryFile").option("recursiveFileLookup", "true")
                   .load(uri).select("path", "length").collect())
    except Exception as e:
        raise InputError(uri, f"cannot list with Spark: {_one_line(e)}") from None
    by_dir: dict[str, dict] = {}
    sizes = {row["path"]: int(row["length"] or 0) for row in listing}
    for row in listing:
        path = row["path"]
        d, name = path.rsplit("/", 1)
        if name in ("run.json", "requests.parquet") or (name.startswith(("steps-", "requests-"))
                                                        and name.endswith(".parquet")):
            by_dir.setdefault(d, {})[name] = path
    if not by_dir:
        raise InputError(uri, f"no trace runs found ({len(listing)} files, none a trace; expected "
                              "run_id=<id>/run.json and steps-*.parquet)")
    manifests = {}
    mpaths = [f["run.json"] for f in by_dir.values() if "run.json" in f]
    if mpaths:
        for row in spark.read.format("binaryFile").load(mpaths).select("path", "content").collect():
            manifests[row["path"]] = bytes(row["content"])
    runs, by_id = [], {}
    for d in sorted(by_dir):
        files = by_dir[d]
        base = _uri_name(d)
        rid = base.split("=", 1)[1] if base.startswith("run_id=") else base
        rf = RunFiles(run_dir=UriPath(d), run_id=rid)
        if "run.json" in files:
            try:
                rf.manifest = manifest_from_bytes(manifests.get(files["run.json"], b""), files["run.json"])
                rf.run_id = str(rf.manifest.get("run_id", rid))
            except InputError as e:
                rf.problems.append(e)
        else:
            rf.problems.append(InputError(d + "/run.json", "missing run.json (manifest)"))
        steps = [UriPath(files[n], sizes.get(files[n], 0)) for n in files if n.startswith("steps-")]
        rf.step_files = sorted(steps, key=lambda p: step_file_key(PurePosixPath(p.name)))
        if "requests.parquet" in files:
            rf.requests_file = UriPath(files["requests.parquet"])
        rf.request_parts = sorted((UriPath(files[n], sizes.get(files[n], 0)) for n in files
                                   if n.startswith("requests-")),
                                  key=lambda p: step_file_key(PurePosixPath(p.name)))
        first = by_id.setdefault(rf.run_id, d)
        if first != d:
            rf.duplicate_of = first
        runs.append(rf)
    return runs


def _file_size(p) -> int:
    try:
        return p.size if isinstance(p, UriPath) else os.stat(p).st_size
    except OSError:
        return 0


# ------------------------------------------------------------------- read (tasks)


def bucket_of(request_ids: pa.Array, buckets: int) -> pa.Array:
    """Stable bucket (crc32 of the id, mod buckets) per row; a null id -> bucket 0."""
    import numpy as np
    if buckets <= 1:
        return np.zeros(len(request_ids), dtype=np.int64)
    arr = request_ids.combine_chunks() if isinstance(request_ids, pa.ChunkedArray) else request_ids
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    per = np.asarray([zlib.crc32(str(v).encode()) % buckets for v in arr.dictionary.to_pylist()] + [0],
                     dtype=np.int64)
    codes = arr.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return per[codes]


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _from_ipc(blob: bytes) -> pa.RecordBatch:
    with pa.ipc.open_stream(pa.py_buffer(blob)) as r:
        batches = list(r)
    return batches[0] if len(batches) == 1 else pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def read_file_rows(run_key: int, kind: str, file_idx: int, path, buckets: int, batch_rows: int = BATCH_ROWS):
    """One trace file -> rows of READ_SCHEMA (dicts): its batches split by bucket, then
    one status row (bucket -1) saying whether it was read whole, and why not."""
    seq = 0
    fname = str(path)
    if kind == "steps":
        holder = RunFiles(run_dir=None, run_id="", step_files=[path])
        for item in iter_step_batches(holder, batch_rows, STEP_READ_COLUMNS):
            if isinstance(item, str):
                yield _status(run_key, file_idx, kind, fname, ok=True)
            elif hasattr(item, "reason"):
                yield _status(run_key, file_idx, kind, str(item.path), ok=False, reason=item.reason)
            else:
                batch, file, part = item
                yield from _split(run_key, "s", file_idx, seq, part, file, batch, buckets)
                seq += 1
        return
    scratch = CheckResult()
    holder = RunFiles(run_dir=None, run_id="", requests_file=path)
    gen, state = open_requests(holder, scratch, batch_rows)
    if gen is not None:
        for batch in gen:
            yield from _split(run_key, "r", file_idx, seq, "", fname, batch, buckets)
            seq += 1
    bad = scratch.bad_files
    yield _status(run_key, file_idx, kind, str(bad[0][0]) if bad else fname, ok=not bad,
                  reason=bad[0][1] if bad else None, opened=gen is not None)


def _split(run_key, kind, file_idx, seq, part, file, batch, buckets):
    import numpy as np
    if batch.num_rows == 0:
        return
    b = bucket_of(batch.column(batch.schema.get_field_index("request_id")), buckets)
    for v in np.unique(b):
        sub = batch if buckets <= 1 else batch.filter(pa.array(b == v))
        yield dict(run_key=run_key, bucket=int(v), kind=kind, file_idx=file_idx, seq=seq, part=part,
                   file=file, blob=_ipc(sub), info=None)


def _status(run_key, file_idx, kind, file, *, ok, reason=None, opened=True):
    return dict(run_key=run_key, bucket=-1, kind="status", file_idx=file_idx, seq=0, part="", file=file,
                blob=None, info=json.dumps({"kind": kind, "ok": ok, "reason": reason, "opened": opened}))


def _read_task(batch_rows):
    """mapInArrow function: task rows (run_key, kind, file_idx, path, buckets) -> READ rows."""
    def read(batches):
        for b in batches:
            for t in b.to_pylist():
                path = UriPath(t["path"]) if is_uri(t["path"]) else Path(t["path"])
                rows = []
                for r in read_file_rows(t["run_key"], t["kind"], t["file_idx"], path, t["buckets"], batch_rows):
                    rows.append(r)
                    if len(rows) >= 16:
                        yield pa.RecordBatch.from_pylist(rows, schema=_READ_ARROW)
                        rows = []
                if rows:
                    yield pa.RecordBatch.from_pylist(rows, schema=_READ_ARROW)
    return read


# ------------------------------------------------------------------ group (tasks)

_RULES_CACHE: dict = {}


def _rules(spec):
    """The catalog in a worker, loaded once per process for a (select, ignore, dirs, ep)."""
    if spec not in _RULES_CACHE:
        from specaudit.invariants import load_rules
        select, ignore, dirs, ep = spec
        _RULES_CACHE[spec] = [r for r in load_rules(select=select, ignore=ignore, dirs=dirs, entry_points=ep)
                              if r.scope != "source"]
    return _RULES_CACHE[spec]


def check_bucket(rows: list[dict], run: dict, rules) -> list[dict]:
    """One (run, bucket) group's READ rows -> GROUP rows: findings (when_complete None
    for step findings, True/False for request findings under each assumption) and one
    partial. run: {"run_key", "run_id", "manifest"}."""
    rk = run["run_key"]
    if rows and rows[0]["bucket"] < 0:
        return [_row("status", rk, file=r["file"], payload=r["info"]) for r in rows]
    rows = sorted(rows, key=lambda r: (r["kind"], r["file_idx"], r["seq"]))  # "r" before "s": requests first
    requests = [_from_ipc(r["blob"]) for r in rows if r["kind"] == "r"]
    steps = ((_from_ipc(r["blob"]), r["file"], r["part"]) for r in rows if r["kind"] == "s")
    res = CheckResult(max_per_code=0)
    by = {True: CheckResult(max_per_code=0), False: CheckResult(max_per_code=0)}
    part = check_group(steps, run_id=run["run_id"], manifest=run["manifest"], rules=rules, result=res,
                       requests=requests, complete=True, request_results=by)
    out = [_finding_row(f, rk, None) for f in res.findings]
    keys = {c: {_fkey(f) for f in r.findings} for c, r in by.items()}
    both = keys[True] & keys[False]
    for f in by[True].findings:
        out.append(_finding_row(f, rk, None if _fkey(f) in both else True))
    for f in by[False].findings:
        if _fkey(f) not in both:
            out.append(_finding_row(f, rk, False))
    part.pop("complete", None)
    out.append(_row("partial", rk, payload=json.dumps(part)))
    return out


def _fkey(f: Finding):
    return (f.code, f.message, f.request_id, f.step, f.file, json.dumps(f.values, sort_keys=True, default=str))


def _row(kind, run_key, **kw):
    r = dict.fromkeys(_GROUP_ARROW.names)
    r.update(row_kind=kind, run_key=run_key, **kw)
    return r


def _finding_row(f: Finding, run_key, when):
    return _row("finding", run_key, when_complete=when, code=f.code, name=f.name, severity=f.severity,
                message=f.message, run_id=f.run_id, request_id=f.request_id, step=f.step, file=f.file,
                line=f.line, values=json.dumps(f.values, sort_keys=True, default=str))


def _group_task(runs: dict, spec):
    """applyInArrow function over one (run_key, bucket) group."""
    def group(table):
        rows = table.to_pylist()
        if not rows:
            return _GROUP_ARROW.empty_table()
        run = runs[rows[0]["run_key"]]
        out = check_bucket(rows, run, _rules(spec) if rows[0]["bucket"] >= 0 else [])
        return pa.Table.from_pylist(out, schema=_GROUP_ARROW)
    return group


# --------------------------------------------------------------- combine (driver)


def combine_run(rf: RunFiles, run_key: int, statuses: list[dict], partials: list[dict], rules,
                result: CheckResult) -> bool:
    """check_run's bookkeeping and run rules for one run, from its files' statuses and
    its groups' partials. Returns whether the run counts as complete."""
    reasons = run_start(rf, result)
    if reasons is None:
        return False
    manifest = rf.manifest
    req_opened = req_ok = req_seen = False
    steps_ok, n_checked = True, 0
    for s in statuses:
        if not s["ok"]:
            result_bad(result, s["file"], s["reason"], rf.run_id)
        if s["kind"] == "requests":   # requests.parquet, or each of a running run's parts
            req_ok = (req_ok or not req_seen) and s["ok"]
            req_opened, req_seen = req_opened or s["opened"], True
        else:
            steps_ok &= s["ok"]
        if s["ok"]:
            result.files_checked.append(s["file"])
            n_checked += 1
    part = combine_partials(partials)
    result.steps += part["steps_read"]
    result.requests += part["requests_read"]
    complete = not reasons and req_opened and req_ok and steps_ok
    check_run_rules(part, run_id=rf.run_id, manifest=manifest, rules=rules, result=result, complete=complete,
                    have_facts=req_opened, incomplete_reason="; ".join(reasons) or None)
    if run_counts(n_checked > 0, req_opened, manifest):
        result.runs.append(rf.run_id)
    return complete


# ------------------------------------------------------------------------ driver


def plan(paths, spark=None, result: CheckResult | None = None):
    """Discovery as check_paths does it: [(run_key, RunFiles)], unreadable paths -> SA000."""
    def find(p):
        return discover_uri(spark, str(p)) if is_uri(p) else discover([p])
    return list(enumerate(iter_runs(paths, result if result is not None else CheckResult(), find)))


def _buckets(rf: RunFiles, bucket_bytes: int) -> int:
    size = sum(_file_size(p) for p in rf.step_files)
    return max(1, -(-size // max(bucket_bytes, 1)))


def file_tasks(runs, bucket_bytes: int = BUCKET_BYTES, buckets: int | None = None) -> list[dict]:
    """One read task per file: requests table first, then step files in file order."""
    tasks = []
    for key, rf in runs:
        b = buckets or _buckets(rf, bucket_bytes)
        parts = rf.request_files    # requests.parquet, or a running run's parts: indices < 1, in order
        for j, f in enumerate(parts):
            tasks.append(dict(run_key=key, kind="requests", file_idx=j + 1 - len(parts), path=str(f), buckets=b))
        for i, f in enumerate(rf.step_files):
            tasks.append(dict(run_key=key, kind="steps", file_idx=i + 1, path=str(f), buckets=b))
    return tasks


def spread_buckets(tasks: list[dict], min_groups: int) -> int:
    """Give each run at least its share (its step bytes / all step bytes) of min_groups
    buckets, so a dataset of few runs still gives every core several groups; sets each
    task's `size` (bytes) for scheduling. Returns the number of (run, bucket) groups."""
    size: dict = {}
    for t in tasks:
        t["size"] = _file_size(UriPath(t["path"]) if is_uri(t["path"]) else Path(t["path"]))
        if t["kind"] == "steps":
            size[t["run_key"]] = size.get(t["run_key"], 0) + t["size"]
    total = sum(size.values())
    per = {}
    for t in tasks:
        want = round(min_groups * size.get(t["run_key"], 0) / total) if total and min_groups else 1
        t["buckets"] = per.setdefault(t["run_key"], max(t["buckets"], want, 1))
    return sum(per.values())


def check_spark(spark, paths, select=(), ignore=(), *, out=None, invariants_dirs=(), entry_points: bool = True,
                max_per_code: int = 1000, batch_rows: int = BATCH_ROWS, buckets: int | None = None,
                bucket_bytes: int = BUCKET_BYTES) -> CheckResult:
    """Check every run under `paths` (folders or URIs Spark can list) on `spark`.

    Same findings as check_paths; `out` (a folder or URI) receives them all as a
    Parquet dataset (FINDINGS_COLUMNS), the result keeps max_per_code per code.
    Raises SparkCheckError when Spark itself fails (one line; the cause chained)."""
    from specaudit.invariants import load_rules
    spec = (tuple(select), tuple(ignore), tuple(str(d) for d in invariants_dirs), entry_points)
    rules = [r for r in load_rules(select=select, ignore=ignore, dirs=invariants_dirs, entry_points=entry_points)
             if r.scope != "source"]
    result = CheckResult(max_per_code=max_per_code, rules=[r.code for r in rules])
    driver = CheckResult(max_per_code=0, rules=result.rules)   # every finding the driver makes
    _refuse_out_over_input(out, paths)
    runs = plan(paths, spark, driver)
    tasks = file_tasks(runs, bucket_bytes, buckets)
    cores = max(1, spark.sparkContext.defaultParallelism)
    n_groups = spread_buckets(tasks, 0 if buckets else GROUPS_PER_CORE * cores)
    run_info = {k: {"run_key": k, "run_id": rf.run_id, "manifest": rf.manifest} for k, rf in runs}
    statuses = {k: [] for k, _ in runs}
    partials = {k: [] for k, _ in runs}
    try:
        grouped = None
        if tasks:
            # read stage: one partition per file, largest first (Spark starts partitions in
            # order, so the big files spread over the cores and the small ones fill in)
            cols = ("run_key", "kind", "file_idx", "path", "buckets")
            order = sorted(tasks, key=lambda t: -t["size"])
            rdd = spark.sparkContext.parallelize([tuple(t[c] for c in cols) for t in order], len(order))
            task_df = spark.createDataFrame(rdd, "run_key INT, kind STRING, file_idx INT, path STRING, buckets INT")
            read = task_df.mapInArrow(_read_task(batch_rows), READ_SCHEMA)
            # group stage: the (run, bucket) groups (and each run's status group) hashed onto a
            # fixed number of partitions, not spark.sql.shuffle.partitions, which adaptive
            # execution coalesces into fewer tasks than cores when the data is small; the
            # groupBy on the same keys reuses this partitioning (no second shuffle)
            read = read.repartition(max(1, min(n_groups + len(runs), GROUPS_PER_CORE * cores)), "run_key", "bucket")
            grouped = (read.groupBy("run_key", "bucket").applyInArrow(_group_task(run_info, spec), GROUP_SCHEMA)
                       .persist())
            for row in grouped.filter("row_kind != 'finding'").select("row_kind", "run_key", "file", "payload") \
                    .collect():
                if row["row_kind"] == "status":
                    s = json.loads(row["payload"])
                    s["file"] = row["file"]
                    statuses[row["run_key"]].append(s)
                else:
                    partials[row["run_key"]].append(json.loads(row["payload"]))
        complete = {}
        order = {(t["run_key"], t["path"]): t["file_idx"] for t in tasks}
        for key, rf in runs:
            st = sorted(statuses[key], key=lambda s: (s["kind"] != "requests", order.get((key, s["file"]), 1 << 30)))
            complete[key] = combine_run(rf, key, st, partials[key], rules, driver)
        for name in ("files_checked", "bad_files", "incomplete_runs", "runs"):
            getattr(result, name).extend(getattr(driver, name))
        result.steps, result.requests = driver.steps, driver.requests
        findings_df = _findings_frame(spark, grouped, complete, driver.findings)
        if out is not None:
            findings_df.write.mode("overwrite").parquet(str(out))
        _collect(findings_df, result, max_per_code)
        if grouped is not None:
            grouped.unpersist()
    except InputError:
        raise
    except Exception as e:
        raise SparkCheckError(_one_line(e)) from e
    return result


def _refuse_out_over_input(out, paths) -> None:
    """--out is overwritten: never a folder that holds, or is inside, a dataset read."""
    if out is None or is_uri(out):
        return
    o = Path(out).resolve()
    for p in paths:
        if is_uri(p):
            continue
        q = Path(p).resolve()
        if o == q or o in q.parents or q in o.parents:
            raise InputError(out, f"--out would overwrite the dataset it reads ({p}); give a separate folder")


def _findings_frame(spark, grouped, complete: dict, driver_findings):
    from pyspark.sql import functions as F
    cols = list(FINDINGS_COLUMNS)
    rows = [_finding_row(f, -1, None) for f in driver_findings]
    drv_df = spark.createDataFrame([tuple(r[c] for c in cols) for r in rows], _ddl(cols))
    if grouped is None:
        return drv_df
    runs_df = spark.createDataFrame([(k, bool(v)) for k, v in complete.items()] or [(-1, False)],
                                    "run_key INT, run_complete BOOLEAN")
    found = (grouped.filter("row_kind = 'finding'").join(F.broadcast(runs_df), "run_key")
             .filter(F.col("when_complete").isNull() | (F.col("when_complete") == F.col("run_complete")))
             .select(*[F.col(f"`{c}`") for c in cols]))
    return found.unionByName(drv_df)


def _ddl(cols):
    types = {"step": "BIGINT", "line": "INT"}
    return ", ".join(f"`{c}` {types.get(c, 'STRING')}" for c in cols)


def _collect(df, result: CheckResult, max_per_code: int) -> None:
    """Counts per code over every finding; up to max_per_code findings per code kept."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    # one job, not two: every kept row carries its code's count (a window count), and the
    # first row of each code is always kept (max_per_code 0: no cap)
    w = Window.partitionBy("code").orderBy("run_id", "request_id", "step", "file", "message")
    keep = (df.withColumn("_n", F.row_number().over(w))
            .withColumn("_count", F.count(F.lit(1)).over(Window.partitionBy("code"))))
    if max_per_code > 0:
        keep = keep.filter(F.col("_n") <= max_per_code)
    for row in keep.orderBy("code", "run_id", "request_id", "step", "file", "message").collect():
        d = row.asDict()
        n, count = d.pop("_n"), d.pop("_count")
        if n == 1:
            result.counts[d["code"]] += count
            result.severities.setdefault(d["code"], d["severity"])
            result.names.setdefault(d["code"], d["name"])
        vals = json.loads(d.pop("values") or "{}")
        result.findings.append(Finding(values=vals, **d))


def _one_line(e: Exception) -> str:
    msg = str(getattr(e, "desc", None) or e).strip()
    first = msg.splitlines()[0] if msg else type(e).__name__
    return first[:300]


def _cores(master: str | None) -> int:
    """Shuffle partitions for a master: its cores for local[N] / local[*] (more only adds
    task overhead: the group stage sets its own partitioning), else 8."""
    import re
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]|local", master or "")
    if not m:
        return 8
    return os.cpu_count() or 1 if m.group(1) in (None, "*") else int(m.group(1))


MASTER_CONNECT_S = 5.0   # a standalone master that does not accept a connection by then is unreachable


def check_master_reachable(master: str | None, timeout: float = MASTER_CONNECT_S) -> None:
    """spark://HOST:PORT[,HOST:PORT]: one TCP connect to each, before the JVM starts, so an
    unreachable master is one line (SparkCheckError) instead of a minute of Java retries
    and a stack trace that blames the Java version. Other masters (local[*], yarn,
    k8s://) are left to Spark."""
    import socket
    if not master or not master.startswith("spark://"):
        return
    problems = []
    for hp in master[len("spark://"):].split(","):
        host, _, port = hp.rpartition(":")
        if not host or not port.isdigit():
            raise SparkCheckError(f"--spark-master {master}: expected spark://HOST:PORT")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return   # one master answers: Spark picks the leader
        except OSError as e:
            problems.append(f"{hp}: {getattr(e, 'strerror', None) or e}")
    raise SparkCheckError(f"cannot reach the Spark master {master} ({'; '.join(problems)}); is it running?")


def session(master: str | None = "local[2]", app: str = "specaudit-check", **conf):
    """A SparkSession for the checker: workers run this interpreter (PYSPARK_PYTHON),
    Arrow enabled, Spark's own logging at ERROR so a failure prints one line. master
    None: the one spark-submit (or an existing session) gives."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    check_master_reachable(master)
    from pyspark.sql import SparkSession
    b = SparkSession.builder
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = "local[*]"   # not under spark-submit (which sets the master and starts the JVM)
    if master:
        b = b.master(master)
    b = (b.appName(app)
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true")
         .config("spark.sql.shuffle.partitions", str(conf.pop("shuffle_partitions", None) or _cores(master)))
         .config("spark.ui.enabled", "false")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.host", "127.0.0.1"))
    for k, v in conf.items():
        b = b.config(k, v)
    try:
        s = b.getOrCreate()
    except Exception as e:
        raise SparkCheckError(f"cannot start Spark ({master or 'from spark-submit'}): {_one_line(e)}; "
                              "PySpark 4.x needs Java 17 or 21 (java on PATH or JAVA_HOME)") from e
    s.sparkContext.setLogLevel("ERROR")
    return s
