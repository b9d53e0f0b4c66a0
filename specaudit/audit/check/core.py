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
from specaudit.audit.check.result import CheckResult
from specaudit.audit.findings import Finding
from specaudit.invariants import Hits
from specaudit.invariants.carry import Carry, token_mix
from specaudit.invariants.frame import StepFrame, list_lengths, list_parts, list_values, to_np
from specaudit.invariants.request_frame import RequestFrame
from specaudit.invariants.run_frame import RunFrame
from specaudit.trace.derived import per_request_means
from specaudit.trace.schema import manifest_conventions

BATCH_ROWS = 65536          # step rows per batch: ~200 MB of numpy work at N = 8
REQUEST_BATCH_ROWS = 8192   # request rows per batch: each holds whole outputs
# Optional client-side per-request columns a requests table may carry; SA410 compares
# them with what the request's steps add up to.
CLIENT_COLUMNS = ("completion_tokens", "verify_steps", "accept_length")


# ------------------------------------------------------------------ run config


def run_config(manifest: dict | None) -> tuple[int, int | None, dict]:
    """(eos_id, max_new_tokens or None, conventions) from a manifest."""
    cfg = (manifest or {}).get("config") or {}
    eos = cfg.get("eos_id", 0)
    eos = 0 if eos is None else int(eos)
    mnt = cfg.get("max_new_tokens")
    return eos, (int(mnt) if isinstance(mnt, (int, float)) and mnt is not None else None), \
        manifest_conventions(manifest or {})


# ------------------------------------------------------------- request table


def request_facts(batches, carry: Carry, eos_id: int) -> dict:
    """Per-request facts from the requests table, streamed by batch.

    Returns arrays keyed like RequestFrame's (idx = carry index of each row)."""
    out: dict[str, _Column] = {}

    def put(k, v):
        # int32 is enough for every per-request fact (lengths, tokens, indices)
        if isinstance(v, np.ndarray) and v.dtype == np.int64 and k not in ("idx",):
            v = v.astype(np.int32)
        if k not in out:
            out[k] = _Column(v.dtype)
        out[k].append(v)

    for b in batches:
        names = b.schema.names
        col = {n: b.column(i) for i, n in enumerate(names)}
        idx = carry.index(_request_id_strings(col["request_id"]))
        put("idx", idx)
        R = b.num_rows
        plen = list_lengths(col["prompt_tokens"])
        put("prompt_len", plen)
        ft = to_np(col["first_token"], -1).astype(np.int64)
        put("first_token", ft)
        off, vals, olen = list_parts(col["output_tokens"])
        put("output_len", olen)
        # fingerprint of output_tokens[1:] at positions 1.., as the commits' fingerprint
        ln = np.maximum(olen, 0)
        start = np.cumsum(ln) - ln
        # the row of flat entries j (only the few that are looked up: no per-token row array)
        row_of = lambda j, ends=start + ln: np.searchsorted(ends, j, side="right")
        k = np.arange(int(ln.sum())) - np.repeat(start, ln)
        flat = list_values(off, vals, olen)
        h = np.zeros(R, dtype=np.uint64)
        has = ln > 0
        if len(flat):
            mix = token_mix(flat, k)
            mix[k == 0] = 0                       # the first token is compared on its own
            h[has] = np.add.reduceat(mix, start[has])
        put("output_hash", h)
        last = np.full(R, -1, dtype=np.int64)
        if len(flat):
            last[has] = flat[start[has] + ln[has] - 1]
        put("output_last", last)
        fst = np.full(R, -1, dtype=np.int64)
        if len(flat):
            fst[has] = flat[start[has]]
        put("output_first", fst)
        eos_in = np.full(R, -1, dtype=np.int64)
        if len(flat):
            e = np.flatnonzero(flat == eos_id)           # few: the row test on those only
            e = e[k[e] < ln[row_of(e)] - 1][::-1]
            eos_in[row_of(e)] = k[e]
        put("eos_inside", eos_in)
        # lossless: reference_tokens, when present
        req_eq = np.full(R, -1, dtype=np.int64)
        first_diff = np.full(R, -1, dtype=np.int64)
        rlen = np.full(R, -1, dtype=np.int64)
        if "reference_tokens" in col:
            roff, rvals, rl = list_parts(col["reference_tokens"])
            rlen = rl
            present = rl >= 0
            if present.any():
                rln = np.maximum(rl, 0)
                rflat = list_values(roff, rvals, rl)
                rstart = np.cumsum(rln) - rln
                m = np.minimum(ln, rln)
                if np.array_equal(ln, rln):   # same lengths: the flat values line up as they are
                    d = np.flatnonzero(flat != rflat)[::-1]
                    first_diff[row_of(d)] = k[d]
                else:
                    mrows = np.repeat(np.arange(R), m)
                    mk = np.arange(int(m.sum())) - np.repeat(np.cumsum(m) - m, m)
                    a = flat[start[mrows] + mk] if len(flat) else np.zeros(0, np.int64)
                    bb = rflat[rstart[mrows] + mk] if len(rflat) else np.zeros(0, np.int64)
                    d = np.flatnonzero(a != bb)[::-1]
                    first_diff[mrows[d]] = mk[d]
                lendiff = (first_diff < 0) & (ln != rln)
                first_diff[lendiff] = m[lendiff]
                req_eq = np.where(present, (first_diff < 0).astype(np.int64), -1)
                first_diff = np.where(present, first_diff, -1)
        put("reference_equal", req_eq)
        put("reference_first_diff", first_diff)
        put("reference_len", rlen)
        fr = col["finish_reason"]
        fr = fr if pa.types.is_dictionary(fr.type) else fr.dictionary_encode()
        reasons = np.asarray(fr.dictionary.to_pylist() + [None], dtype=object)
        put("finish_reason", reasons[to_np(fr.indices, -1)])
        for c in CLIENT_COLUMNS:
            if c in col:
                try:
                    put("extra:" + c, to_np(col[c].cast(pa.float64()), np.nan))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    pass
    return {k: v.array() for k, v in out.items()}


class _Column:
    """One request fact, appended batch by batch into one growing array. (A list of
    per-batch arrays concatenated at the end would hold the facts twice at the end, and
    its many small long-lived blocks, interleaved with each batch's temporaries, keep
    the heap from shrinking: with a million requests that is hundreds of MB of RSS.)"""

    def __init__(self, dtype):
        self.a = np.empty(REQUEST_BATCH_ROWS, dtype=dtype)
        self.n = 0

    def append(self, v: np.ndarray) -> None:
        need = self.n + len(v)
        if need > len(self.a):
            b = np.empty(max(need, len(self.a) * 3 // 2), dtype=self.a.dtype)
            b[: self.n] = self.a[: self.n]
            self.a = b
        self.a[self.n: need] = v
        self.n = need

    def array(self) -> np.ndarray:
        """The values (a copy when over a quarter of the buffer is spare: it is kept all run)."""
        return self.a[: self.n].copy() if self.n < len(self.a) * 3 // 4 else self.a[: self.n]


def _request_id_strings(arr) -> list:
    """Request ids as Python strings (a null id as "None", as str() of it gives)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type.value_type if pa.types.is_dictionary(arr.type) else arr.type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return [str(x) for x in arr.to_pylist()]
    out = arr.to_pylist()
    if arr.null_count:
        out = ["None" if x is None else x for x in out]
    return out


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
        vals = {k: int(v.sum()) for k, v in self.per_row(f).items()}
        vals.update(f.sampling_sums())
        p = self.parts.setdefault(part, dict.fromkeys(self.KEYS, 0))
        for k, v in vals.items():
            self.total[k] += v
            p[k] += v
        h = np.bincount(self.depth_bins(f))
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
    """
    eos_id, max_new, conv = run_config(manifest)
    by_scope = {s: [r for r in rules if r.scope == s] for s in ("step", "request", "run")}
    carry = Carry()
    facts = None
    n_requests = 0
    if requests is not None:
        facts = request_facts(requests, carry, eos_id)
        n_requests = len(facts.get("idx", ()))
        result.requests += n_requests
        if n_requests > REQUEST_BATCH_ROWS:
            _release_memory()  # the table's decode buffers: give them back before the steps
    derived = RunSums()
    rows_seen = 0
    for item in batches:
        if isinstance(item, tuple):
            batch, file, part = item
        else:
            batch, file, part = item, None, "all"
        if batch.num_rows == 0:
            continue
        f = StepFrame(batch, run_id=run_id, carry=carry, eos_id=eos_id, max_new_tokens=max_new,
                      manifest=manifest, conventions=conv, file=file, row_offset=rows_seen)
        rows_seen += batch.num_rows
        for rule in by_scope["step"]:
            emit_hits(rule, rule.check(f), f, result, kind="step", file=file)
        derived.add(f, part if part is not None else "all")
        f.finish_carry()
    result.steps += rows_seen
    if callable(complete):
        complete = complete()
    targets = request_results if request_results is not None else {bool(complete): result}
    rq = None
    for assume, res in targets.items():
        rq = RequestFrame(carry, facts, run_id=run_id, eos_id=eos_id, max_new_tokens=max_new,
                          complete=assume and facts is not None, manifest=manifest or {})
        for rule in by_scope["request"]:
            emit_hits(rule, rule.check(rq), rq, res, kind="request")
    out = group_partial(derived, rq, have_facts=facts is not None)
    out.update(steps_read=rows_seen, requests_read=n_requests, complete=bool(complete))
    return out


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


def group_partial(derived: RunSums, rq: RequestFrame | None, *, have_facts: bool) -> dict:
    """One group's sums and counts (plain Python types: JSON-serialisable)."""
    out = {"total": {k: _python_number(v) for k, v in derived.total.items()},
           "partitions": {p: {k: _python_number(v) for k, v in d.items()} for p, d in derived.parts.items()},
           "depth_hist": [int(x) for x in derived.depth_hist.tolist()]}
    if rq is None:
        out.update(requests=0, generated=0, first_tokens=0, n_real=0, means={k: [] for k, _ in MEANS})
        return out
    real = ~rq.null_slot & rq.has_steps
    ns = np.maximum(rq.n_steps[real], 1)
    out["requests"] = int((rq.has_row | rq.has_steps).sum() - (rq.null_slot & rq.has_steps).sum())
    out["generated"] = int(np.maximum(rq.output_len[rq.has_row], 0).sum()) if have_facts else 0
    out["first_tokens"] = int(rq.has_row.sum()) if have_facts else 0
    out["n_real"] = int(real.sum())
    # the per_request convention's terms (trace/derived.py), summed exactly
    out["means"] = {key: exact_sum_partials(per_request_means(ns, getattr(rq, col)[real])) for key, col in MEANS}
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

