"""Many tiny runs checked as one: pools of runs of one configuration, the workers that
check them, and check_runs, which checks a dataset's runs in listing order.

    check_runs(iter_runs(paths, listed), rules, result, listed=listed, workers=None)

A tiny run (one request, a few steps) costs check_run a fixed ~10 ms: two files
opened, a StepFrame built, every rule's numpy setup run for a handful of rows. A
dataset of thousands of them (one run per CI job, per request replayed) spends its
time there. So tiny runs that share a configuration are checked as a pool: their
step and requests tables concatenated (request ids made unique per run), the step
and request rules run once over the pool, the run rules once per run on that run's
own aggregates (summed per run, the same sums check_group makes). Pools of a large
dataset go to worker processes (fork), one pool per task; the parent merges each
run's result in listing order, so the output is the same with any number of workers.

The pool only confirms clean runs. A run with any finding in the pool, a file that
reads unusually, or any error in the pool itself, is checked again alone by
check_run, and only that result counts: pooling changes how fast a clean run is
confirmed clean, never what the checker reports (tests/test_check_pool.py checks
the findings, counts and per-run aggregates are the same with and without it).
Reading a pool's files is pool_read.py's.
"""
from __future__ import annotations

import logging
import os
from collections import deque

import numpy as np
import pyarrow as pa

from specaudit.audit.check.core import (
    BATCH_ROWS,
    MEANS,
    REQUEST_BATCH_ROWS,
    RunSums,
    check_run_rules,
    combine_partials,
    emit_hits,
    group_partial,
    request_facts,
    run_config,
)
from specaudit.audit.check.fallback import fell_back
from specaudit.audit.check.pool_read import int32_array, plain_rows, read_task, string_array, unique_request_ids
from specaudit.audit.check.result import CheckResult, merge_result
from specaudit.audit.check.stream import check_run, file_size
from specaudit.invariants.carry import Carry
from specaudit.invariants.frame import StepFrame
from specaudit.invariants.request_frame import RequestFrame
from specaudit.trace.schema import RunFiles

log = logging.getLogger(__name__)
# What the pool's except clauses catch: errors the data can cause in numpy / Arrow work on
# the pooled rows (a value out of range, an odd type, an index past an end, memory). A
# programming error (AttributeError, NameError, AssertionError, ImportError ...) is not
# among them: it propagates, as a bug, instead of every run silently being checked alone.
DATA_ERRORS = (ArithmeticError, LookupError, ValueError, TypeError, MemoryError, pa.ArrowException)

POOL_RUN_BYTES = 256 << 10   # a run whose step + requests files are below this may be pooled
POOL_RUNS = 256              # runs per pool (one task; the pooled frame holds their rows)
POOL_POLARS = True           # workers read a task's files with polars (read_with_polars); False: Arrow
_POOL_RUN_ID = "\x1fpool"    # the pooled frame's run id (no real run id holds \x1f)
_PER_RUN_KEYS = ("run_id", "started_at", "finished_at", "reported")   # manifest keys only run rules read
_WORKER: dict = {}           # what a forked worker inherits: rules, cap, batch_rows


def check_workers(workers: int | None = None) -> int:
    """Worker processes for pooled tiny runs: `workers`, else this process's cores (at
    most 8); 1 where fork is not available (the pools then run in this process)."""
    import multiprocessing as mp
    if "fork" not in mp.get_all_start_methods():
        return 1
    if workers is not None:
        return max(1, int(workers))
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def check_runs(runs, rules, result: CheckResult, batch_rows: int = BATCH_ROWS,
               listed: CheckResult | None = None, workers: int | None = None) -> None:
    """check_run over every run, in listing order, tiny runs of one configuration pooled.

    listed: where the `runs` iterator records what it finds while listing (iter_runs'
    SA000 and SA002); replayed into `result` in the order it came between the runs.
    workers: processes for pools (check_workers); started only once a dataset has
    filled a whole pool, so a small dataset never pays for them."""
    n_workers = check_workers(workers)
    # only the catalog's own rules are known to read nothing of a run but its rows, config
    # and conventions (tests/test_check_pool.py); a user rule (--invariants, an entry point)
    # may read the frame's run id or file, so with one loaded every run is checked alone
    pooling = all(type(r).__module__.startswith("specaudit.invariants.") for r in rules)
    configs: list = []              # the configurations seen (_pool_key)
    pending: dict[int, list] = {}   # configuration -> [(rf, slot)], not yet a task
    order: deque = deque()          # ("pool", slot), ("alone", rf), ("listed", findings, bad)
    tasks: list = []                # per task: a future, or the per-member results
    pool_exec = None

    def take_listed():
        if listed is not None and (listed.findings or listed.bad_files):
            order.append(("listed", list(listed.findings), list(listed.bad_files)))
            listed.findings.clear()
            listed.bad_files.clear()

    def submit(key, parallel):
        nonlocal pool_exec
        members = pending.pop(key)
        for i, (_, slot) in enumerate(members):
            slot[:2] = [len(tasks), i]
        rfs = [rf for rf, _ in members]
        if parallel and n_workers > 1 and pool_exec is None:
            pool_exec = _start_workers(n_workers, rules, result.max_per_code, batch_rows)
        if pool_exec is not None:
            tasks.append((pool_exec.submit(_pool_task, rfs), rfs))
        else:
            tasks.append(_pool_results(rfs, rules, result.max_per_code, batch_rows))

    def drain(limit):
        while len(order) > limit:
            item = order[0]
            if item[0] == "pool":
                slot = item[1]
                if slot[0] is None:        # its pool is not a task yet: make it one now
                    submit(slot[2], True)
                got = _task_result(tasks, slot[0])
                merge_result(result, got[slot[1]])
                got[slot[1]] = None        # merged: nothing of a checked run is kept
            elif item[0] == "alone":
                check_run(item[1], rules, result, batch_rows)
            else:
                result.bad_files.extend(item[2])
                for fd in item[1]:
                    result.add(fd)
            order.popleft()

    try:
        for rf in runs:
            take_listed()
            key = _pool_key(rf, configs) if pooling else None
            if key is None:
                order.append(("alone", rf))
            else:
                slot = [None, None, key]   # (task, member index) once submitted; its pool
                pending.setdefault(key, []).append((rf, slot))
                order.append(("pool", slot))
                if len(pending[key]) >= POOL_RUNS:
                    submit(key, True)
            if len(order) >= 4 * POOL_RUNS * n_workers:
                drain(2 * POOL_RUNS * n_workers)   # bounded: merge what is ready, keep listing
        take_listed()
        for key in list(pending):
            submit(key, False)
        drain(0)
    finally:
        if pool_exec is not None:
            pool_exec.shutdown(wait=True, cancel_futures=True)


def _task_result(tasks: list, t: int) -> list:
    """A task's per-member results (waiting for its worker; a worker that died, e.g.
    killed for memory, has its pool redone in this process)."""
    got = tasks[t]
    if isinstance(got, list):
        return got
    from concurrent.futures.process import BrokenProcessPool
    fut, members = got
    try:
        got = fut.result()
    except BrokenProcessPool as e:   # a worker died (killed for memory, say): its pool is redone here
        fell_back(log, "pool worker process", "checking its pool in this process", e)
        got = _pool_results(members, _WORKER["rules"], _WORKER["cap"], _WORKER["batch_rows"])
    tasks[t] = got
    return got


def _start_workers(n: int, rules, cap: int, batch_rows: int):
    import multiprocessing as mp
    import sys
    from concurrent.futures import ProcessPoolExecutor
    _WORKER.update(rules=rules, cap=cap, batch_rows=batch_rows)   # inherited by fork, never pickled
    # the workers read with polars (read_with_polars) unless this process has loaded it: its
    # threads do not survive a fork. This process itself never does (a later fork of it
    # would inherit them). polars is optional (pip install specaudit[fast]): without it the
    # workers read with Arrow from the start instead of failing an import per task
    use = POOL_POLARS and "polars" not in sys.modules and _importable("polars")
    if POOL_POLARS and not use:
        fell_back(log, "pool read (polars scan in workers)", "Arrow file by file",
                  "this process has loaded polars" if "polars" in sys.modules else "polars is not installed")
    return ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("fork"), initializer=_worker_init,
                               initargs=(use,))


def _importable(module: str) -> bool:
    """Whether `module` could be imported, without importing it."""
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _worker_init(use_polars: bool) -> None:
    _WORKER["polars"] = use_polars


def _pool_task(members: list) -> list:
    """A worker's task: one pool's per-member results."""
    return _pool_results(members, _WORKER["rules"], _WORKER["cap"], _WORKER["batch_rows"])


def _pool_key(rf: RunFiles, configs: list) -> int | None:
    """The configuration a tiny run pools under (its index in `configs`: the manifests
    without their per-run keys, compared with ==), or None when it is checked alone
    (anything unusual: problems, not finished, several files, big, odd manifest)."""
    m = rf.manifest
    if (rf.problems or not isinstance(m, dict) or not m.get("finished_at") or len(rf.step_files) != 1
            or len(rf.request_files) != 1 or "\x1f" in str(rf.run_id) or rf.duplicate_of is not None
            or _listed_size(rf, rf.step_files[0]) + _listed_size(rf, rf.request_files[0]) > POOL_RUN_BYTES):
        return None
    try:
        run_config(m)
    except (TypeError, ValueError, OverflowError):
        return None
    cfg = {k: v for k, v in m.items() if k not in _PER_RUN_KEYS}
    for i, c in enumerate(configs):
        if c == cfg:
            return i
    if len(configs) >= 64:   # many configurations: the rest are checked alone
        return None
    configs.append(cfg)
    return len(configs) - 1


def _listed_size(rf: RunFiles, path) -> int:
    """A file's size as discover saw it (a stat saved per file), else read now."""
    n = rf.sizes.get(str(path))
    return file_size(path) if n is None else n


def _pool_results(members: list, rules, cap: int, batch_rows: int) -> list:
    """Per member (RunFiles of one configuration), its CheckResult: from the pool when
    clean there, else from check_run on its own."""
    codes = [r.code for r in rules]
    clean = [False] * len(members)
    rows: list = [None] * len(members)   # per pooled member: (step rows, request rows)
    for idx, steps, st_n, reqs, rq_n in _pool_groups(members, batch_rows):
        ok = _check_pool([members[i] for i in idx], steps, st_n, reqs, rq_n, rules, codes, batch_rows)
        for i, c, a, b in zip(idx, ok, st_n, rq_n, strict=True):
            clean[i], rows[i] = c, (int(a), int(b))
    out = []
    for rf, c, n in zip(members, clean, rows, strict=True):
        res = CheckResult(max_per_code=cap, rules=codes)
        if c:
            res.steps, res.requests = n
            res.files_checked = [str(p) for p in rf.request_files] + [str(p) for p in rf.step_files]
            res.runs = [rf.run_id]
        else:
            check_run(rf, rules, res, batch_rows)
        out.append(res)
    return out


def _pool_groups(members: list, batch_rows: int):
    """The pools of a task: (member indices, steps table, per-member step rows, requests
    table, per-member request rows), each within batch_rows step rows, the members'
    rows in member order. A member in no pool is checked alone."""
    for read in read_task(members, bool(_WORKER.get("polars"))):
        try:
            idx, steps, st_n, reqs, rq_n = plain_rows(members, *read)
        # a run id no Arrow string can hold (UnicodeEncodeError: a ValueError), a column of
        # a type the row checks cannot compare (pa.ArrowException): each member alone
        except DATA_ERRORS as e:
            fell_back(log, "pool (plain rows)", "checking each run alone", e)
            continue
        s0 = np.concatenate([[0], np.cumsum(st_n)])
        q0 = np.concatenate([[0], np.cumsum(rq_n)])
        for a, b in _row_ranges(st_n, batch_rows):
            yield (idx[a:b], steps.slice(s0[a], s0[b] - s0[a]), st_n[a:b],
                   reqs.slice(q0[a], q0[b] - q0[a]), rq_n[a:b])


def _row_ranges(counts, limit: int) -> list[tuple[int, int]]:
    """Consecutive [a, b) ranges of members, each within `limit` rows (a member with more
    rows than that alone in its range)."""
    out, a, n = [], 0, 0
    for j, c in enumerate(counts):
        if j > a and n + c > limit:
            out.append((a, j))
            a, n = j, 0
        n += int(c)
    if a < len(counts):
        out.append((a, len(counts)))
    return out


def _check_pool(members, steps, st_n, reqs, rq_n, rules, codes, batch_rows: int) -> list[bool]:
    """Check a pool of tiny runs (RunFiles) of one configuration and schema, their rows
    in `steps` and `reqs` (st_n[k] and rq_n[k] rows of member k, in member order); per
    member, whether it came out clean (no finding of any severity). An error the rows
    can cause (DATA_ERRORS) makes every member come out not clean (each is then checked
    alone, where a real problem is reported or raised); any other error is a bug and
    propagates."""
    try:
        return _pool_clean(members, unique_request_ids(steps, st_n), unique_request_ids(reqs, rq_n), rules, codes,
                           batch_rows)
    except DATA_ERRORS as e:   # each member alone: check_run reports (or raises) it properly
        fell_back(log, "pool (pooled check)", "checking each run alone", e)
        return [False] * len(members)


def _pool_clean(members, steps, reqs, rules, codes, batch_rows: int) -> list[bool]:
    P = len(members)
    m0 = {k: v for k, v in members[0].manifest.items() if k not in _PER_RUN_KEYS}
    m0["run_id"] = _POOL_RUN_ID
    eos_id, max_new, conv = run_config(m0)
    pool = CheckResult(max_per_code=0, rules=codes)   # uncapped: every finding flags its run
    i = steps.schema.get_field_index("run_id")
    steps = steps.set_column(i, "run_id", string_array([_POOL_RUN_ID]).take(int32_array(np.zeros(steps.num_rows))))
    by_scope = {s: [r for r in rules if r.scope == s] for s in ("step", "request", "run")}
    carry = Carry()
    facts = request_facts(reqs.to_batches(max_chunksize=REQUEST_BATCH_ROWS), carry, eos_id)
    n_req = np.bincount(_slot_members(carry)[facts["idx"]], minlength=P)
    sums = {k: np.zeros(P, dtype=np.int64) for k in RunSums.KEYS}
    hist = np.zeros((P, 1), dtype=np.int64)
    done = 0
    for batch in steps.to_batches(max_chunksize=batch_rows):
        f = StepFrame(batch, run_id=_POOL_RUN_ID, carry=carry, eos_id=eos_id, max_new_tokens=max_new,
                      manifest=m0, conventions=conv, row_offset=done)
        done += batch.num_rows
        for rule in by_scope["step"]:
            emit_hits(rule, rule.check(f), f, pool, kind="step")
        run = _slot_members(carry)[f.req]                      # [R] pool member of each sorted row
        for k, v in RunSums.per_row(f).items():            # as RunSums.add, per member (sampled runs are not pooled)
            np.add.at(sums[k], run, np.asarray(v, dtype=np.int64))
        d = RunSums.depth_bins(f)
        H = max(hist.shape[1], int(d.max(initial=0)) + 1)
        h = np.zeros((P, H), dtype=np.int64)
        h[:, : hist.shape[1]] = hist
        np.add.at(h, (run, d), 1)
        hist = h
        f.finish_carry()
    rq = RequestFrame(carry, facts, run_id=_POOL_RUN_ID, eos_id=eos_id, max_new_tokens=max_new,
                      complete=True, manifest=m0)
    for rule in by_scope["request"]:
        emit_hits(rule, rule.check(rq), rq, pool, kind="request")
    clean = np.ones(P, dtype=bool)
    for fd in pool.findings:   # step and request findings: the member is in the request id
        k = str(fd.request_id or "").split("\x1f", 1)[0]
        if not k.isdigit() or int(k) >= P:
            return [False] * P
        clean[int(k)] = False
    slots = _slot_members(carry)
    for k, rf in enumerate(members):
        if not clean[k]:
            continue
        mine = slots == k
        total = {key: int(sums[key][k]) for key in RunSums.KEYS}
        h = hist[k]
        nz = np.flatnonzero(h)
        derived = _MemberSums(total, {rf.step_files[0].name: dict(total)} if total["steps"] else {},
                               h[: int(nz[-1]) + 1 if len(nz) else 1].copy())
        part = group_partial(derived, _MemberRequests(rq, mine), have_facts=True)
        part.update(steps_read=int(sums["steps"][k]), requests_read=int(n_req[k]))
        before = len(pool.findings)
        check_run_rules(combine_partials([part]), run_id=rf.run_id, manifest=rf.manifest, rules=rules,
                        result=pool, complete=True, have_facts=True)
        if len(pool.findings) > before:
            clean[k] = False
    return clean.tolist()


def _slot_members(carry: Carry) -> np.ndarray:
    """Pool member of each carry slot (-1 for the null slot)."""
    return np.fromiter((int(n.split("\x1f", 1)[0]) if "\x1f" in n else -1 for n in carry.names[: carry.n]),
                       dtype=np.int64, count=carry.n)


class _MemberSums:
    """One pool member's run aggregates, shaped as RunSums (what group_partial reads)."""

    def __init__(self, total: dict, parts: dict, depth_hist: np.ndarray):
        self.total, self.parts, self.depth_hist = total, parts, depth_hist


class _MemberRequests:
    """One pool member's slice of the pooled RequestFrame (what group_partial reads)."""

    def __init__(self, rq: RequestFrame, mine: np.ndarray):
        for k in ("null_slot", "has_steps", "has_row", "n_steps", "output_len", *(c for _, c in MEANS)):
            setattr(self, k, getattr(rq, k)[mine])
