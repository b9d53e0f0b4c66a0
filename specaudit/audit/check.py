"""`specaudit check`: re-derive every counter of a trace dataset and report what lies.

    from specaudit.audit.check import check_paths
    res = check_paths(["traces/"], select=("SA3",), ignore=())
    res.exit_code, res.counts, res.findings[:3], res.bad_files, res.incomplete_runs

The core, `check_batches`, is a function over Arrow record batches of one run, read
in file order (a request's steps in step order across batches), plus the run's
requests table and manifest: it keeps a per-request carry (a few integers per
request), never the rows, so memory stays bounded however large the run. Step rules
see one batch at a time (vectorised), request rules see every request of the run,
run rules see the re-derived aggregates. Files are streamed by row group.

Bad input never raises past check_paths: an unreadable or malformed file becomes a
finding SA000 (error, named file and reason) and the other files are still checked;
a run without finished_at or requests table is checked for what it holds and
reported as incomplete (SA001, info). check_paths raises InputError only when a
path does not exist or holds nothing that looks like a trace.
"""
from __future__ import annotations

import math
import os
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from specaudit.audit.findings import Finding
from specaudit.invariants import Hits, load_rules
from specaudit.invariants.arrow import valid_mask
from specaudit.invariants.frame import (
    DIAGNOSTIC_RANGES,
    Carry,
    RequestFrame,
    RunFrame,
    StepFrame,
    list_lengths,
    list_parts,
    list_values,
    to_np,
    token_mix,
)
from specaudit.trace.schema import (
    REQUESTS_SCHEMA,
    SAMPLING_COLUMNS,
    SAMPLING_FIELDS,
    STEPS_SCHEMA,
    InputError,
    RunFiles,
    check_table_schema,
    declared_size_problem,
    discover,
    manifest_conventions,
    note_input,
)

BATCH_ROWS = 65536          # step rows per batch: ~200 MB of numpy work at N = 8
REQUEST_BATCH_ROWS = 8192   # request rows per batch: each holds whole outputs
# Optional client-side per-request columns a requests table may carry; SA410 compares
# them with what the request's steps add up to.
CLIENT_COLUMNS = ("completion_tokens", "verify_steps", "accept_length")
STEP_READ_COLUMNS = [c for c in STEPS_SCHEMA.names if c not in ("t_start", "draft_s", "verify_s", "step_s")]
STEP_READ_COLUMNS += list(SAMPLING_COLUMNS)  # contract v2, read when present (SA8xx)
# the requests table's columns request_facts reads (the latencies ttft_s/e2e_s are no rule's)
REQUEST_READ_COLUMNS = [c for c in REQUESTS_SCHEMA.names if c not in ("ttft_s", "e2e_s")] + list(CLIENT_COLUMNS)


@dataclass
class CheckResult:
    findings: list = field(default_factory=list)      # capped per code (see max_per_code)
    counts: Counter = field(default_factory=Counter)  # code -> all findings, uncapped
    severities: dict = field(default_factory=dict)    # code -> severity
    names: dict = field(default_factory=dict)         # code -> rule name
    files_checked: list = field(default_factory=list)
    bad_files: list = field(default_factory=list)     # (path, reason)
    incomplete_runs: list = field(default_factory=list)  # (run_id, reason)
    runs: list = field(default_factory=list)          # run ids checked
    readings: list = field(default_factory=list)      # engine inputs: their accounts (sources.account)
    steps: int = 0
    requests: int = 0
    rules: list = field(default_factory=list)         # codes run
    max_per_code: int = 1000

    def bad_input(self, path, reason: str, run_id=None) -> None:
        """An input that could not be read: in bad_files and as one SA000 finding (path and
        reason on one line). A method, so readers handed a result record it without importing
        this module."""
        from specaudit.invariants import get_rule
        self.bad_files.append((str(path), reason))
        self.add(get_rule("SA000").finding(run_id=run_id, file=str(path), where=str(path), reason=reason))

    @property
    def errors(self) -> int:
        return sum(n for c, n in self.counts.items() if self.severities.get(c) == "error")

    @property
    def violations(self) -> int:
        return self.errors

    @property
    def checked_anything(self) -> bool:
        return bool(self.files_checked or self.runs)

    @property
    def exit_code(self) -> int:
        if not self.checked_anything:
            return 2
        return 1 if self.errors else 0

    def add(self, f: Finding) -> None:
        self.counts[f.code] += 1
        self.severities.setdefault(f.code, f.severity)
        self.names.setdefault(f.code, f.name)
        if self.max_per_code <= 0 or self.counts[f.code] <= self.max_per_code:
            self.findings.append(f)

    def summary(self) -> dict:
        return {
            "runs": len(self.runs), "steps": self.steps, "requests": self.requests,
            "files_checked": len(self.files_checked), "bad_files": len(self.bad_files),
            "incomplete_runs": len(self.incomplete_runs), "violations": self.errors,
            "findings": sum(self.counts.values()), "rules": len(self.rules),
        }


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
    out: dict[str, list] = {}

    def put(k, v):
        # int32 is enough for every per-request fact (lengths, tokens, indices)
        if isinstance(v, np.ndarray) and v.dtype == np.int64 and k not in ("idx",):
            v = v.astype(np.int32)
        out.setdefault(k, []).append(v)

    for b in batches:
        names = b.schema.names
        col = {n: b.column(i) for i, n in enumerate(names)}
        idx = carry.index(_id_strings(col["request_id"]))
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
    return {k: np.concatenate(v) for k, v in out.items()}


def _id_strings(arr) -> list:
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


class _Derived:
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


def _emit_hits(rule, hits, f, result: CheckResult, *, kind: str, file=None) -> None:
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
    derived = _Derived()
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
            _emit_hits(rule, rule.check(f), f, result, kind="step", file=file)
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
            _emit_hits(rule, rule.check(rq), rq, res, kind="request")
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


def exact_sum_partials(values, partials=()) -> list:
    """Floats whose exact sum is the exact sum of `values` (and of the given partials):
    math.fsum over any concatenation of them rounds once.

    Vectorised for a numpy array of finite floats (_exact_sum_int: the sum is exact in
    integers, then split into a few floats); anything else goes through Shewchuk's
    loop (_shewchuk_partials), one Python step per value."""
    if isinstance(values, np.ndarray) and values.dtype == np.float64 and len(values) > 64:
        got = _exact_sum_int(values)
        if got is not None:
            return _shewchuk_partials(got, partials) if len(partials) else got
        values = values.tolist()
    return _shewchuk_partials(values.tolist() if isinstance(values, np.ndarray) else values, partials)


def _exact_sum_int(x: np.ndarray) -> list | None:
    """The exact sum of finite float64s as a short list of floats, or None when the
    values are out of the range this handles (non-finite, or tiny/huge exponents).

    Each x = M * 2^(e-53) with integer |M| < 2^53 (frexp). M splits into a high and a
    low part below 2^27 each, summed per exponent in int64 (exact for < 2^36 values);
    the per-exponent sums are added exactly as Python integers, S * 2^(emin-53); S is
    then peeled into floats, each the rounding of what is left, until nothing is."""
    if len(x) == 0:
        return []
    if len(x) >= 1 << 36 or not np.isfinite(x).all():
        return None
    m, e = np.frexp(x)
    M = (m * float(1 << 53)).astype(np.int64)          # exact: |m| < 1, 53 bits
    nz = M != 0
    if not nz.any():
        return [0.0]
    M, e = M[nz], e[nz].astype(np.int64)
    emin, emax = int(e.min()), int(e.max())
    if emin < -900 or emax > 900 or emax - emin > 4096:
        return None
    order = np.argsort(e, kind="stable")
    es = e[order]
    starts = np.flatnonzero(np.r_[True, es[1:] != es[:-1]])
    hi = M[order] >> 26                                 # floor: M = hi * 2^26 + lo, 0 <= lo < 2^26
    lo = M[order] - (hi << 26)
    his = np.add.reduceat(hi, starts)
    los = np.add.reduceat(lo, starts)
    S = 0
    for ex, h, low in zip(es[starts].tolist(), his.tolist(), los.tolist(), strict=True):
        sh = ex - emin
        S += (h << (sh + 26)) + (low << sh)
    k = emin - 53                                       # exact sum = S * 2^k
    out = []
    while S:
        f = float(S)                                    # correctly rounded, integer-valued
        out.append(math.ldexp(f, k))
        S -= int(f)
    return out or [0.0]


def _shewchuk_partials(values, partials=()) -> list:
    """Non-overlapping floats whose exact sum is the exact sum of `values` and `partials`."""
    ps = [float(p) for p in partials]
    for x in values:
        x = float(x)
        i = 0
        for y in ps:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                ps[i] = lo
                i += 1
            x = hi
        ps[i:] = [x]
    return ps


def _plain_number(v):
    """numpy or Python number -> int, or float for the float sums (sampling)."""
    return int(v) if isinstance(v, (int, np.integer)) else float(v)


def group_partial(derived: _Derived, rq: RequestFrame | None, *, have_facts: bool) -> dict:
    """One group's sums and counts (plain Python types: JSON-serialisable)."""
    out = {"total": {k: _plain_number(v) for k, v in derived.total.items()},
           "partitions": {p: {k: _plain_number(v) for k, v in d.items()} for p, d in derived.parts.items()},
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
    out["means"] = {key: exact_sum_partials(np.asarray(getattr(rq, col)[real] / ns, dtype=np.float64))
                    for key, col in MEANS}
    return out


def combine_partials(parts) -> dict:
    """Partials of disjoint groups of one run -> the partial of their union."""
    out = {"total": dict.fromkeys(_Derived.KEYS, 0), "partitions": {}, "depth_hist": [0], "requests": 0,
           "generated": 0, "first_tokens": 0, "n_real": 0, "means": {k: [] for k, _ in MEANS},
           "steps_read": 0, "requests_read": 0}
    for p in parts:
        for k, v in p["total"].items():
            out["total"][k] += v
        for name, d in p["partitions"].items():
            tgt = out["partitions"].setdefault(name, dict.fromkeys(_Derived.KEYS, 0))
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
            _emit_hits(rule, rule.check(run), run, result, kind="run")


class _Bad:
    """A file that failed while streaming (recorded by the consuming thread)."""

    def __init__(self, path, reason):
        self.path, self.reason = path, reason


def _iter_step_batches(rf: RunFiles, batch_rows: int, columns):
    """Stream (batch, file, partition) over a run's step files; a bad file yields _Bad
    (and the next file is still read); a file read to the end yields its path as str."""
    for path in rf.step_files:
        try:
            pf = pq.ParquetFile(path, read_dictionary=["run_id", "request_id", "algo"])
            schema = pf.schema_arrow                  # a property that rebuilds: read once
            _check_schema(path, schema, STEPS_SCHEMA, SAMPLING_FIELDS, plain=True)
            too_big = declared_size_problem(pf.metadata)   # from the footer: nothing materialised
            if too_big:
                raise InputError(path, too_big)
        except InputError as e:
            yield _Bad(path, e.reason)
            continue
        except Exception as e:  # truncated, not Parquet, unreadable
            yield _Bad(path, _reason(e))
            continue
        have = set(schema.names)
        skip = _proven_diagnostics(pf.metadata)
        cols = [c for c in columns if c in have and c not in skip]
        rank = "rank" in have
        if rank:
            cols.append("rank")
        n = 0
        try:
            # a small file is decoded on this thread: Arrow's pool costs more than it saves
            for b in _file_batches(pf, path, batch_rows, cols):
                if rank:
                    # one partition per rank: split the batch by rank value
                    rk = b.column(b.schema.get_field_index("rank")).to_numpy(zero_copy_only=False)
                    for v in np.unique(rk):
                        yield b.filter(pa.array(rk == v)), str(path), f"rank {int(v)}"
                else:
                    yield b, str(path), path.name
                n += b.num_rows
        except Exception as e:
            yield _Bad(path, f"unreadable after {n} rows: {_reason(e)}")
            continue
        yield str(path)


def _file_batches(pf, path, batch_rows: int, cols):
    """A file's record batches as iter_batches gives them. A small file of one row group
    that fits one batch is read whole (one batch either way): a third of the fixed cost."""
    md = pf.metadata
    if md.num_row_groups == 1 and 0 < md.num_rows <= batch_rows and not _big(path):
        tbl = pf.read(columns=cols, use_threads=False)
        return tbl.combine_chunks().to_batches() if tbl.num_rows else []
    return pf.iter_batches(batch_size=batch_rows, columns=cols, use_threads=_big(path))


# per-node diagnostic lists that no rule reads beyond their length (SA101)
DIAGNOSTIC_LISTS = ("draft_logprob", "target_margin")


def _proven_diagnostics(md) -> set:
    """Diagnostic list columns whose shape the Parquet metadata already settles.

    In every row group: either no leaf slot is null (so no row's list is null or empty
    and no value is null) and the leaf count equals node_tokens' (so the lists hold
    N entries in total), or every row is null. Those columns are not decoded (they
    are a quarter of the bytes); when any row group is not settled the column is read
    and checked row by row. What this cannot see: per-row length errors that cancel
    exactly within one row group (SA101 docs)."""
    try:
        names = [md.schema.column(j).path for j in range(md.num_columns)]
        nt = names.index("node_tokens.list.element")
        idx = {c: names.index(f"{c}.list.element") for c in DIAGNOSTIC_LISTS if f"{c}.list.element" in names}
        out = set(idx)
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            ref = rg.column(nt)
            if not ref.is_stats_set or ref.statistics.null_count != 0:
                return set()
            for c, j in idx.items():
                col = rg.column(j)
                if c not in out:
                    continue
                if not col.is_stats_set or col.statistics.null_count is None:
                    out.discard(c)
                    continue
                nulls = col.statistics.null_count
                same = nulls == 0 and col.num_values == ref.num_values
                all_null = nulls == col.num_values == rg.num_rows
                if same:   # values present: the statistics must also prove their range (SA109)
                    lo, hi = DIAGNOSTIC_RANGES[c]
                    s = col.statistics
                    same = bool(s.has_min_max) and s.min >= lo and s.max <= hi
                if not (same or all_null):
                    out.discard(c)
        return out
    except (ValueError, AttributeError, IndexError):
        return set()


SMALL_RUN_BYTES = 8 << 20   # below this, a run's files are read without extra threads


def _size(path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _big(path) -> bool:
    return _size(path) >= SMALL_RUN_BYTES


def _release_memory() -> None:
    """Return freed memory to the OS (Arrow's pool, and glibc's heap, which keeps
    freed blocks of large numpy temporaries): keeps peak RSS near the live data."""
    pa.default_memory_pool().release_unused()
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


_SCHEMAS_OK: dict = {}   # (expected, optional, plain) -> schemas that passed check_table_schema


def _check_schema(path, schema: pa.Schema, expected: pa.Schema, optional=(), *, plain=False) -> None:
    """check_table_schema, remembered: a schema seen to pass passes again (the check is
    a function of the schema alone), so a thousand runs written alike check it once.
    Compared with == (a schema's hash formats it: slower than the check it saves)."""
    seen = _SCHEMAS_OK.setdefault((id(expected), id(optional), plain), [])
    if any(schema == s for s in seen):
        return
    check_table_schema(path, _plain(schema) if plain else schema, expected, optional)
    if len(seen) >= 16:
        seen.clear()
    seen.append(schema)


def _plain(schema: pa.Schema) -> pa.Schema:
    """Dictionary-encoded string columns (read_dictionary) checked as their values."""
    return pa.schema([pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type) else f
                      for f in schema])


class _prefetch:
    """Run a generator in a thread, `depth` items ahead: Parquet decoding (C++, GIL
    released) overlaps the numpy work on the previous batch. The thread starts at
    once (a run's first step batches decode while its requests table is read on the
    caller's thread); dropping the iterator, read to the end or not, stops it."""

    _END = object()

    def __init__(self, gen, depth: int = 2):
        import queue
        import threading
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        q, stop, end = self._q, self._stop, self._END

        def work():   # holds the queue and the event, never the iterator (so it can be dropped)
            try:
                for item in gen:
                    while not stop.is_set():
                        try:
                            q.put(item, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                q.put(end)
            except BaseException as e:  # surfaced in the consumer
                q.put(e)

        threading.Thread(target=work, name="specaudit-check-read", daemon=True).start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        item = self._q.get()
        if item is self._END:
            self._finish()
            raise StopIteration
        if isinstance(item, BaseException):
            self._finish()
            raise item
        return item

    def _finish(self):
        self._done = True
        self._stop.set()

    def __del__(self):
        self._stop.set()


def _run_batches(items, result: CheckResult, run_id: str):
    """Record files and bad files as the stream reports them; pass batches on."""
    for item in items:
        if isinstance(item, _Bad):
            result_bad(result, item.path, item.reason, run_id)
        elif isinstance(item, str):
            result.files_checked.append(item)
        else:
            note_input(item[1])   # named by the CLI if a bug raises on this batch
            yield item


def _reason(e: Exception) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "magic bytes" in msg or "Parquet magic" in msg:
        return f"not a Parquet file ({msg})"
    return f"cannot read as Parquet: {msg}"


def result_bad(result: CheckResult, path, reason: str, run_id=None) -> None:
    result.bad_input(path, reason, run_id)


def _open_requests(rf: RunFiles, result: CheckResult, batch_rows: int):
    """The requests table (requests.parquet, or a running run's parts) as a stream of
    batches, or None when no file of it can be opened.

    A file that cannot be opened, or fails mid-stream, is recorded (SA000);
    `state["ok"]` tells whether the whole table was read."""
    opened, state = [], {"ok": True}
    for path in rf.request_files:
        try:
            pf = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering would hold the whole table
            check_table_schema(path, pf.schema_arrow, REQUESTS_SCHEMA)
        except InputError as e:
            result_bad(result, path, e.reason, rf.run_id)
            state["ok"] = False
            continue
        except Exception as e:
            result_bad(result, path, _reason(e), rf.run_id)
            state["ok"] = False
            continue
        opened.append((path, pf))
    if not opened:
        return None, {"ok": False}

    def gen():
        for path, pf in opened:
            have = set(pf.schema_arrow.names)
            cols = [c for c in REQUEST_READ_COLUMNS if c in have]
            n = 0
            note_input(path)
            try:
                for b in pf.iter_batches(batch_size=min(batch_rows, REQUEST_BATCH_ROWS), columns=cols,
                                         use_threads=_big(path)):
                    n += b.num_rows
                    yield b
            except Exception as e:
                state["ok"] = False
                result_bad(result, path, f"unreadable after {n} rows: {_reason(e)}", rf.run_id)
                return
            result.files_checked.append(str(path))
    # a big table decodes on a thread of its own, a few batches ahead of request_facts
    # (the caller's thread): Parquet decoding (GIL released) overlaps the facts arithmetic
    if sum(_size(p) for p, _ in opened) >= SMALL_RUN_BYTES:
        return _prefetch(gen(), depth=4), state
    return gen(), state


def run_start(rf: RunFiles, result: CheckResult) -> list | None:
    """A run's own problems (SA000) and, when it did not end normally, SA001.

    Returns the reasons it is incomplete ([] when it ended normally), or None when
    the folder holds nothing to check. Shared by check_run and the Spark driver."""
    for prob in rf.problems:
        result_bad(result, prob.path, prob.reason, rf.run_id)
    manifest = rf.manifest
    if manifest is None and not rf.step_files and not rf.request_files:
        return None
    reasons = []
    if not manifest or not manifest.get("finished_at"):
        reasons.append("no finished_at in run.json")
    if not rf.request_files:
        reasons.append("no requests table")
    if reasons:
        why = "; ".join(reasons)
        result.incomplete_runs.append((rf.run_id, why))
        from specaudit.invariants import get_rule
        result.add(get_rule("SA001").finding(run_id=rf.run_id, file=str(rf.run_dir), reason=why))
    return reasons


def run_counts(files_read: bool, requests_opened: bool, manifest) -> bool:
    """Whether a run counts as checked (a killed run's lone run.json counts: SA001, not
    "nothing to check")."""
    return bool(files_read or requests_opened or manifest is not None)


def check_run(rf: RunFiles, rules, result: CheckResult, batch_rows: int = BATCH_ROWS) -> None:
    note_input(rf.run_dir)
    reasons = run_start(rf, result)
    if reasons is None:
        return
    manifest = rf.manifest
    requests, rq_state = (_open_requests(rf, result, batch_rows) if rf.request_files
                          else (None, {"ok": False}))
    complete = not reasons
    n_before = len(result.files_checked)
    bad_before = len(result.bad_files)
    # a step file that could not be read makes the run's totals partial: request and
    # aggregate rules that compare with the steps are skipped for this run
    steps_whole = lambda: len(result.bad_files) == bad_before
    steps = _iter_step_batches(rf, batch_rows, STEP_READ_COLUMNS)
    # the read-ahead thread pays off only when there is decoding to overlap: a small
    # run is read inline (thread start and hand-offs were most of a tiny run's fixed cost)
    big = sum(_size(p) for p in rf.step_files) >= SMALL_RUN_BYTES
    stream = _run_batches(_prefetch(steps) if big else steps, result, rf.run_id)
    check_batches(stream, run_id=rf.run_id, manifest=manifest, rules=rules, result=result, requests=requests,
                  complete=lambda: complete and requests is not None and rq_state["ok"] and steps_whole(),
                  incomplete_reason="; ".join(reasons) or None)
    # a lone run.json counts (SA001); a run whose every data file is bad does not (exit 2)
    lone = manifest if not (rf.step_files or rf.request_files) else None
    if run_counts(len(result.files_checked) > n_before, requests is not None, lone):
        result.runs.append(rf.run_id)


def check_paths(paths, select=(), ignore=(), *, invariants_dirs=(), entry_points: bool = True,
                max_per_code: int = 1000, batch_rows: int = BATCH_ROWS, workers: int | None = None) -> CheckResult:
    """Check every run under the given paths (dataset folders, run folders, files).

    Never raises for bad data: a path that does not exist or holds no trace, and
    every unreadable file, becomes an SA000 finding and a `bad_files` entry; when
    nothing could be checked, `exit_code` is 2. Bad rule files (--invariants) raise
    InputError.
    """
    rules = [r for r in load_rules(select=select, ignore=ignore, dirs=invariants_dirs,
                                   entry_points=entry_points) if r.scope != "source"]
    result = CheckResult(max_per_code=max_per_code, rules=[r.code for r in rules])
    # what listing finds (SA000, SA002) goes to `listed` first: check_runs replays it in
    # order between the runs, as the pooled runs are checked later than they are listed
    listed = CheckResult(max_per_code=0, rules=result.rules)
    check_runs(iter_runs(paths, listed), rules, result, batch_rows, listed=listed, workers=workers)
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


# ------------------------------------------------------ many tiny runs as one
#
# A tiny run (one request, a few steps) costs check_run a fixed ~10 ms: two files
# opened, a StepFrame built, every rule's numpy setup run for a handful of rows. A
# dataset of thousands of them (one run per CI job, per request replayed) spends its
# time there. So tiny runs that share a configuration are checked as a pool: their
# step and requests tables concatenated (request ids made unique per run), the step
# and request rules run once over the pool, the run rules once per run on that run's
# own aggregates (summed per run, the same sums check_group makes). Pools of a large
# dataset go to worker processes (fork), one pool per task; the parent merges each
# run's result in listing order, so the output is the same with any number of workers.
#
# The pool only confirms clean runs. A run with any finding in the pool, a file that
# reads unusually, or any error in the pool itself, is checked again alone by
# check_run, and only that result counts: pooling changes how fast a clean run is
# confirmed clean, never what the checker reports (tests/test_check_pool.py checks
# the findings, counts and per-run aggregates are the same with and without it).

POOL_RUN_BYTES = 256 << 10   # a run whose step + requests files are below this may be pooled
POOL_RUNS = 256              # runs per pool (one task; the pooled frame holds their rows)
POOL_POLARS = True           # workers read a task's files with polars (_read_batch); False: Arrow
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
    except BrokenProcessPool:
        got = _pool_results(members, _WORKER["rules"], _WORKER["cap"], _WORKER["batch_rows"])
    tasks[t] = got
    return got


def _start_workers(n: int, rules, cap: int, batch_rows: int):
    import multiprocessing as mp
    import sys
    from concurrent.futures import ProcessPoolExecutor
    _WORKER.update(rules=rules, cap=cap, batch_rows=batch_rows)   # inherited by fork, never pickled
    # the workers read with polars (_read_batch) unless this process has loaded it: its
    # threads do not survive a fork. This process itself never does (a later fork of it
    # would inherit them). polars is optional (pip install specaudit[fast]): without it the
    # workers read with Arrow from the start instead of failing an import per task
    use = POOL_POLARS and "polars" not in sys.modules and _findable("polars")
    return ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("fork"), initializer=_worker_init,
                               initargs=(use,))


def _findable(module: str) -> bool:
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


def merge_result(into: CheckResult, part: CheckResult) -> None:
    """Add one run's result (checked on its own, same cap) to `into`, as if its findings
    had been added to `into` one by one: the same findings shown, the same counts."""
    shown: Counter = Counter()
    for fd in part.findings:
        into.add(fd)
        shown[fd.code] += 1
    for code, n in part.counts.items():
        extra = n - shown[code]
        if extra:
            into.counts[code] += extra
            into.severities.setdefault(code, part.severities.get(code))
            into.names.setdefault(code, part.names.get(code))
    into.files_checked.extend(part.files_checked)
    into.bad_files.extend(part.bad_files)
    into.incomplete_runs.extend(part.incomplete_runs)
    into.runs.extend(part.runs)
    into.steps += part.steps
    into.requests += part.requests


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
    return _size(path) if n is None else n


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
    for read in _read_task(members):
        try:
            idx, steps, st_n, reqs, rq_n = _plain_rows(members, *read)
        except Exception:   # noqa: BLE001  (e.g. a run id no Arrow string can hold: each member alone)
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


def _read_task(members: list):
    """A task's rows, per schema the contract accepts: (member indices, steps, per-member
    step rows, requests, per-member request rows). Workers read with one polars scan per
    table (_read_batch); otherwise, or when that scan fails, each file is read with Arrow
    and the members are grouped by their files' schemas (each schema checked once). A
    member in none of them is checked alone, where whatever is odd gets reported."""
    batch = _read_batch(members) if _WORKER.get("polars") else None
    if batch is not None:
        yield batch
        return
    got = [_pool_read(rf) for rf in members]
    kinds: list = []                # distinct (steps schema, requests schema, member indices)
    for i, g in enumerate(got):
        if g is None:
            continue
        k = next((kind for kind in kinds if kind[0] == g[2] and kind[1] == g[3]), None)
        if k is None:
            k = (g[2], g[3], [])
            kinds.append(k)
        k[2].append(i)
    for schema, rschema, idx in kinds:
        if _plain_schemas(members[idx[0]], schema, rschema):   # else check_run reports the schema
            yield (idx, pa.concat_tables([got[i][0] for i in idx]), np.array([got[i][0].num_rows for i in idx]),
                   pa.concat_tables([got[i][1] for i in idx]), np.array([got[i][1].num_rows for i in idx]))


def _plain_rows(members: list, idx: list, steps: pa.Table, st_n, reqs: pa.Table, rq_n):
    """The read rows without the members whose rows are not plain (a null run or request
    id, a step row of another run: SA108), who are left to be checked alone."""
    ks = np.repeat(np.arange(len(idx)), st_n)    # [S] position in idx of each step row's member
    kq = np.repeat(np.arange(len(idx)), rq_n)    # [Q] the same for request rows
    bad = np.zeros(len(idx), dtype=bool)
    for t, k, cols in ((steps, ks, ("run_id", "request_id")), (reqs, kq, ("request_id",))):
        for c in cols:
            valid = valid_mask(t.column(c).combine_chunks())
            if valid is not None:
                bad[k[~valid]] = True
    want = _strings_of([str(members[i].run_id) for i in idx]).take(_int32s(ks))
    bad[ks[to_np(pc.not_equal(steps.column("run_id"), want), fill=True)]] = True   # (to_np: no pandas import)
    if not bad.any():
        return idx, steps, np.asarray(st_n), reqs, np.asarray(rq_n)
    keep = ~bad
    return ([i for i, ok in zip(idx, keep) if ok], steps.filter(_bools(keep[ks])), np.asarray(st_n)[keep],
            reqs.filter(_bools(keep[kq])), np.asarray(rq_n)[keep])


def _plain_schemas(rf: RunFiles, schema: pa.Schema, rschema: pa.Schema) -> bool:
    """The files' schemas are the contract's (else the run is checked alone, and told)."""
    try:
        _check_schema(rf.step_files[0], schema, STEPS_SCHEMA, SAMPLING_FIELDS, plain=True)
        _check_schema(rf.request_files[0], rschema, REQUESTS_SCHEMA)
    except InputError:
        return False
    names = schema.names   # (a property that builds a new list on every access)
    return "rank" not in names and not any(c in names for c in SAMPLING_COLUMNS)   # per-rank, sampled: alone


def _pool_read(rf: RunFiles):
    """(steps table, requests table, their files' schemas) of a tiny run read with Arrow,
    or None when its files read unusually (it is then checked alone, where whatever is odd
    gets reported)."""
    try:
        st, schema = _read_small(rf.step_files[0], STEP_READ_COLUMNS)
        if st is None:
            return None
        rq, rschema = _read_small(rf.request_files[0], REQUEST_READ_COLUMNS)
        if rq is None:
            return None
    except Exception:   # noqa: BLE001  (any trouble: check_run reads it again and reports it)
        return None
    return st, rq, schema, rschema


def _read_small(path, wanted):
    """(the columns of `wanted` the file has, its whole Arrow schema) of a small Parquet
    file, read with Arrow's file reader directly: ParquetFile's Python setup (filesystem
    resolution, nested-path maps) is a third of a tiny file's cost. Every column of a
    trace is a primitive or a list of primitives, so a field's index is its leaf's;
    (None, schema) when that does not hold (the file is then read the general way)."""
    try:
        from pyarrow._parquet import ParquetReader
        r = ParquetReader()
        r.open(pa.OSFile(str(path)), use_memory_map=False, pre_buffer=False)
    except (ImportError, TypeError):   # another pyarrow's private API: the public reader
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
        return pf.read(columns=[c for c in wanted if c in schema.names], use_threads=False), schema
    schema = r.schema_arrow
    if r.metadata.num_columns != len(schema) or declared_size_problem(r.metadata):
        return None, schema   # read the general way, which reports the problem
    names = schema.names
    idx = [names.index(c) for c in wanted if c in names]
    return r.read_all(column_indices=idx, use_threads=False), schema


# Reading a task's files. Arrow's Parquet reader spends ~0.4 ms opening a file and
# ~60 us per column chunk, whatever the rows: ~2.5 ms for a tiny run's two files, most
# of a pool's time. Polars scans a list of files in one plan at ~1 ms per run (measured
# side by side: scripts/bench_tiny_runs.py), so worker processes read a task with it.
# Only forked workers do, and only when the parent has not loaded polars itself: its
# thread pool does not survive a fork. Polars is strict where it matters here: a file
# whose columns or types differ from the task's first file fails the scan (missing or
# extra column, another type; a large_string where the first has string is the same
# column to both readers), and any failure means the task is read file by file with
# Arrow (_pool_read), as before.
_PATH_COL = "\x1fpath"   # the scan's file-path column (no trace column holds \x1f)


def _polars():
    """polars, imported in this worker with one thread (a worker per core already)."""
    os.environ.setdefault("POLARS_MAX_THREADS", "1")
    import polars
    return polars


def _read_batch(members: list):
    """(member indices, steps, per-member step rows, requests, per-member request rows)
    of a task's tiny runs, read by one polars scan per table; None when the scan cannot
    be made (then _read_task reads file by file)."""
    try:
        pl = _polars()
        sf = [str(rf.step_files[0]) for rf in members]
        qf = [str(rf.request_files[0]) for rf in members]
        schema, rschema = pq.read_schema(sf[0]), pq.read_schema(qf[0])
        if (any(pa.types.is_dictionary(f.type) for f in (*schema, *rschema))
                or not _plain_schemas(members[0], schema, rschema)):
            return None
        steps, ks = _scan(pl, sf, [c for c in STEP_READ_COLUMNS if c in schema.names])
        reqs, kq = _scan(pl, qf, [c for c in REQUEST_READ_COLUMNS if c in rschema.names])
        P = len(members)
        return list(range(P)), steps, np.bincount(ks, minlength=P), reqs, np.bincount(kq, minlength=P)
    except Exception:   # noqa: BLE001  (any trouble: the files are read one by one, as before)
        return None


def _scan(pl, files: list[str], cols: list[str]) -> tuple[pa.Table, np.ndarray]:
    """(the files' rows as one Arrow table with the Arrow reader's types, each row's file
    index), raising when a file's rows are not in file order."""
    df = pl.scan_parquet(files, hive_partitioning=False, glob=False, include_file_paths=_PATH_COL,
                         missing_columns="raise", extra_columns="raise", cast_options=None,
                         credential_provider=None).select([*cols, _PATH_COL]).collect().rechunk()
    t = df.to_arrow()
    enc = t.column(_PATH_COL).combine_chunks().dictionary_encode()
    where = {f: i for i, f in enumerate(files)}
    k = np.array([where[f] for f in enc.dictionary.to_pylist()], dtype=np.int64)[
        to_np(enc.indices)]
    if len(k) and (np.diff(k) < 0).any():
        raise ValueError("rows out of file order")
    t = t.drop_columns([_PATH_COL])
    return t.cast(pa.schema([pa.field(f.name, _arrow_type(f.type)) for f in t.schema])), k


def _arrow_type(t: pa.DataType) -> pa.DataType:
    """The type Arrow's Parquet reader gives a column polars hands back (large or view
    strings and lists -> the plain ones)."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.list_(pa.field("element", _arrow_type(t.value_type)))
    return t


def _bools(a: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(pa.bool_(), len(a), [None, pa.py_buffer(np.packbits(a, bitorder="little"))])


def _pooled(t: pa.Table, counts) -> pa.Table:
    """A pool's table (its members' rows in member order, counts[k] rows of member k),
    request_id -> "<k>\\x1f<request_id>" for member k: distinct across the pool's runs."""
    t = t.combine_chunks()
    k = np.repeat(np.arange(len(counts), dtype=np.int32), np.asarray(counts, dtype=np.int64))
    prefix = _strings_of([str(j) for j in range(len(counts))]).take(_int32s(k))
    i = t.schema.get_field_index("request_id")
    return t.set_column(i, "request_id", pc.binary_join_element_wise(prefix, t.column(i),
                                                                     _strings_of(["\x1f"])[0]))


# Arrow arrays built from their buffers: pa.array() of Python or numpy values (and a
# Python str handed to a compute function) imports pandas on first use, half a second
# of a small check
def _int32s(a: np.ndarray) -> pa.Array:
    a = np.ascontiguousarray(a, dtype=np.int32)
    return pa.Array.from_buffers(pa.int32(), len(a), [None, pa.py_buffer(a)])


def _strings_of(xs: list[str]) -> pa.Array:
    b = [x.encode() for x in xs]
    off = np.zeros(len(b) + 1, dtype=np.int32)
    off[1:] = np.cumsum([len(x) for x in b])
    return pa.Array.from_buffers(pa.string(), len(b), [None, pa.py_buffer(off), pa.py_buffer(b"".join(b))])


def _check_pool(members, steps, st_n, reqs, rq_n, rules, codes, batch_rows: int) -> list[bool]:
    """Check a pool of tiny runs (RunFiles) of one configuration and schema, their rows
    in `steps` and `reqs` (st_n[k] and rq_n[k] rows of member k, in member order); per
    member, whether it came out clean (no finding of any severity). Never raises: an
    error makes every member come out not clean (each is then checked alone)."""
    try:
        return _pool_clean(members, _pooled(steps, st_n), _pooled(reqs, rq_n), rules, codes, batch_rows)
    except Exception:   # noqa: BLE001  (check_run, run alone, reports or raises it properly)
        return [False] * len(members)


def _pool_clean(members, steps, reqs, rules, codes, batch_rows: int) -> list[bool]:
    P = len(members)
    m0 = {k: v for k, v in members[0].manifest.items() if k not in _PER_RUN_KEYS}
    m0["run_id"] = _POOL_RUN_ID
    eos_id, max_new, conv = run_config(m0)
    pool = CheckResult(max_per_code=0, rules=codes)   # uncapped: every finding flags its run
    i = steps.schema.get_field_index("run_id")
    steps = steps.set_column(i, "run_id", _strings_of([_POOL_RUN_ID]).take(_int32s(np.zeros(steps.num_rows))))
    by_scope = {s: [r for r in rules if r.scope == s] for s in ("step", "request", "run")}
    carry = Carry()
    facts = request_facts(reqs.to_batches(max_chunksize=REQUEST_BATCH_ROWS), carry, eos_id)
    n_req = np.bincount(_slot_runs(carry)[facts["idx"]], minlength=P)
    sums = {k: np.zeros(P, dtype=np.int64) for k in _Derived.KEYS}
    hist = np.zeros((P, 1), dtype=np.int64)
    done = 0
    for batch in steps.to_batches(max_chunksize=batch_rows):
        f = StepFrame(batch, run_id=_POOL_RUN_ID, carry=carry, eos_id=eos_id, max_new_tokens=max_new,
                      manifest=m0, conventions=conv, row_offset=done)
        done += batch.num_rows
        for rule in by_scope["step"]:
            _emit_hits(rule, rule.check(f), f, pool, kind="step")
        run = _slot_runs(carry)[f.req]                      # [R] pool member of each sorted row
        for k, v in _Derived.per_row(f).items():            # as _Derived.add, per member (sampled runs are not pooled)
            np.add.at(sums[k], run, np.asarray(v, dtype=np.int64))
        d = _Derived.depth_bins(f)
        H = max(hist.shape[1], int(d.max(initial=0)) + 1)
        h = np.zeros((P, H), dtype=np.int64)
        h[:, : hist.shape[1]] = hist
        np.add.at(h, (run, d), 1)
        hist = h
        f.finish_carry()
    rq = RequestFrame(carry, facts, run_id=_POOL_RUN_ID, eos_id=eos_id, max_new_tokens=max_new,
                      complete=True, manifest=m0)
    for rule in by_scope["request"]:
        _emit_hits(rule, rule.check(rq), rq, pool, kind="request")
    clean = np.ones(P, dtype=bool)
    for fd in pool.findings:   # step and request findings: the member is in the request id
        k = str(fd.request_id or "").split("\x1f", 1)[0]
        if not k.isdigit() or int(k) >= P:
            return [False] * P
        clean[int(k)] = False
    slots = _slot_runs(carry)
    for k, rf in enumerate(members):
        if not clean[k]:
            continue
        mine = slots == k
        total = {key: int(sums[key][k]) for key in _Derived.KEYS}
        h = hist[k]
        nz = np.flatnonzero(h)
        derived = _PoolDerived(total, {rf.step_files[0].name: dict(total)} if total["steps"] else {},
                               h[: int(nz[-1]) + 1 if len(nz) else 1].copy())
        part = group_partial(derived, _PoolRequests(rq, mine), have_facts=True)
        part.update(steps_read=int(sums["steps"][k]), requests_read=int(n_req[k]))
        before = len(pool.findings)
        check_run_rules(combine_partials([part]), run_id=rf.run_id, manifest=rf.manifest, rules=rules,
                        result=pool, complete=True, have_facts=True)
        if len(pool.findings) > before:
            clean[k] = False
    return clean.tolist()


def _slot_runs(carry: Carry) -> np.ndarray:
    """Pool member of each carry slot (-1 for the null slot)."""
    return np.fromiter((int(n.split("\x1f", 1)[0]) if "\x1f" in n else -1 for n in carry.names[: carry.n]),
                       dtype=np.int64, count=carry.n)


class _PoolDerived:
    """One pool member's run aggregates, shaped as _Derived (what group_partial reads)."""

    def __init__(self, total: dict, parts: dict, depth_hist: np.ndarray):
        self.total, self.parts, self.depth_hist = total, parts, depth_hist


class _PoolRequests:
    """One pool member's slice of the pooled RequestFrame (what group_partial reads)."""

    def __init__(self, rq: RequestFrame, mine: np.ndarray):
        for k in ("null_slot", "has_steps", "has_row", "n_steps", "output_len", *(c for _, c in MEANS)):
            setattr(self, k, getattr(rq, k)[mine])
