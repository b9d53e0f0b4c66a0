"""The Spark checker's task functions (run in the executors' Python workers) and their combine.

Two paths, chosen per run by specaudit.audit.spark_plan:

- whole runs (`mapInArrow` over run tasks, no shuffle): a task gets a few whole runs
  (their RunFiles as JSON text: spark_runs) and checks them with the local checker's own loop
  (`check_runs`: check_run per run, tiny runs pooled), so its findings and bookkeeping
  are the local checker's by construction; it returns every finding and one `result`
  row (files, bad files, incomplete runs, runs, steps, requests) that `merge_whole`
  adds to the driver's result;
- request buckets, for a run larger than a task (`mapInArrow` over files, then
  `groupBy(run, bucket).applyInArrow`): `read_file_rows` streams a file with the
  checker's reader and splits every batch by a stable hash of request_id; `check_bucket`
  runs `check_group` over one bucket's whole requests (request rules under both answers
  to "did the run end normally and was every file read", which no task knows);
  `combine_run` (driver) decides each run's completeness from its files' statuses and
  runs the run rules on the combined partials.

Every task function measures its own CPU (time.process_time of its Python worker, which
runs one task at a time) into `cpu` rows and file statuses, with the worker's pid and its
CPU since it was forked: Spark's task metrics count the JVM's side only, not the Python
worker's (combine_rows sums both: the tasks' own, and every worker's whole).
"""
from __future__ import annotations

import json
import os
import time
import zlib
from pathlib import Path

import pyarrow as pa

from specaudit.audit.check.core import BATCH_ROWS, check_group, check_run_rules, combine_partials
from specaudit.audit.check.pool import check_runs
from specaudit.audit.check.result import CheckResult, result_bad
from specaudit.audit.check.stream import STEP_READ_COLUMNS, iter_step_batches, open_requests, run_counts, run_start
from specaudit.audit.findings import Finding
from specaudit.audit.spark_plan import UriPath, is_uri
from specaudit.audit.spark_runs import runs_from_json
from specaudit.trace.schema import RunFiles

READ_SCHEMA = ("run_key INT, bucket INT, kind STRING, file_idx INT, seq INT, part STRING, file STRING, "
               "blob BINARY, info STRING")
_READ_ARROW = pa.schema([("run_key", pa.int32()), ("bucket", pa.int32()), ("kind", pa.string()),
                         ("file_idx", pa.int32()), ("seq", pa.int32()), ("part", pa.string()),
                         ("file", pa.string()), ("blob", pa.binary()), ("info", pa.string())])
# What the group and whole-run tasks return. row_kind: finding, status (a file read or
# not), partial (a bucket's sums), result (a whole-run task's bookkeeping), cpu (a task's
# own CPU seconds). when_complete: None for a finding that holds either way.
GROUP_SCHEMA = ("row_kind STRING, run_key INT, when_complete BOOLEAN, code STRING, name STRING, severity STRING, "
                "message STRING, run_id STRING, request_id STRING, step BIGINT, file STRING, line INT, "
                "`values` STRING, payload STRING, cpu_s DOUBLE")
_GROUP_ARROW = pa.schema([("row_kind", pa.string()), ("run_key", pa.int32()), ("when_complete", pa.bool_()),
                          ("code", pa.string()), ("name", pa.string()), ("severity", pa.string()),
                          ("message", pa.string()), ("run_id", pa.string()), ("request_id", pa.string()),
                          ("step", pa.int64()), ("file", pa.string()), ("line", pa.int32()),
                          ("values", pa.string()), ("payload", pa.string()), ("cpu_s", pa.float64())])
# The findings dataset: one row per finding (values: the numbers, a JSON object).
FINDINGS_COLUMNS = ("code", "name", "severity", "message", "run_id", "request_id", "step", "file", "line", "values")
OUT_ROWS = 4096   # GROUP rows per Arrow batch a task returns (a run with many findings)

_RULES_CACHE: dict = {}


def _rules(spec):
    """The catalog in a worker, loaded once per process for a (select, ignore, dirs, ep)."""
    if spec not in _RULES_CACHE:
        from specaudit.invariants import load_rules
        select, ignore, dirs, ep = spec
        _RULES_CACHE[spec] = [r for r in load_rules(select=select, ignore=ignore, dirs=dirs, entry_points=ep)
                              if r.scope != "source"]
    return _RULES_CACHE[spec]


# --------------------------------------------------------------- whole runs


def check_whole(members: list, rules, batch_rows: int = BATCH_ROWS, task_key: int = 0) -> list[dict]:
    """Whole runs [(run_key, RunFiles)] -> GROUP rows: every finding the local checker
    makes for them (uncapped) and one `result` row with the run bookkeeping."""
    res = CheckResult(max_per_code=0, rules=[r.code for r in rules])
    check_runs([rf for _, rf in members], rules, res, batch_rows, workers=1)
    out = [_finding_row(f, task_key, None) for f in res.findings]
    book = {"files_checked": res.files_checked, "bad_files": res.bad_files, "incomplete_runs": res.incomplete_runs,
            "runs": res.runs, "steps": res.steps, "requests": res.requests}
    out.append(_row("result", task_key, payload=json.dumps(book)))
    return out


def merge_whole(book: dict, result: CheckResult) -> None:
    """A whole-run task's `result` row (its payload, parsed) added to the driver's result
    (its findings come back through the findings dataset)."""
    result.files_checked.extend(book["files_checked"])
    result.bad_files.extend(tuple(b) for b in book["bad_files"])
    result.incomplete_runs.extend(tuple(r) for r in book["incomplete_runs"])
    result.runs.extend(book["runs"])
    result.steps += book["steps"]
    result.requests += book["requests"]


def _whole_task(spec, batch_rows):
    """mapInArrow function: task rows (task_key, runs: [(run_key, RunFiles)] as
    spark_runs JSON text) -> GROUP rows."""
    def run(batches):
        for b in batches:
            for t in b.to_pylist():
                t0 = time.process_time()
                rows = check_whole(runs_from_json(t["runs"]), _rules(spec), batch_rows, t["task_key"])
                for i in range(0, len(rows), OUT_ROWS):
                    yield pa.RecordBatch.from_pylist(rows[i:i + OUT_ROWS], schema=_GROUP_ARROW)
                yield pa.RecordBatch.from_pylist([_cpu_row(t["task_key"], t0)], schema=_GROUP_ARROW)
    return run


def _cpu_note(t0: float) -> dict:
    """CPU seconds since t0 in this process, its host:pid and all its CPU since it was
    forked (a reused Python worker: the largest figure per pid is the worker's whole CPU)."""
    now = time.process_time()
    return {"cpu_s": now - t0, "pid": f"{os.uname().nodename}:{os.getpid()}", "proc_cpu_s": now}


def _cpu_row(run_key: int, t0: float) -> dict:
    note = _cpu_note(t0)
    return _row("cpu", run_key, cpu_s=note.pop("cpu_s"), payload=json.dumps(note))


# ------------------------------------------------------- request buckets: read


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
    one status row (bucket -1) saying whether it was read whole, and why not, with the
    CPU seconds this process spent on the file (reading, splitting, the caller's batching)."""
    t0 = time.process_time()

    def cpu():
        return _cpu_note(t0)
    seq = 0
    fname = str(path)
    if kind == "steps":
        holder = RunFiles(run_dir=None, run_id="", step_files=[path])
        for item in iter_step_batches(holder, batch_rows, STEP_READ_COLUMNS):
            if isinstance(item, str):
                yield _status(run_key, file_idx, kind, fname, ok=True, cpu=cpu())
            elif hasattr(item, "reason"):
                yield _status(run_key, file_idx, kind, str(item.path), ok=False, reason=item.reason,
                              cpu=cpu())
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
                  reason=bad[0][1] if bad else None, opened=gen is not None, cpu=cpu())


def _split(run_key, kind, file_idx, seq, part, file, batch, buckets):
    import numpy as np
    if batch.num_rows == 0:
        return
    b = bucket_of(batch.column(batch.schema.get_field_index("request_id")), buckets)
    for v in np.unique(b):
        sub = batch if buckets <= 1 else batch.filter(pa.array(b == v))
        yield dict(run_key=run_key, bucket=int(v), kind=kind, file_idx=file_idx, seq=seq, part=part,
                   file=file, blob=_ipc(sub), info=None)


def _status(run_key, file_idx, kind, file, *, ok, reason=None, opened=True, cpu=None):
    info = {"kind": kind, "ok": ok, "reason": reason, "opened": opened, **(cpu or {})}
    return dict(run_key=run_key, bucket=-1, kind="status", file_idx=file_idx, seq=0, part="", file=file,
                blob=None, info=json.dumps(info))


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


# ------------------------------------------------------ request buckets: group


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
        t0 = time.process_time()
        rows = table.to_pylist()
        if not rows:
            return _GROUP_ARROW.empty_table()
        run = runs[rows[0]["run_key"]]
        out = check_bucket(rows, run, _rules(spec) if rows[0]["bucket"] >= 0 else [])
        out.append(_cpu_row(run["run_key"], t0))
        return pa.Table.from_pylist(out, schema=_GROUP_ARROW)
    return group


# ----------------------------------------------------- request buckets: combine


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


def combine_rows(runs, packs, tasks, rows, rules, result: CheckResult) -> tuple[dict, float]:
    """The driver's combine: every non-finding GROUP row of both paths (dicts) -> `result`
    gets each run's bookkeeping and run findings, in listing order (a whole-run task's
    runs at its first run key). runs: the plan; packs: the whole-run tasks; tasks: the
    bucketed runs' file tasks. Returns ({bucketed run_key: complete}, cpu): cpu's
    python_cpu_s is what the task functions spent, python_worker_cpu_s what their worker
    processes spent since forked (imports and Spark's framing included; on a session's
    first check, the Python side's whole cost)."""
    statuses, partials, books = {}, {}, {}
    task_cpu, procs = 0.0, {}

    def note(d: dict):
        nonlocal task_cpu
        task_cpu += d.get("cpu_s") or 0.0
        if "pid" in d:
            procs[d["pid"]] = max(procs.get(d["pid"], 0.0), d["proc_cpu_s"])
    for row in rows:
        kind, rk = row["row_kind"], row["run_key"]
        if kind == "status":
            s = json.loads(row["payload"])
            s["file"] = row["file"]
            statuses.setdefault(rk, []).append(s)
            note(s)
        elif kind == "partial":
            partials.setdefault(rk, []).append(json.loads(row["payload"]))
        elif kind == "result":
            books[rk] = json.loads(row["payload"])
        elif kind == "cpu":
            note({"cpu_s": row["cpu_s"], **json.loads(row["payload"])})
    whole = {k for p in packs for k, _ in p}
    order = {(t["run_key"], t["path"]): t["file_idx"] for t in tasks}
    complete = {}
    for key, rf in runs:
        if key in books:
            merge_whole(books[key], result)
        elif key not in whole:
            st = sorted(statuses.get(key, []), key=lambda s: (s["kind"] != "requests",
                                                              order.get((key, s["file"]), 1 << 30)))
            complete[key] = combine_run(rf, key, st, partials.get(key, []), rules, result)
    return complete, {"python_cpu_s": task_cpu, "python_worker_cpu_s": sum(procs.values())}

