"""The Spark checker's plan (driver side): which runs exist, and how each is cut into tasks.

    runs = plan(["s3a://bucket/traces/"], spark, result)     # [(run_key, RunFiles)]
    whole, grouped = split_runs(runs, task_bytes=RUN_TASK_BYTES)
    run_tasks(whole, target_bytes)      # whole runs, packed: one task checks each whole
    file_tasks(grouped)                 # a run too big for one task: one read task per file

Runs are independent, so a run that fits a task is checked whole there by the local
checker's own loop (no shuffle of its steps). Only a run larger than the task budget is
read file by file and regrouped by request (specaudit.audit.spark_tasks), which costs a
shuffle of every step but spreads one run over many cores.
"""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from specaudit.audit.check import iter_runs
from specaudit.audit.check.result import CheckResult
from specaudit.audit.spark_session import one_line
from specaudit.trace.safe_io import InputError
from specaudit.trace.schema import RunFiles, discover

# step bytes per request bucket at most: a group's steps are materialised in one task
BUCKET_BYTES = 64 << 20
# the task budget: a run of up to this many bytes (steps and requests files) is checked
# whole by one task, streamed in batches as the local checker does (memory: a batch plus
# per-request state), a few seconds of one core at the local checker's rate; a larger run
# is split into request buckets so that it spreads over the cores
RUN_TASK_BYTES = 256 << 20
# what a run costs a task beyond its bytes (files opened, the run's fixed work), counted
# as bytes when packing: a task of many empty or tiny runs is not one of "no bytes"
RUN_FIXED_BYTES = 64 << 10
# whole runs per task at most (a task's runs travel as JSON text in its one input row)
RUNS_PER_TASK = 4096
# request groups (and whole-run tasks) per executor core at least: enough tasks for every
# core, and hash collisions of (run, bucket) onto partitions even out (with one group
# per core, a collision leaves a core idle for a whole group)
GROUPS_PER_CORE = 4


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
        self.size = size            # bytes, as listed (sizes the tasks and request buckets)
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
        raise InputError(uri, f"cannot list with Spark: {one_line(e)}") from None
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
            rf.requests_file = UriPath(files["requests.parquet"], sizes.get(files["requests.parquet"], 0))
        rf.request_parts = sorted((UriPath(files[n], sizes.get(files[n], 0)) for n in files
                                   if n.startswith("requests-")),
                                  key=lambda p: step_file_key(PurePosixPath(p.name)))
        # the listed sizes, as discover records them: the local checker's pooling of tiny
        # runs reads them (a URI cannot be stat'ed)
        rf.sizes = {str(p): p.size for p in [*rf.step_files, *rf.request_files]}
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


def plan(paths, spark=None, result: CheckResult | None = None):
    """Discovery as check_paths does it: [(run_key, RunFiles)], unreadable paths -> SA000."""
    def find(p):
        return discover_uri(spark, str(p)) if is_uri(p) else discover([p])
    return list(enumerate(iter_runs(paths, result if result is not None else CheckResult(), find)))


# ------------------------------------------------------------ whole-run tasks


def run_bytes(rf: RunFiles) -> int:
    """A run's data: its step and requests files, in bytes (as listed or stat'ed)."""
    return sum(_file_size(p) for p in [*rf.step_files, *rf.request_files])


def split_runs(runs, task_bytes: int = RUN_TASK_BYTES) -> tuple[list, list]:
    """(whole, grouped): the runs that fit one task (run_bytes <= task_bytes) and those
    that do not, each [(run_key, RunFiles)] in listing order. task_bytes < 0: every run
    is grouped (the request-bucket path alone, as tests and benchmarks ask for it)."""
    whole, grouped = [], []
    for key, rf in runs:
        (whole if task_bytes >= 0 and run_bytes(rf) <= task_bytes else grouped).append((key, rf))
    return whole, grouped


def run_tasks(runs, target_bytes: int) -> list[list]:
    """Whole runs packed into tasks: [[(run_key, RunFiles), ...], ...]. A task takes
    consecutive runs (by key) until it holds target_bytes (each run counted as its bytes
    plus RUN_FIXED_BYTES) or RUNS_PER_TASK runs; a gap in the keys (a run that went to the grouped path) ends
    a task, so every task is a contiguous range of the listing and the driver merges the
    tasks' results in listing order."""
    tasks, cur, held, last = [], [], 0, None
    for key, rf in runs:
        if cur and (held >= target_bytes or len(cur) >= RUNS_PER_TASK or key != last + 1):
            tasks.append(cur)
            cur, held = [], 0
        cur.append((key, rf))
        held += run_bytes(rf) + RUN_FIXED_BYTES
        last = key
    if cur:
        tasks.append(cur)
    return tasks


def task_target(runs, cores: int, task_bytes: int = RUN_TASK_BYTES) -> int:
    """Bytes per whole-run task: the whole runs' share of GROUPS_PER_CORE tasks per core,
    at most the task budget (so a big dataset's tasks stay a few seconds each)."""
    total = sum(run_bytes(rf) + RUN_FIXED_BYTES for _, rf in runs)
    return max(1, min(max(task_bytes, 1), -(-total // (GROUPS_PER_CORE * max(cores, 1)))))


# ------------------------------------------------------ request-bucket tasks


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
