"""The checker's core: one run (or one group of its requests) checked from Arrow record
batches, and the run rules over the run's aggregates.

    check_batches(step_batches, run_id="r1", manifest=m, rules=rules, result=res, requests=req_batches)

check_batches is check_group over the whole run followed by check_run_rules over its
one partial. check_group keeps a per-request carry (a few integers per request), never
the rows: step rules see one batch at a time (vectorised), request rules see every
request of the group, and what the run rules read is summed into a partial (sums and
counts only, JSON-serialisable) that combines exactly over disjoint groups of requests
(combine_partials): the local checker makes one group per run, the Spark driver one per
request-id bucket. Reading files into batches is stream.py's; pooling tiny runs, pool.py's.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from specaudit.audit.check.exact_sum import exact_sum_partials
from specaudit.audit.check.facts import (  # noqa: F401  (re-exported: the readers and the pool import them from here)
    CLIENT_COLUMNS,
    REQUEST_BATCH_ROWS,
    FactStore,
    facts_in,
    request_facts,
)
from specaudit.audit.check.result import CheckResult, merge_result
from specaudit.audit.findings import Finding
from specaudit.invariants import Hits, compiled, screen
from specaudit.invariants import carry as carry_mod
from specaudit.invariants.carry import Carry
from specaudit.invariants.frame import StepFrame
from specaudit.invariants.request_frame import RequestFrame
from specaudit.invariants.run_frame import RunFrame
from specaudit.invariants.screen import screen_batch
from specaudit.trace.derived import per_request_means
from specaudit.trace.schema import manifest_conventions

BATCH_ROWS = 65536          # step rows per batch: ~200 MB of numpy work at N = 8
SUMS_KERNELS = "specaudit.audit.check.sums_kernels"   # RunSums.add in one C pass (big batches)


# ------------------------------------------------------------------ run config


def run_config(manifest: dict | None) -> tuple[int, int | None, dict]:
    """(eos_id, max_new_tokens or None, conventions) from a manifest."""
    cfg = (manifest or {}).get("config") or {}
    eos = cfg.get("eos_id", 0)
    eos = 0 if eos is None else int(eos)
    mnt = cfg.get("max_new_tokens")
    return eos, (int(mnt) if isinstance(mnt, (int, float)) and mnt is not None else None), \
        manifest_conventions(manifest or {})


# ------------------------------------------------------------------- the core


class RunSums:
    """Run aggregates, summed over batches, overall and per partition (file or rank)."""

    KEYS = ("steps", "drafted", "accepted", "accepted_counter", "committed", "commit_len_sum",
            "width_sum", "sampling_tests", "sampling_accepts", "sampling_expected",
            "sampling_var", "refused")

    def __init__(self):
        self.total = dict.fromkeys(self.KEYS, 0)
        self.parts: dict[str, dict] = {}
        self.depth_hist = np.zeros(1, dtype=np.int64)

    @staticmethod
    def per_row(f: StepFrame) -> dict:
        """Each step row's share of the run counters (all but the sampling sums): the one
        definition check_group sums per batch and the tiny-run pool sums per run."""
        return {"steps": np.ones(f.R, dtype=np.int64), "drafted": np.maximum(f.n - 1, 0),
                "accepted": np.maximum(f.true_depth, 0), "accepted_counter": f.accepted_depth,
                "committed": f.commit_n, "commit_len_sum": f.commit_len, "width_sum": np.maximum(f.budget, 0),
                # rows refused as broken (SA1xx): their counters are not evidence, so run
                # totals that include them are not compared with `reported` (see check_run_rules)
                "refused": (~f.ok).astype(np.int64)}

    @staticmethod
    def depth_bins(f: StepFrame) -> np.ndarray:
        """Each row's bin of the depth histogram (true depth, clipped to [0, 4096])."""
        return np.clip(f.true_depth, 0, 4096)

    def add(self, f: StepFrame, part: str) -> None:
        kern = compiled.kernels(SUMS_KERNELS, rows=f.R)
        if kern is not None:   # a big batch: the same sums and histogram in one C pass
            vals, h = kern.run_sums(f)
        else:
            vals = {k: int(v.sum()) for k, v in self.per_row(f).items()}
            h = np.bincount(self.depth_bins(f))
        vals.update(f.sampling_sums())
        self.add_sums(vals, h, part)

    def add_sums(self, vals: dict, h: np.ndarray, part: str) -> None:
        """Add one batch's counters and depth histogram (add's, or the screen's)."""
        p = self.parts.setdefault(part, dict.fromkeys(self.KEYS, 0))
        for k, v in vals.items():
            self.total[k] += v
            p[k] += v
        if len(h) > len(self.depth_hist):
            h[: len(self.depth_hist)] += self.depth_hist
            self.depth_hist = h
        else:
            self.depth_hist[: len(h)] += h


def emit_hits(rule, hits, f, result: CheckResult, *, kind: str, file=None) -> None:
    """Turn a rule's return value into findings."""
    if hits is None:
        return
    if isinstance(hits, Hits):
        rows = hits.rows()
        if kind == "step" and rule.family != "SA1":
            rows = rows[f.ok[rows]]
        if not len(rows):
            return
        cap = result.max_per_code
        have = result.counts[rule.code]
        take = rows if cap <= 0 else rows[: max(cap - have, 0)]
        for r in take:
            vals = hits.at(int(r))
            if kind == "step":
                fd = rule.make_finding(vals, run_id=f.run_id, request_id=str(f.request_id[r]),
                                       step=int(f.step[r]), file=file)
            elif kind == "request":
                fd = rule.make_finding(vals, run_id=f.run_id, request_id=str(f.request_id[r]), file=file)
            else:
                fd = rule.make_finding(vals, run_id=f.run_id, file=file)
            result.add(fd)
        # the rest only counted
        extra = len(rows) - len(take)
        if extra:
            result.counts[rule.code] += extra
            result.severities.setdefault(rule.code, rule.severity)
            result.names.setdefault(rule.code, rule.name)
        return
    for item in hits:
        if isinstance(item, Finding):
            result.add(item)
        else:
            d = dict(item)
            loc = {k: d.pop(k, None) for k in ("run_id", "request_id", "step", "file", "line")}
            if loc["run_id"] is None:
                loc["run_id"] = getattr(f, "run_id", None)
            if loc["file"] is None:
                loc["file"] = file
            result.add(rule.make_finding(d, **loc))


def check_batches(batches, *, run_id: str, manifest: dict | None, rules, result: CheckResult,
                  requests=None, complete: bool = True, incomplete_reason: str | None = None,
                  on_error=None) -> None:
    """The core: check one run from an iterable of step record batches (or
    (batch, file, partition) triples) and an iterable of requests batches (or None).

    Step batches must give each request's steps in step order across batches. This
    is check_group over the whole run (one group) followed by check_run_rules over
    its one partial: the Spark driver (specaudit.audit.spark) runs the same two
    functions, check_group once per (run, request bucket) and check_run_rules over
    the partials combined.
    """
    part = check_group(batches, run_id=run_id, manifest=manifest, rules=rules, result=result,
                       requests=requests, complete=complete)
    complete = part.pop("complete")
    check_run_rules(combine_partials([part]), run_id=run_id, manifest=manifest, rules=rules, result=result,
                    complete=complete, have_facts=requests is not None, incomplete_reason=incomplete_reason)


def check_group(batches, *, run_id: str, manifest: dict | None, rules, result: CheckResult,
                requests=None, complete=True, request_results: dict | None = None) -> dict:
    """Step and request rules over one group of a run's requests; returns its partial.

    A group is any set of whole requests (the whole run locally, one hash bucket of
    request ids on Spark): `batches` and `requests` hold every step row and requests
    row of those requests and no other. Step findings go to `result`; request
    findings too, unless `request_results` maps complete (True/False) to a result
    per assumption (the Spark driver learns whether a run is complete only after
    every file was read, so it keeps both and picks one per run afterwards).

    The partial (see group_partial) is sums and counts only: partials of disjoint
    groups combine (combine_partials) into the run's aggregates, exactly.

    Past carry.SPILL_SLOTS requests the carry pages out and the facts go to files
    (invariants/carry.py, facts.py), in a folder removed before this returns or raises.
    """
    eos_id, max_new, conv = run_config(manifest)
    by_scope = {s: [r for r in rules if r.scope == s] for s in ("step", "request", "run")}
    carry = Carry()
    try:   # a run with many requests spills to carry.spill: removed however this ends
        page = carry_mod.PAGE_SLOTS   # slots per page of the carry, per range of the join
        facts = None
        n_requests = 0
        if requests is not None:
            facts = request_facts(requests, carry, eos_id, FactStore(carry.spill, page))
            n_requests = facts.n
            result.requests += n_requests
            if n_requests > REQUEST_BATCH_ROWS:
                _release_memory()  # the table's decode buffers: give them back before the steps
        derived = RunSums()
        rows_seen = 0
        screened = screen.covers(by_scope["step"])
        _steady_heap()
        for item in batches:
            if isinstance(item, tuple):
                batch, file, part = item
            else:
                batch, file, part = item, None, "all"
            if batch.num_rows == 0:
                continue
            part = part if part is not None else "all"
            # a batch no step rule would report on: folded in one pass (invariants/screen.py)
            got = screen_batch(batch, run_id=run_id, carry=carry, eos_id=eos_id,
                               max_new_tokens=max_new) if screened else None
            if got is not None:
                rows_seen += batch.num_rows
                derived.add_sums(*got, part)
                continue
            f = StepFrame(batch, run_id=run_id, carry=carry, eos_id=eos_id, max_new_tokens=max_new,
                          manifest=manifest, conventions=conv, file=file, row_offset=rows_seen)
            rows_seen += batch.num_rows
            for rule in by_scope["step"]:
                emit_hits(rule, rule.check(f), f, result, kind="step", file=file)
            derived.add(f, part)
            f.finish_carry()
        result.steps += rows_seen
        if callable(complete):
            complete = complete()
        targets = request_results if request_results is not None else {bool(complete): result}
        sums = _request_rules(carry, facts, page, targets, by_scope["request"], run_id=run_id, eos_id=eos_id,
                              max_new_tokens=max_new, manifest=manifest or {})
    finally:
        carry.close()
    out = group_partial(derived, None, have_facts=facts is not None, sums=sums)
    out.update(steps_read=rows_seen, requests_read=n_requests, complete=bool(complete))
    return out


# slots per RequestFrame: a range of a paged carry (PAGE_SLOTS) is joined a quarter at a
# time, so the request rules' frames add little to the step phase's peak memory
FRAME_SLOTS = 16384


def _request_rules(carry: Carry, facts: FactStore | None, page: int, targets: dict, rules, *,
                   run_id: str, eos_id: int, max_new_tokens, manifest: dict) -> dict:
    """Request rules over the carry joined with the facts, read `page` slots at a time and
    joined FRAME_SLOTS at a time (one RequestFrame of every request when they fit in
    one): findings into targets[assume]
    (complete run or not) in the order one frame of every request would give them
    (per rule, in slot order: each range's are held per rule, then merged); returns the
    requests' sums for the partial (request_sums, added over the ranges)."""
    Q = carry.n
    spans = [(lo, min(lo + page, Q)) for lo in range(0, Q, page)] or [(0, 0)]
    staged = {(a, i): CheckResult(max_per_code=res.max_per_code) for a, res in targets.items()
              for i in range(len(rules))} if Q > min(page, FRAME_SLOTS) else None   # more than one frame
    sums = None
    for lo, hi in spans:
        chunk = facts.chunk(lo, hi) if facts is not None else None
        # a frame per FRAME_SLOTS slots of the range: the join's working memory stays small
        frames = [(a, min(a + FRAME_SLOTS, hi)) for a in range(lo, hi, FRAME_SLOTS)] or [(lo, hi)]
        for a, b in frames:
            table = chunk if len(frames) == 1 else facts_in(chunk, a, b)
            for assume, res in targets.items():
                rq = RequestFrame(carry, table, run_id=run_id, eos_id=eos_id, max_new_tokens=max_new_tokens,
                                  complete=assume and facts is not None, manifest=manifest, lo=a, hi=b)
                for i, rule in enumerate(rules):
                    emit_hits(rule, rule.check(rq), rq, staged[assume, i] if staged else res, kind="request")
            sums = request_sums(rq, have_facts=facts is not None, into=sums)
    if staged:
        for assume, res in targets.items():
            for i in range(len(rules)):
                merge_result(res, staged[assume, i])
    return sums


# --------------------------------------------------------- partial aggregates
#
# What run rules see is re-derived from sums and counts that add over disjoint groups
# of requests: the step counters, per-partition counters, the depth histogram, and
# for the per-request means the exact sum of the per-request ratios (kept as
# Shewchuk partials, so the combined mean is the correctly rounded mean whatever the
# grouping) and their count.

MEANS = (("per_request_mean_depth", "sum_true_depth"), ("per_request_mean_depth_counter", "sum_depth"),
         ("per_request_mean_commit", "sum_commit_n"), ("per_request_mean_commit_counter", "sum_commit_len"))


def _python_number(v):
    """numpy or Python number -> int, or float for the float sums (sampling)."""
    return int(v) if isinstance(v, (int, np.integer)) else float(v)


def group_partial(derived: RunSums, rq: RequestFrame | None, *, have_facts: bool, sums: dict | None = None) -> dict:
    """One group's sums and counts (plain Python types: JSON-serialisable); the
    requests' part from `rq`, or `sums` (request_sums of its ranges) when given."""
    out = {"total": {k: _python_number(v) for k, v in derived.total.items()},
           "partitions": {p: {k: _python_number(v) for k, v in d.items()} for p, d in derived.parts.items()},
           "depth_hist": [int(x) for x in derived.depth_hist.tolist()]}
    if sums is None and rq is not None:
        sums = request_sums(rq, have_facts=have_facts)
    if sums is None:
        sums = dict(requests=0, generated=0, first_tokens=0, n_real=0, means={k: [] for k, _ in MEANS})
    out.update(sums)
    return out


def request_sums(rq, *, have_facts: bool, into: dict | None = None) -> dict:
    """The requests' part of a partial over rq's requests, added to `into` (the same
    sums of other requests of the group) when given: counts add, the means' exact
    partials merge (exact_sum_partials: the combined sum is exact)."""
    real = ~rq.null_slot & rq.has_steps
    ns = np.maximum(rq.n_steps[real], 1)
    out = {"requests": int((rq.has_row | rq.has_steps).sum() - (rq.null_slot & rq.has_steps).sum()),
           "generated": int(np.maximum(rq.output_len[rq.has_row], 0).sum()) if have_facts else 0,
           "first_tokens": int(rq.has_row.sum()) if have_facts else 0,
           "n_real": int(real.sum())}
    # the per_request convention's terms (trace/derived.py), summed exactly
    prev = into["means"] if into is not None else {}
    out["means"] = {key: exact_sum_partials(per_request_means(ns, getattr(rq, col)[real]), prev.get(key, ()))
                    for key, col in MEANS}
    if into is not None:
        for k in ("requests", "generated", "first_tokens", "n_real"):
            out[k] += into[k]
    return out


def combine_partials(parts) -> dict:
    """Partials of disjoint groups of one run -> the partial of their union."""
    out = {"total": dict.fromkeys(RunSums.KEYS, 0), "partitions": {}, "depth_hist": [0], "requests": 0,
           "generated": 0, "first_tokens": 0, "n_real": 0, "means": {k: [] for k, _ in MEANS},
           "steps_read": 0, "requests_read": 0}
    for p in parts:
        for k, v in p["total"].items():
            out["total"][k] += v
        for name, d in p["partitions"].items():
            tgt = out["partitions"].setdefault(name, dict.fromkeys(RunSums.KEYS, 0))
            for k, v in d.items():
                tgt[k] += v
        h = p["depth_hist"]
        if len(h) > len(out["depth_hist"]):
            out["depth_hist"] += [0] * (len(h) - len(out["depth_hist"]))
        for i, v in enumerate(h):
            out["depth_hist"][i] += v
        for k in ("requests", "generated", "first_tokens", "n_real", "steps_read", "requests_read"):
            out[k] += p.get(k, 0)
        for k, ps in p["means"].items():
            out["means"][k] += ps
    return out


def check_run_rules(partial: dict, *, run_id: str, manifest: dict | None, rules, result: CheckResult,
                    complete: bool, have_facts: bool, incomplete_reason: str | None = None) -> None:
    """Run rules over a run's combined partial (complete: the run ended normally and
    every file of it was read; have_facts: its requests table could be opened)."""
    _, _, conv = run_config(manifest)
    d = dict(partial["total"])
    d["requests"] = partial["requests"]
    d["generated"] = partial["generated"] if have_facts else None
    d["first_tokens"] = partial["first_tokens"] if have_facts else None
    n = partial["n_real"]
    for key, _ in MEANS:
        d[key] = math.fsum(partial["means"][key]) / n if n else 0.0
    d["depth_hist"] = list(partial["depth_hist"])
    d["partitions"] = partial["partitions"]
    d["budget"] = int(((manifest or {}).get("config") or {}).get("budget") or 0)
    if d.get("refused"):
        # a row the step rules refused (SA1xx, reported there) makes every total an
        # unknown: comparing it with the engine's counter would blame the counter for
        # one corrupt row, so the aggregate rules are skipped for this run
        complete = False
        incomplete_reason = incomplete_reason or f"{d['refused']} step rows refused as broken"
    run = RunFrame(run_id, manifest, d, complete and have_facts, conv, incomplete_reason)
    for rule in rules:
        if rule.scope == "run":
            emit_hits(rule, rule.check(run), run, result, kind="run")


def _release_memory() -> None:
    """Return freed memory to the OS (Arrow's pool, and glibc's heap, which keeps
    freed blocks of large numpy temporaries): keeps peak RSS near the live data."""
    pa.default_memory_pool().release_unused()
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# glibc's mallopt parameters: the size from which a block is mmapped, and the free top
# of the heap kept before it is given back
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_HEAP_MMAP, _HEAP_TRIM = 32 << 20, 128 << 20


def _steady_heap() -> None:
    """glibc: each batch's arrays (R int64 each, 0.5 MB at 65536 rows) from the heap,
    and the heap kept between batches. By default a block of that size is mmapped until
    one is freed, and the freed top of the heap is given back past twice that: every
    batch's arrays then fault their pages in afresh (measured: the step phase's main
    thread ~10% slower on chain N=8). Blocks past 32 MB (glibc's own ceiling) still mmap,
    and at most 128 MB of free heap is kept (_release_memory still trims it all)."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, _HEAP_MMAP)
        libc.mallopt(_M_TRIM_THRESHOLD, _HEAP_TRIM)
    except (OSError, AttributeError):
        pass
