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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from specaudit.audit.findings import Finding
from specaudit.invariants import Hits, load_rules
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
    steps: int = 0
    requests: int = 0
    rules: list = field(default_factory=list)         # codes run
    max_per_code: int = 1000

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
        rows = np.repeat(np.arange(R), ln)
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
            e = e[k[e] < ln[rows[e]] - 1][::-1]
            eos_in[rows[e]] = k[e]
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
                    mrows, mk, a, bb = rows, k, flat, rflat
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

    def add(self, f: StepFrame, part: str) -> None:
        vals = {
            "steps": f.R, "drafted": int(np.maximum(f.n - 1, 0).sum()),
            "accepted": int(np.maximum(f.true_depth, 0).sum()),
            "accepted_counter": int(f.accepted_depth.sum()), "committed": int(f.commit_n.sum()),
            "commit_len_sum": int(f.commit_len.sum()), "width_sum": int(np.maximum(f.budget, 0).sum()),
            **f.sampling_sums(),
            # rows refused as broken (SA1xx): their counters are not evidence, so run
            # totals that include them are not compared with `reported` (see check_run_rules)
            "refused": int(f.R - np.count_nonzero(f.ok)),
        }
        p = self.parts.setdefault(part, dict.fromkeys(self.KEYS, 0))
        for k, v in vals.items():
            self.total[k] += v
            p[k] += v
        h = np.bincount(np.clip(f.true_depth, 0, 4096))
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
    from specaudit.invariants import get_rule
    result.bad_files.append((str(path), reason))
    rule = get_rule("SA000")
    result.add(rule.finding(run_id=run_id, file=str(path), where=str(path), reason=reason))


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
            cols = [c for c in REQUESTS_SCHEMA.names if c in have] + [c for c in CLIENT_COLUMNS if c in have]
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
                max_per_code: int = 1000, batch_rows: int = BATCH_ROWS) -> CheckResult:
    """Check every run under the given paths (dataset folders, run folders, files).

    Never raises for bad data: a path that does not exist or holds no trace, and
    every unreadable file, becomes an SA000 finding and a `bad_files` entry; when
    nothing could be checked, `exit_code` is 2. Bad rule files (--invariants) raise
    InputError.
    """
    rules = [r for r in load_rules(select=select, ignore=ignore, dirs=invariants_dirs,
                                   entry_points=entry_points) if r.scope != "source"]
    result = CheckResult(max_per_code=max_per_code, rules=[r.code for r in rules])
    for rf in iter_runs(paths, result):
        check_run(rf, rules, result, batch_rows)
    return result


def iter_runs(paths, result: CheckResult, discover_fn=None):
    """The runs under the given paths, each once, in order: a path that cannot be
    listed is SA000; a run id seen in an earlier folder is SA002. Shared by
    check_paths and the Spark driver (which lists URIs with Spark: discover_fn)."""
    discover_fn = discover_fn or (lambda p: discover([p]))
    seen = set()
    first_dir: dict[str, Path] = {}
    for p in paths:
        try:
            runs = discover_fn(p)
        except InputError as e:
            result_bad(result, e.path, e.reason)
            continue
        for rf in runs:
            key = _run_key(rf.run_dir)
            if key in seen:
                continue
            seen.add(key)
            first = first_dir.setdefault(rf.run_id, rf.run_dir)
            if key != _run_key(first) and "SA002" in result.rules:
                from specaudit.invariants import get_rule
                result.add(get_rule("SA002").finding(run_id=rf.run_id, file=str(rf.run_dir), first=str(first),
                                                     run_id_again=rf.run_id))
            yield rf


def _run_key(run_dir):
    return Path(run_dir).resolve() if isinstance(run_dir, (str, Path)) else str(run_dir)


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
