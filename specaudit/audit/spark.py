"""`specaudit check --engine spark`: the same catalog over a fleet's trace datasets on Spark.

    from specaudit.audit.spark import check_spark
    from specaudit.audit.spark_session import session
    res = check_spark(session("local[2]"), ["s3a://bucket/traces/"], out="findings/")
    res.exit_code, res.counts            # a CheckResult, as the local checker returns

One implementation, two drivers: the local checker's code (specaudit.audit.check) runs in the
Spark tasks. Runs are independent, so the job is cut by run:

1. discovery (driver, spark_plan): run folders, their run.json (read with Spark's
   binaryFile source for URIs, with the local discovery for plain paths) and files;
2. whole runs (a run of at most `task_bytes`, the usual case): consecutive runs packed
   into tasks (`mapInArrow`, one partition per task, no shuffle; a task's RunFiles
   travel as JSON text, spark_runs, never pickled); a task checks its runs
   with the local checker's loop (check_runs) and returns every finding and the runs'
   bookkeeping: the local checker's output by construction, at its cost per step;
3. request buckets (a run larger than a task, so that it spreads over the cores): one
   read task per file splits every batch by a stable hash of request_id, then
   `groupBy(run, bucket).applyInArrow` runs `check_group` over each bucket's whole
   requests and returns findings and a partial (sums and counts);
4. combine (driver): whole-run results merged in listing order; for a bucketed run,
   file statuses and partials decide its completeness and `check_run_rules` runs on
   the combined partial (spark_tasks.combine_run).

No task holds more than one bucket of one big run or one task's worth of whole runs;
the driver holds one partial per group and one result per whole-run task. Findings are
written as a Parquet dataset (FINDINGS_COLUMNS).
"""
from __future__ import annotations

import json
import warnings
from functools import reduce
from pathlib import Path

from specaudit.audit.check.core import BATCH_ROWS
from specaudit.audit.check.result import CheckResult
from specaudit.audit.findings import Finding
from specaudit.audit.spark_plan import (
    BUCKET_BYTES,
    GROUPS_PER_CORE,
    RUN_TASK_BYTES,
    file_tasks,
    is_uri,
    plan,
    run_bytes,
    run_tasks,
    split_runs,
    spread_buckets,
    task_target,
)
from specaudit.audit.spark_runs import runs_to_json
from specaudit.audit.spark_session import SparkCheckError, one_line
from specaudit.audit.spark_tasks import (
    FINDINGS_COLUMNS,
    GROUP_SCHEMA,
    READ_SCHEMA,
    _finding_row,
    _group_task,
    _read_task,
    _whole_task,
    combine_rows,
)
from specaudit.trace.safe_io import InputError

# PySpark 4.x warns about pandas 3 on every Arrow function; the Arrow path uses no pandas
warnings.filterwarnings("ignore", message=r".*pandas >= 3\.0\.0.*", category=FutureWarning)


def check_spark(spark, paths, select=(), ignore=(), *, out=None, invariants_dirs=(), entry_points: bool = True,
                max_per_code: int = 1000, batch_rows: int = BATCH_ROWS, buckets: int | None = None,
                bucket_bytes: int = BUCKET_BYTES, task_bytes: int = RUN_TASK_BYTES,
                stats: dict | None = None) -> CheckResult:
    """Check every run under `paths` (folders or URIs Spark can list) on `spark`.

    Same findings as check_paths; `out` (a folder or URI) receives them all as a
    Parquet dataset (FINDINGS_COLUMNS), the result keeps max_per_code per code.
    task_bytes: a run of at most this many bytes is checked whole by one task (-1: every
    run by request buckets); buckets / bucket_bytes: how a bigger run is split.
    stats (a dict, optional) receives how the job was cut (runs_whole, runs_grouped,
    whole_tasks, groups) and the CPU of the Python side (combine_rows: python_cpu_s,
    python_worker_cpu_s), which Spark's task metrics do not count.
    Raises SparkCheckError when Spark itself fails (one line; the cause chained)."""
    from specaudit.invariants import load_rules
    spec = (tuple(select), tuple(ignore), tuple(str(d) for d in invariants_dirs), entry_points)
    rules = [r for r in load_rules(select=select, ignore=ignore, dirs=invariants_dirs, entry_points=entry_points)
             if r.scope != "source"]
    result = CheckResult(max_per_code=max_per_code, rules=[r.code for r in rules])
    driver = CheckResult(max_per_code=0, rules=result.rules)   # every finding the driver makes
    _refuse_out_over_input(out, paths)
    runs = plan(paths, spark, driver)
    cores = max(1, spark.sparkContext.defaultParallelism)
    whole, big = split_runs(runs, task_bytes)
    packs = run_tasks(whole, task_target(whole, cores, task_bytes))
    tasks = file_tasks(big, bucket_bytes, buckets)
    n_groups = spread_buckets(tasks, 0 if buckets else GROUPS_PER_CORE * cores)
    run_info = {k: {"run_key": k, "run_id": rf.run_id, "manifest": rf.manifest} for k, rf in big}
    try:
        frames = []
        if packs:
            frames.append(_whole_frame(spark, packs, spec, batch_rows))
        if tasks:
            frames.append(_bucket_frame(spark, tasks, n_groups + len(big), cores, run_info, spec, batch_rows))
        rows = reduce(lambda a, b: a.unionByName(b), frames).persist() if frames else None
        got = [] if rows is None else [
            r.asDict() for r in rows.filter("row_kind != 'finding'")
            .select("row_kind", "run_key", "file", "payload", "cpu_s").collect()]
        complete, cpu = combine_rows(runs, packs, tasks, got, rules, driver)
        for name in ("files_checked", "bad_files", "incomplete_runs", "runs"):
            getattr(result, name).extend(getattr(driver, name))
        result.steps, result.requests = driver.steps, driver.requests
        findings_df = _findings_frame(spark, rows, complete, driver.findings)
        if out is not None:
            findings_df.write.mode("overwrite").parquet(str(out))
        _collect(findings_df, result, max_per_code)
        if rows is not None:
            rows.unpersist()
    except InputError:
        raise
    except Exception as e:
        raise SparkCheckError(one_line(e)) from e
    if stats is not None:
        stats.update(runs_whole=len(whole), runs_grouped=len(big), whole_tasks=len(packs), groups=n_groups,
                     **cpu)
    return result


def _whole_frame(spark, packs, spec, batch_rows: int):
    """Whole-run tasks: one partition per task, the largest first (Spark starts partitions
    in order, so the big tasks spread over the cores and the small ones fill in)."""
    order = sorted(packs, key=lambda p: -sum(run_bytes(rf) for _, rf in p))
    rdd = spark.sparkContext.parallelize([(p[0][0], runs_to_json(p)) for p in order], len(order))
    task_df = spark.createDataFrame(rdd, "task_key INT, runs STRING")
    return task_df.mapInArrow(_whole_task(spec, batch_rows), GROUP_SCHEMA)


def _bucket_frame(spark, tasks, n_groups: int, cores: int, run_info: dict, spec, batch_rows: int):
    """Request buckets of the runs too big for one task: read (one partition per file,
    largest first), then the (run, bucket) groups hashed onto a fixed number of
    partitions, not spark.sql.shuffle.partitions, which adaptive execution coalesces into
    fewer tasks than cores when the data is small; the groupBy on the same keys reuses
    this partitioning (no second shuffle)."""
    cols = ("run_key", "kind", "file_idx", "path", "buckets")
    order = sorted(tasks, key=lambda t: -t["size"])
    rdd = spark.sparkContext.parallelize([tuple(t[c] for c in cols) for t in order], len(order))
    task_df = spark.createDataFrame(rdd, "run_key INT, kind STRING, file_idx INT, path STRING, buckets INT")
    read = task_df.mapInArrow(_read_task(batch_rows), READ_SCHEMA)
    read = read.repartition(max(1, min(n_groups, GROUPS_PER_CORE * cores)), "run_key", "bucket")
    return read.groupBy("run_key", "bucket").applyInArrow(_group_task(run_info, spec), GROUP_SCHEMA)


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
    # a grouped run's request findings hold under one answer to "was it complete"; a
    # whole-run task's findings (when_complete null, run_key its task's) hold as they are
    runs_df = spark.createDataFrame([(k, bool(v)) for k, v in complete.items()] or [(-1, False)],
                                    "run_key INT, run_complete BOOLEAN")
    found = (grouped.filter("row_kind = 'finding'").join(F.broadcast(runs_df), "run_key", "left")
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
