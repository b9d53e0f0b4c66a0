"""`specaudit check`: re-derive every counter of a trace dataset and report what lies.

    from specaudit.audit.check import check_paths
    res = check_paths(["traces/"], select=("SA3",), ignore=())
    res.exit_code, res.counts, res.findings[:3], res.bad_files, res.incomplete_runs

The core, `check_batches`, is a function over Arrow record batches of one run, read
in file order (a request's steps in step order across batches), plus the run's
requests table and manifest: it keeps a per-request carry (a few integers per
request, paged out to a temporary folder past a limit), never the rows, so memory
stays bounded however large the run. Step rules see one batch at a time (vectorised),
request rules see every request of the run (a range of slots at a time for a run
with many), run rules see the re-derived aggregates. Files are streamed by row group.

Bad input never raises past check_paths: an unreadable or malformed file becomes a
finding SA000 (error, named file and reason) and the other files are still checked;
a run without finished_at or requests table is checked for what it holds and
reported as incomplete (SA001, info). check_paths raises InputError only when a
path does not exist or holds nothing that looks like a trace.

This module is the entry (check_paths, check_tables, check_runs, iter_runs); the parts,
one idea each: result.py (CheckResult), core.py (check_batches, check_group, the
partials and the run rules), facts.py (the requests table's per-request facts, spilled
to files by slot range for a run with many requests), exact_sum.py (exact float sums
for the means), stream.py
(one run's files streamed: check_run), pool.py (many tiny runs checked as one, and the
worker processes), pool_read.py (reading a pool's files), arrow_pool.py (the Arrow memory
pool `specaudit check` runs with).
"""
from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from specaudit.audit.check.core import BATCH_ROWS, check_batches
from specaudit.audit.check.pool import check_runs
from specaudit.audit.check.result import CheckResult, result_bad
from specaudit.audit.check.stream import STEP_READ_COLUMNS
from specaudit.invariants import load_rules
from specaudit.trace.safe_io import InputError
from specaudit.trace.schema import RunFiles, discover

__all__ = ["CheckResult", "check_paths", "check_runs", "check_tables", "iter_runs"]


def check_paths(paths, select=(), ignore=(), *, invariants_dirs=(), entry_points: bool = True,
                max_per_code: int = 1000, batch_rows: int = BATCH_ROWS, workers: int | None = None,
                progress=None) -> CheckResult:
    """Check every run under the given paths (dataset folders, run folders, files).

    Never raises for bad data: a path that does not exist or holds no trace, and
    every unreadable file, becomes an SA000 finding and a `bad_files` entry; when
    nothing could be checked, `exit_code` is 2. Bad rule files (--invariants) raise
    InputError. progress: callable(rows), told the step rows as they are checked, each
    row once (a progress bar's update), while check_paths runs.
    """
    rules = [r for r in load_rules(select=select, ignore=ignore, dirs=invariants_dirs,
                                   entry_points=entry_points) if r.scope != "source"]
    result = CheckResult(max_per_code=max_per_code, rules=[r.code for r in rules], on_rows=progress)
    # what listing finds (SA000, SA002) goes to `listed` first: check_runs replays it in
    # order between the runs, as the pooled runs are checked later than they are listed
    listed = CheckResult(max_per_code=0, rules=result.rules)
    try:
        check_runs(iter_runs(paths, listed), rules, result, batch_rows, listed=listed, workers=workers)
    finally:
        result.on_rows = None   # the result outlives the check: nothing more to tell
    return result


def iter_runs(paths, result: CheckResult, discover_fn=None):
    """The runs under the given paths, each once, in order: a path that cannot be
    listed is SA000; a run id seen in an earlier folder is SA002. Shared by
    check_paths and the Spark driver (which lists URIs with Spark: discover_fn)."""
    discover_fn = discover_fn or (lambda p: discover([p]))
    seen = set()
    first_key: dict[str, object] = {}   # run id -> the key of the first folder holding it
    for p in paths:
        try:
            runs = discover_fn(p)
        except InputError as e:
            result_bad(result, e.path, e.reason)
            continue
        for rf in runs:
            key = _run_key(rf)
            if key in seen:
                continue
            seen.add(key)
            first_k, first = first_key.setdefault(rf.run_id, (key, rf.run_dir))
            if key != first_k and "SA002" in result.rules:
                from specaudit.invariants import get_rule
                result.add(get_rule("SA002").finding(run_id=rf.run_id, file=str(rf.run_dir), first=str(first),
                                                     run_id_again=rf.run_id))
            yield rf


def _run_key(rf: RunFiles):
    """A run folder's identity: its real path (discover's, else resolved here), or a URI."""
    if rf.real_dir is not None:
        return rf.real_dir
    d = rf.run_dir
    return os.path.realpath(d) if isinstance(d, (str, Path)) else str(d)


def check_tables(steps: pa.Table, requests: pa.Table | None, manifest: dict | None, *, select=(),
                 ignore=(), rules=None, batch_rows: int = BATCH_ROWS, max_per_code: int = 1000) -> CheckResult:
    """Check one run held in memory (tests, fixtures, other tools' rows)."""
    if rules is None:
        rules = [r for r in load_rules(select=select, ignore=ignore, entry_points=False) if r.scope != "source"]
    result = CheckResult(max_per_code=max_per_code, rules=[r.code for r in rules])
    run_id = (manifest or {}).get("run_id") or "memory"
    complete = bool(manifest and manifest.get("finished_at")) and requests is not None
    cols = [c for c in STEP_READ_COLUMNS if c in steps.schema.names]
    batches = [(b, None, "all") for b in steps.select(cols).to_batches(max_chunksize=batch_rows)]
    check_batches(batches, run_id=run_id, manifest=manifest, rules=rules, result=result,
                  requests=requests.to_batches() if requests is not None else None, complete=complete)
    result.files_checked.append("<memory>")
    result.runs.append(run_id)
    return result
