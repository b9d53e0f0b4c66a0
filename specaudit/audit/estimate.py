"""Throughput-derived commit length: an independent measurement of an engine's counter.

The model (per request, at concurrency c, N verify nodes per step: root + drafts):

    speculative:  tps      = C / (t_draft + t_verify(c, N))     C = committed tokens per step
    plain greedy: tps_base = 1 / t_ar(c)                          one token per forward

so, with the step cost factor r = (t_draft + t_verify(c, N)) / t_ar(c),

    C = (tps / tps_base) * r

C is what the engine's "mean commit length" / "accept length" (bonus included) must be.
The seed case: r = 1.5, tps_base = 98, tps = 109 gives C = 109 / 98 * 1.5 = 1.67, so a
reported commit length of 2.0 is plausible and an accepted depth of 7 (C = 8) is not.

Both throughputs may be per request or aggregate over the c running requests, as long as
both are the same kind at the same concurrency (c cancels in the ratio).

Uncertainty. C is a product of three positive measured figures, so relative errors add
in quadrature on the log scale (delta method):

    s = sqrt((sd_tps / tps)^2 + (sd_base / tps_base)^2 + (sd_r / r)^2)
    95% interval = [C * exp(-1.96 s), C * exp(+1.96 s)]

The standard deviations are those of the *figures used* (standard errors of a mean of
windows, the spread of a calibrated r), not of single samples.

Verdict on a reported commit length R (bonus included), with a relative tolerance tol
for what the model leaves out (prefill, scheduling, tail effects):
    consistent      R lies in the band [low * (1 - tol), high * (1 + tol)], R taken at its
                    printed precision (specaudit.audit.compare.within: 2.2 stands for
                    [2.15, 2.25), so it touches a band ending at 2.16)
    inconsistent    outside that band
    not enough data R missing, or the interval is too wide to tell anything apart
                    (s > MAX_REL_STD: a wide interval would call every reading consistent)
    calibration mismatch
                    the estimate itself is impossible: below 1 token per step (every step
                    commits at least the bonus) or above N (the verify width: a step cannot
                    commit more tokens than it verified). The baseline or the cost factor
                    does not describe this run; that is no verdict on the engine.

Two counters at once (the seed question): given a reported commit length and a reported
mean accepted depth, each is judged on its own (the depth as depth + 1 tokens per step),
the identity commit = depth + 1 (per unfinished step, chain or tree; over a run's means the
commit sits at most IDENTITY_CUT_SLACK below, as the steps that end requests are cut at EOS
or the token limit) is checked between them, and `judge` ends with one sentence: which
counter the throughput supports, which it contradicts, or that it cannot tell and why (a
band *admits* every figure inside it: a counter is *supported* only when the band tells it
from the alternative; from a trace, the commit length re-derived from the committed tokens
is one, and when the band holds it beside a counter it disagrees with, the sentence says
throughput cannot tell them apart and that the per-step check decides).
`run_estimate` is the whole pipeline (inputs -> observations -> estimate -> judgement)
for the CLI; `live_judgement` the same estimate-then-verdict for a live server's window.

Cost profiles (written by `specaudit calibrate`) give r and its spread for a grid of
(N, c); `CostProfile.lookup(n_nodes, concurrency)` interpolates inside the grid and
refuses outside it.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specaudit.audit.defaults import DEFAULT_TOLERANCE
from specaudit.audit.r_band import RBand
from specaudit.numfmt import fixed as _f  # two decimals, as engines print their figures
from specaudit.stats import mean_se
from specaudit.trace.schema import InputError

Z95 = 1.959963984540054   # two-sided 95% normal quantile
MAX_REL_STD = 0.25        # s above this: the 95% interval spans more than x1.6 either way
# A cost factor typed by hand is one number for every context length and batch shape;
# measured profiles of the reference runtime spread by about this much over a run's
# context lengths, so a hand-given r without its own spread is taken as +-10% (1 sd).
HAND_COST_FACTOR_REL_STD = 0.10
STALL_FACTOR = 4.0        # trace forwards slower than this x the median are stalls, set apart

CONSISTENT, INCONSISTENT, NOT_ENOUGH_DATA = "consistent", "inconsistent", "not enough data"
MISMATCH = "calibration mismatch"
# How far below mean depth + 1 a mean commit length may sit (the cut last steps of requests)
# before the identity counts as broken between two reported means.
IDENTITY_CUT_SLACK = 0.1
# exit status of `specaudit estimate` per verdict (worst result wins)
EXIT_CODES = {CONSISTENT: 0, INCONSISTENT: 1, NOT_ENOUGH_DATA: 2, MISMATCH: 2}
SEVERITY = {CONSISTENT: 0, NOT_ENOUGH_DATA: 1, MISMATCH: 2, INCONSISTENT: 3}
PROFILE_KIND = "specaudit-cost-profile"
PROFILE_VERSION = 1
MAX_PROFILE_BYTES = 16 << 20   # a cost profile or a load.py output: KBs; more is not one


def _finite_positive(name: str, x) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, not {x!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a positive number of tokens/s or a positive factor, got {x!r}")
    return v


def _finite_nonneg(name: str, x) -> float:
    try:
        v = float(x or 0.0)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, not {x!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be zero or positive, got {x!r}")
    return v


@dataclass
class Estimate:
    """Committed tokens per step derived from throughput, with a 95% interval."""

    value: float          # C = tps / tps_base * r
    low: float            # 95% interval
    high: float
    rel_std: float        # s: relative standard deviation of C (log scale)
    observed_tps: float
    baseline_tps: float
    cost_factor: float
    cost_factor_std: float = 0.0
    tps_std: float = 0.0
    baseline_std: float = 0.0

    def predicted_tps(self, commit_len: float) -> tuple[float, float, float]:
        """Throughput a commit length would give under this model: R / r * tps_base,
        with the interval from the baseline's and r's spread (not the observed one's)."""
        v = commit_len / self.cost_factor * self.baseline_tps
        s = math.hypot(self.baseline_std / self.baseline_tps, self.cost_factor_std / self.cost_factor)
        return v, v * math.exp(-Z95 * s), v * math.exp(Z95 * s)

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in d.items()}


def estimate_commit_length(observed_tps: float, baseline_tps: float, cost_factor: float,
                           cost_factor_std: float = 0.0, tps_std: float = 0.0,
                           baseline_std: float = 0.0) -> Estimate:
    """C = (observed_tps / baseline_tps) * cost_factor with its 95% interval.

    Raises ValueError (one line) for zero, negative or non-finite inputs.
    >>> round(estimate_commit_length(109, 98, 1.5).value, 3)
    1.668
    """
    tps = _finite_positive("observed throughput", observed_tps)
    base = _finite_positive("baseline throughput", baseline_tps)
    r = _finite_positive("cost factor", cost_factor)
    sr = _finite_nonneg("cost factor std", cost_factor_std)
    st = _finite_nonneg("observed throughput std", tps_std)
    sb = _finite_nonneg("baseline throughput std", baseline_std)
    c = tps / base * r
    s = math.sqrt((st / tps) ** 2 + (sb / base) ** 2 + (sr / r) ** 2)
    return Estimate(value=c, low=c * math.exp(-Z95 * s), high=c * math.exp(Z95 * s), rel_std=s,
                    observed_tps=tps, baseline_tps=base, cost_factor=r, cost_factor_std=sr,
                    tps_std=st, baseline_std=sb)


def range_problem(estimate: Estimate, n_nodes: int | None = None) -> str | None:
    """Why the estimate itself is impossible (below 1, above N), or None when it is possible."""
    v = estimate.value
    if not math.isfinite(v):
        return None
    if v < 1:
        return (f"the estimate {v:.2f} is below 1 token per step, which speculative decoding cannot do (every "
                "step commits the bonus token): the baseline or the cost factor does not match this run")
    if n_nodes is not None and n_nodes >= 1 and v > n_nodes:
        return (f"the estimate {v:.2f} is above N = {n_nodes}, the tokens a step verifies (root + drafts), which "
                "no step can commit: the baseline or the cost factor does not match this run (a profile "
                "calibrated with other threads, device or dtype?)")
    return None


def verdict(estimate: Estimate, reported_commit_len, tolerance: float = DEFAULT_TOLERANCE,
            n_nodes: int | None = None) -> str:
    """consistent / inconsistent / not enough data / calibration mismatch (module docstring)."""
    from specaudit.audit.compare import within
    if tolerance is None or not (0 <= float(tolerance) < 1):
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    if range_problem(estimate, n_nodes) is not None:
        return MISMATCH
    if reported_commit_len is None:
        return NOT_ENOUGH_DATA
    try:
        rep = float(reported_commit_len)
    except (TypeError, ValueError):
        return NOT_ENOUGH_DATA
    if not math.isfinite(rep) or not math.isfinite(estimate.value) or estimate.rel_std > MAX_REL_STD:
        return NOT_ENOUGH_DATA
    lo, hi = estimate.low * (1 - tolerance), estimate.high * (1 + tolerance)
    return CONSISTENT if within(reported_commit_len, lo, hi) else INCONSISTENT




# --------------------------------------------------------------------------- profiles


@dataclass
class CostEntry:
    """r at one grid point. n_nodes / concurrency None means "any" (a hand profile)."""

    r: float
    r_std: float = 0.0
    n_nodes: int | None = None       # N = root + drafts
    concurrency: int | None = None   # c
    t_ar_s: float | None = None      # plain decode step at c
    t_draft_s: float | None = None
    t_verify_s: float | None = None
    samples: int | None = None


@dataclass
class CostProfile:
    """Step cost factors r(N, c). Lookup interpolates linearly inside the grid."""

    entries: list[CostEntry]
    source: str = "manual"           # measured | manual | trace
    meta: dict = field(default_factory=dict)
    path: str | None = None

    @classmethod
    def manual(cls, r: float, r_std: float | None = None) -> CostProfile:
        r = _finite_positive("--cost-factor", r)
        sd = HAND_COST_FACTOR_REL_STD * r if r_std is None else _finite_nonneg("--cost-factor-std", r_std)
        return cls([CostEntry(r=r, r_std=sd)], source="manual",
                   meta={"note": "given by hand" + ("" if r_std is not None else
                                                    f"; spread taken as {HAND_COST_FACTOR_REL_STD:.0%} of r")})

    def to_dict(self) -> dict:
        return {"kind": PROFILE_KIND, "version": PROFILE_VERSION, "source": self.source,
                "meta": self.meta,
                "entries": [{k: v for k, v in asdict(e).items() if v is not None} for e in self.entries]}

    def save(self, path) -> None:
        from specaudit.trace.schema import atomic_write_bytes
        self.meta.setdefault("created_at", time.time())
        atomic_write_bytes(Path(path), (json.dumps(self.to_dict(), indent=1) + "\n").encode())

    @classmethod
    def load(cls, path) -> CostProfile:
        from specaudit.inputs import read_input_bytes
        from specaudit.trace.schema import parse_json_bounded
        p = Path(path)
        if not os.path.lexists(p):
            raise InputError(p, "cost profile not found (make one with `specaudit calibrate`)")
        data = read_input_bytes(p, MAX_PROFILE_BYTES, "--profile")   # a FIFO or a device: refused
        try:
            d = parse_json_bounded(data, p)
        except InputError as e:
            raise InputError(p, f"cost profile is {e.reason}") from None
        if not isinstance(d, dict) or d.get("kind") != PROFILE_KIND:
            raise InputError(p, f"not a cost profile (expected \"kind\": \"{PROFILE_KIND}\")")
        if d.get("version") != PROFILE_VERSION:
            raise InputError(p, f"unknown cost profile version {d.get('version')!r} (this specaudit reads "
                                f"{PROFILE_VERSION})")
        raw = d.get("entries")
        if not isinstance(raw, list) or not raw:
            raise InputError(p, "cost profile has no entries")
        entries = []
        for i, e in enumerate(raw):
            try:
                r = _finite_positive("r", e.get("r"))
                sd = _finite_nonneg("r_std", e.get("r_std", 0.0))
                n = e.get("n_nodes")
                c = e.get("concurrency")
                n = None if n is None else int(n)
                c = None if c is None else int(c)
            except (ValueError, TypeError, AttributeError) as err:
                raise InputError(p, f"entry {i}: {err}") from None
            if (n is not None and n < 1) or (c is not None and c < 1):
                raise InputError(p, f"entry {i}: n_nodes and concurrency must be >= 1")
            entries.append(CostEntry(r=r, r_std=sd, n_nodes=n, concurrency=c,
                                     t_ar_s=e.get("t_ar_s"), t_draft_s=e.get("t_draft_s"),
                                     t_verify_s=e.get("t_verify_s"), samples=e.get("samples")))
        return cls(entries, source=str(d.get("source", "measured")), meta=d.get("meta") or {}, path=str(p))

    def coverage(self) -> str:
        ns = sorted({e.n_nodes for e in self.entries if e.n_nodes is not None})
        cs = sorted({e.concurrency for e in self.entries if e.concurrency is not None})
        part = lambda xs: "any" if not xs else (f"{xs[0]}..{xs[-1]}" if len(xs) > 1 else str(xs[0]))
        return f"N {part(ns)}, c {part(cs)}"

    def lookup(self, n_nodes: int | None = None, concurrency: int | None = None) -> tuple[float, float]:
        """(r, r_std) at (N, c). Wildcard entries match anything; a grid is interpolated
        linearly in N then in c between the nearest grid points. Outside the grid (or
        when the profile needs N or c and it is unknown): InputError."""
        where = self.path
        for e in self.entries:  # exact or wildcard match first
            if (e.n_nodes in (None, n_nodes)) and (e.concurrency in (None, concurrency)):
                return e.r, e.r_std
        if n_nodes is None or concurrency is None:
            raise InputError(where, f"the cost profile is per N and c ({self.coverage()}) but the input does not "
                                    f"say its {'N (nodes per step)' if n_nodes is None else 'concurrency'}; "
                                    "give --n-nodes / --concurrency")
        cs = sorted({e.concurrency for e in self.entries if e.concurrency is not None})
        if not cs or not (cs[0] <= concurrency <= cs[-1]):
            raise InputError(where, f"the cost profile does not cover concurrency {concurrency} ({self.coverage()}); "
                                    "calibrate for it")

        def at_c(c: int) -> tuple[float, float]:
            pts = sorted((e.n_nodes, e.r, e.r_std) for e in self.entries
                         if e.concurrency == c and e.n_nodes is not None)
            wild = [e for e in self.entries if e.concurrency == c and e.n_nodes is None]
            if wild:
                return wild[0].r, wild[0].r_std
            if not pts or not (pts[0][0] <= n_nodes <= pts[-1][0]):
                raise InputError(where, f"the cost profile does not cover N={n_nodes} nodes at concurrency {c} "
                                        f"({self.coverage()}); calibrate for it")
            return _interp(pts, n_nodes)

        lo = max(c for c in cs if c <= concurrency)
        hi = min(c for c in cs if c >= concurrency)
        r_lo, s_lo = at_c(lo)
        if hi == lo:
            return r_lo, s_lo
        r_hi, s_hi = at_c(hi)
        w = (concurrency - lo) / (hi - lo)
        return r_lo + w * (r_hi - r_lo), s_lo + w * (s_hi - s_lo)


def profile_t_ar(profile: CostProfile, concurrency: int) -> float:
    """The plain decode step time at concurrency c from a measured profile (mean over its
    N entries at c, linear between grid points). InputError when it has none there."""
    by_c: dict[int, list] = {}
    for e in profile.entries:
        if e.t_ar_s and e.concurrency is not None:
            by_c.setdefault(e.concurrency, []).append(e.t_ar_s)
    cs = sorted(by_c)
    if not cs or concurrency is None or not (cs[0] <= concurrency <= cs[-1]):
        raise InputError(profile.path, f"the profile has no plain step time at concurrency {concurrency} "
                                       "(give --baseline-tps)")
    lo = max(c for c in cs if c <= concurrency)
    hi = min(c for c in cs if c >= concurrency)
    t_lo, t_hi = (sum(by_c[x]) / len(by_c[x]) for x in (lo, hi))
    return t_lo if hi == lo else t_lo + (concurrency - lo) / (hi - lo) * (t_hi - t_lo)


def _interp(pts: list[tuple[int, float, float]], x: int) -> tuple[float, float]:
    for (x0, r0, s0), (x1, r1, s1) in zip(pts, pts[1:] + pts[-1:]):
        if x0 == x:
            return r0, s0
        if x0 < x <= x1:
            w = (x - x0) / (x1 - x0)
            return r0 + w * (r1 - r0), s0 + w * (s1 - s0)
    return pts[-1][1], pts[-1][2]


# ------------------------------------------------------------ observed throughput


@dataclass
class Observation:
    """One observed throughput figure with what the estimator needs beside it."""

    source: str                       # traces | load | sglang-log | vllm-log | prom-text | cli
    tps: float                        # tokens/s
    tps_std: float = 0.0              # standard error of tps
    concurrency: int | None = None
    n_nodes: int | None = None        # N = root + drafts (budget + 1)
    reported_commit_len: float | None = None
    reported_accept_depth: float | None = None   # mean accepted depth (drafts only), when the input has it
    label: str = ""                   # run id, window, file
    samples: int = 1
    extra: dict = field(default_factory=dict)


def observation_from_load_json(path) -> Observation:
    """The last JSON line of `scripts/load.py` output: client-side tokens/s.

    Uses tokens_per_s (aggregate, client-measured); when per_request_tokens_per_s is a
    list, its spread gives the standard error (relative, applied to the aggregate)."""
    from specaudit.inputs import read_input_text
    p = Path(path)
    lines = [ln for ln in read_input_text(p, MAX_PROFILE_BYTES, "--load", errors="replace").splitlines()
             if ln.strip()]
    obj = None
    for ln in reversed(lines):
        try:
            obj = json.loads(ln)
        except (ValueError, RecursionError):   # not JSON, or nested past the decoder's depth
            continue
        if isinstance(obj, dict):
            break
        obj = None
    if obj is None:
        raise InputError(p, "no JSON object line (expected scripts/load.py output: its last line)")
    if "tokens_per_s" not in obj:
        raise InputError(p, "load output lacks tokens_per_s")
    tps = obj["tokens_per_s"]
    if not isinstance(tps, (int, float)) or isinstance(tps, bool) or not math.isfinite(tps) or tps <= 0:
        raise InputError(p, f"tokens_per_s must be positive, got {tps!r}")
    from specaudit.bounds import BOUNDS, check_value
    try:   # the bounds --observed-tps has: 1e308 or 1e-320 tokens/s is no throughput
        check_value("tokens_per_s", float(tps), *BOUNDS["observed_tps"])
    except ValueError as e:
        raise InputError(p, str(e)) from None
    per = obj.get("per_request_tokens_per_s")
    se = 0.0
    n = int(obj.get("requests") or 1)
    if isinstance(per, list) and len(per) > 1:
        m, s, k = mean_se(per)
        if k > 1 and m > 0:
            se = tps * s / m
            n = k
    elif isinstance(per, dict) and per.get("mean") and per.get("std") is not None:
        k = int(per.get("n") or obj.get("requests") or 1)
        se = tps * float(per["std"]) / float(per["mean"]) / math.sqrt(max(k, 1))
    conc = obj.get("concurrency")
    rep = None
    for key in ("spec_accept_length", "mean_commit_len", "accept_length"):
        if isinstance(obj.get(key), (int, float)):
            rep = float(obj[key])
            break
    return Observation(source="load", tps=float(tps), tps_std=se,
                       concurrency=int(conc) if isinstance(conc, (int, float)) else None,
                       reported_commit_len=rep, label=p.name, samples=n,
                       extra={k: obj[k] for k in ("requests", "completion_tokens", "wall_s") if k in obj})


def observations_from_traces(path) -> list[Observation]:
    """One Observation per run of a trace dataset: steady-state decode throughput from
    its timestamps.

    A batched forward is the rows sharing one t_start; its tokens are the tokens it
    appended (len(committed_tokens): the output clients received, never the commit_len
    counter under audit) and its time is step_s. Only forwards that ran the full
    concurrency c count (the steady state of a long run: not the drain of a finite queue,
    whose half-empty batches cost almost a full step), stalls (a forward over
    STALL_FACTOR x the median step) are set apart, and prefill is outside the steps:
        tps = sum(tokens) / sum(step_s)   over full forwards (all forwards if none is full)
    with the ratio estimator's standard error. The whole run's tokens / wall is kept in
    `extra["run_tps"]`. N = budget + 1; reported = run.json reported.mean_commit_len
    (always bonus-included), else reported.mean_accept_length made bonus-included when the
    manifest declares excludes_bonus (the checker's reading of the conventions)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from specaudit.trace.schema import discover, manifest_conventions

    out = []
    for rf in discover([path]):
        if not rf.step_files:
            raise InputError(rf.run_dir, "run has no steps-*.parquet: nothing to time")
        cols = ["request_id", "committed_tokens", "t_start", "step_s", "budget", "batch_size"]
        try:
            t = pa.concat_tables([pq.read_table(f, columns=cols) for f in rf.step_files])
        except Exception as e:  # pyarrow raises many kinds for broken files
            raise InputError(rf.run_dir, f"cannot read step files: {e}") from None
        if t.num_rows == 0:
            raise InputError(rf.run_dir, "no step rows: nothing to time")
        d = t.to_pydict()
        man = rf.manifest or {}
        cfg = man.get("config") or {}
        conc = int(cfg.get("concurrency") or max((b for b in d["batch_size"] if b is not None), default=1))
        fw: dict[float, list] = {}  # t_start -> [tokens, step_s, rows]
        for ts, toks, ss in zip(d["t_start"], d["committed_tokens"], d["step_s"]):
            if not (isinstance(ts, float) and isinstance(ss, float) and math.isfinite(ts)
                    and math.isfinite(ss) and ss >= 0):
                continue  # a row without its timing (null, NaN, negative) times nothing
            e = fw.setdefault(ts, [0, ss, 0])
            e[0] += len(toks or ())
            e[2] += 1
        if not fw:
            raise InputError(rf.run_dir, "no step row has t_start and step_s: nothing to time")
        full = [e for e in fw.values() if e[2] >= conc]
        used = full if len(full) >= 3 else list(fw.values())
        # stalls: a forward over STALL_FACTOR x the median step (a preemption, the
        # allocator, the garbage collector) is the machine's, not the step's; in a short
        # run one of them moves the rate by tens of percent
        med = sorted(e[1] for e in used)[len(used) // 2]
        stalls = [e for e in used if e[1] > STALL_FACTOR * med]
        if len(stalls) < len(used) // 4:
            used = [e for e in used if e[1] <= STALL_FACTOR * med]
        else:
            stalls = []
        tok = [e[0] for e in used]
        dt = [e[1] for e in used]
        T = sum(dt)
        if T <= 0:
            raise InputError(rf.run_dir, "step times sum to zero: cannot derive a throughput")
        tps = sum(tok) / T
        n = len(used)
        se = 0.0
        if n > 1:  # ratio estimator: var(R) = sum((tok_i - R dt_i)^2) / (n (n - 1) mean(dt)^2)
            mdt = T / n
            se = math.sqrt(sum((a - tps * b) ** 2 for a, b in zip(tok, dt)) / (n * (n - 1))) / mdt
        span = max(a + b for a, b in zip(d["t_start"], d["step_s"])) - min(d["t_start"])
        tokens = sum(len(x or ()) for x in d["committed_tokens"])
        # the pooled mean commit length re-derived from the raw tensors (committed tokens
        # per (request, step) row), never the counter under audit: the judge's alternative
        rows = sum(x is not None for x in d["committed_tokens"])
        # mean_commit_len always counts the bonus (the contract's word); an engine's own
        # "accept length" figure follows its declared convention, as the checker reads it
        reported = man.get("reported") or {}
        rep = reported.get("mean_commit_len")
        if rep is None and reported.get("mean_accept_length") is not None:
            rep = reported["mean_accept_length"]
            if manifest_conventions(man).get("accept_length") == "excludes_bonus":
                rep = rep + 1
        budget = cfg.get("budget", d["budget"][0] if d["budget"] else None)
        depth = reported.get("mean_accepted_depth")
        out.append(Observation(source="traces", tps=tps, tps_std=se, concurrency=conc,
                               n_nodes=(int(budget) + 1) if budget is not None else None,
                               reported_commit_len=rep, label=rf.run_id, samples=n,
                               reported_accept_depth=depth if isinstance(depth, (int, float)) else None,
                               extra={"forwards": len(fw), "full_forwards": len(full), "stalls": len(stalls),
                                      "steady": len(full) >= 3, "tokens": tokens,
                                      "run_tps": tokens / span if span > 0 else None,
                                      "derived_commit_len": tokens / rows if rows else None,
                                      "algo": cfg.get("algo")}))
    return out


# ------------------------------------------------------------------ the pipeline


def reported_figure(name: str, x) -> float | None:
    """A reported mean given by a user: None, or a finite number above 0 (ValueError otherwise:
    a commit length is at least 1 token per step, a depth at least 0 but an engine reporting
    exactly 0 has not speculated)."""
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, not {x!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be above 0 (a mean per verify step), got {x!r}")
    return v


STEP_RATE_FACTOR = 1.5   # implied step rates further apart than this: two groups of windows
MIN_WINDOWS = 4          # windows of one (rank, concurrency, graph mode) group before a split is judged


def _median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def split_by_step_rate(ws):
    """Two groups of windows whose implied step rates (gen tps / (c * accept len)) sit apart
    by more than STEP_RATE_FACTOR at their widest gap, out of at least MIN_WINDOWS windows:
    (low_rate, high_rate, factor) in file order, or None. low_rate are the windows whose
    accept len claims more tokens per step at the same throughput. Neither side is
    presumed right, however many windows it has."""
    rs = sorted(ws, key=lambda w: w.step_rate)
    if len(rs) < MIN_WINDOWS:
        return None
    best, at = 1.0, None
    for i in range(1, len(rs)):
        g = rs[i].step_rate / rs[i - 1].step_rate if rs[i - 1].step_rate > 0 else math.inf
        if g > best:
            best, at = g, i
    if at is None or best <= STEP_RATE_FACTOR:
        return None
    lo, hi = rs[:at], rs[at:]
    factor = _median([w.step_rate for w in hi]) / _median([w.step_rate for w in lo])
    return (sorted(lo, key=lambda w: w.line or 0), sorted(hi, key=lambda w: w.line or 0), factor)


def lines(ws) -> str:
    ls = [str(w.line) for w in ws if w.line is not None]
    return ("line " if len(ls) == 1 else "lines ") + (", ".join(ls) if len(ls) <= 6 else
                                                     f"{', '.join(ls[:5])}, ... ({len(ls)} windows)")


def observations_from_reading(reading, concurrency=None) -> list[Observation]:
    """Observations from an engine log or scrape: mean throughput over its windows.

    When the windows fall into two groups whose accept len disagree at the same throughput
    (SA708's split_by_step_rate), each group is one Observation, so a baseline judges each
    group's counter on its own instead of their average."""
    ws = [w for w in reading.windows if w.gen_tps is not None and w.gen_tps > 0 and not w.extra.get("counter_reset")]
    if concurrency is not None:
        ws = [w for w in ws if w.concurrency is not None and round(w.concurrency) == concurrency]
    if not ws:
        why = f" at concurrency {concurrency}" if concurrency is not None else ""
        raise InputError(reading.path, f"no window with a positive generation throughput{why} (a single "
                                       "Prometheus scrape has no rate: append a second one)")
    rated = [w for w in ws if w.step_rate is not None]
    from specaudit.invariants.sa7xx_spans import at_request_end, spans
    judged = spans(rated) if at_request_end(reading) else rated   # llama.cpp: request-end counters
    sp = split_by_step_rate(judged) if len(rated) == len(ws) else None
    if sp is None:
        return [_observation(reading, ws, Path(reading.path).name)]
    lo, hi, _ = sp
    return [_observation(reading, g, f"{Path(reading.path).name} {lines(g)}") for g in sorted(
        (lo, hi), key=lambda g: g[0].line or 0)]


def _observation(reading, ws, label: str) -> Observation:
    m, se, n = mean_se([w.gen_tps for w in ws])
    cs = [w.concurrency for w in ws if w.concurrency is not None]
    ls = [w.accept_len for w in ws if w.accept_len is not None]
    cfg = reading.config
    n_nodes = cfg.get("num_draft_tokens") or ((cfg["num_spec_tokens"] + 1) if cfg.get("num_spec_tokens") else None)
    extra = {}
    if cs and (max(cs) - min(cs)) / max(max(cs), 1) > 0.25:
        extra["confounder"] = (f"concurrency varies {min(cs):g}..{max(cs):g} across the windows; "
                               "pass --concurrency to use one level")
    conc = round(sum(cs) / len(cs)) if cs else None
    rep = sum(ls) / len(ls) if ls else None
    if rep is not None and not reading.includes_bonus:
        rep += 1
    return Observation(source=reading.source, tps=m, tps_std=se, concurrency=conc, n_nodes=n_nodes,
                       reported_commit_len=rep, label=label, samples=n, extra=extra)


def _is_load_json(path: Path) -> bool:
    from specaudit.inputs import open_input
    try:
        with open_input(path) as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 65536))
            tail = f.read().decode("utf-8", errors="replace")
    except (OSError, InputError):
        return False
    for ln in reversed([x for x in tail.splitlines() if x.strip()]):
        try:
            obj = json.loads(ln)
        except (ValueError, RecursionError):
            return False
        return isinstance(obj, dict) and "tokens_per_s" in obj
    return False


def gather(input=None, *, observed_tps=None, observed_std=0.0, load=None, source=None, concurrency=None,
           n_nodes=None) -> list[Observation]:
    """The observed throughput(s): --observed-tps, a load.py output, a trace dataset, or an
    engine log / scrape (read through specaudit.audit.sources)."""
    if load:
        if input:
            raise ValueError("give either INPUT or --load FILE, not both")
        return [observation_from_load_json(load)]
    if observed_tps is not None and input:
        raise ValueError("give either INPUT or --observed-tps, not both")
    if observed_tps is not None:
        return [Observation(source="cli", tps=observed_tps, tps_std=observed_std or 0.0,
                            concurrency=concurrency, n_nodes=n_nodes, label="--observed-tps")]
    if not input:
        raise ValueError("no observed throughput: give --observed-tps or an INPUT file/folder")
    p = Path(input)
    if not p.exists():
        raise InputError(p, "no such file or folder")
    if p.is_dir():
        return observations_from_traces(p)
    if source is None and _is_load_json(p):
        return [observation_from_load_json(p)]
    from specaudit.audit.sources import read_source
    return observations_from_reading(read_source(p, source), concurrency)


def baseline_for(obs: Observation, *, baseline_tps=None, baseline_std=0.0, baseline_file=None,
                 baseline_from_profile=False, profile=None, concurrency=None) -> tuple[float, float, str]:
    """(plain decoding tokens/s, its sd, where it came from)."""
    if baseline_tps is not None and baseline_file:
        raise ValueError("give either --baseline-tps or --baseline FILE, not both")
    if baseline_file:
        o = observation_from_load_json(baseline_file)
        return o.tps, o.tps_std, o.label
    if baseline_tps is not None:
        return baseline_tps, baseline_std or 0.0, "--baseline-tps"
    if profile and baseline_from_profile:
        c = concurrency or obs.concurrency
        prof = profile if isinstance(profile, CostProfile) else CostProfile.load(profile)
        t_ar = profile_t_ar(prof, c)
        return c / t_ar, 0.0, f"c / t_ar({c}) of the profile"
    raise ValueError("no baseline: give --baseline-tps (plain decoding tokens/s at the same concurrency), "
                     "--baseline FILE, or --baseline-from-profile")


def cost_for(obs: Observation, *, cost_factor=None, cost_factor_std=None, profile=None, n_nodes=None,
             concurrency=None) -> tuple[float, float, str]:
    """(r, its sd, where it came from)."""
    if cost_factor is not None and profile:
        raise ValueError("give either --cost-factor or --profile, not both")
    if cost_factor is not None:
        r, sd = CostProfile.manual(cost_factor, cost_factor_std).lookup()
        return r, sd, "by hand" + ("" if cost_factor_std is not None else ", spread 10% of r")
    if profile:
        prof = profile if isinstance(profile, CostProfile) else CostProfile.load(profile)
        n = n_nodes or obs.n_nodes
        c = concurrency or obs.concurrency
        r, sd = prof.lookup(n, c)
        return r, sd, f"profile {Path(prof.path or 'profile').name} at N={n}, c={c}"
    raise ValueError("no cost factor: give --profile FILE (measured by `specaudit calibrate`), --hardware gpu|cpu "
                     "(judge each counter by the r it implies), or --cost-factor R")


def band_for(*, profile=None, cost_factor=None, cost_factor_std=None, hardware=None, n_nodes=None,
             concurrency=None, tolerance: float = DEFAULT_TOLERANCE) -> RBand | None:
    """The r band from what the user gave (profile > hand > hardware class), or None."""
    from specaudit.audit.r_band import band_from_hardware, band_from_r
    if profile is not None:
        prof = profile if isinstance(profile, CostProfile) else CostProfile.load(profile)
        r, sd = prof.lookup(n_nodes, concurrency)
        how = "measured" if prof.source == "measured" else prof.source
        return band_from_r(r, sd, tolerance, f"profile {Path(prof.path or 'profile').name} at N={n_nodes}, "
                                             f"c={concurrency}: {how} r {_f(r)}, sd {_f(sd)}", "profile")
    if cost_factor is not None:
        prof = CostProfile.manual(cost_factor, cost_factor_std)
        r, sd = prof.lookup()
        return band_from_r(r, sd, tolerance, f"--cost-factor {_f(r)} by hand (sd {_f(sd)}): a guess unless "
                                             "measured", "hand")
    if hardware is not None:
        return band_from_hardware(hardware, n_nodes)
    return None


def _rivals(est: Estimate, ok: list, derived, tolerance: float, n_nodes) -> list:
    """The admitted figures that a derived commit length inside the band disagrees with. A
    depth counter agrees when the derived commit length sits where the identity puts it
    (depth + 1, or at most IDENTITY_CUT_SLACK below: the cut last steps of requests)."""
    if derived is None or not ok:
        return []
    from specaudit.audit.compare import agrees
    if verdict(est, derived, tolerance, n_nodes) != CONSISTENT:
        return []

    def fits(f):
        c = f["as_commit_len"]
        return bool(agrees(c, derived)) or (f["counter"] == "accepted depth"
                                            and c * (1 - IDENTITY_CUT_SLACK) <= derived <= c)
    return [f for f in ok if not fits(f)]


def _figures(reported_commit_len, reported_accept_depth, commit_from: str, depth_from: str) -> list:
    figs = []
    if reported_commit_len is not None:
        figs.append({"counter": "commit length", "reported": reported_commit_len,
                     "as_commit_len": reported_commit_len, "from": commit_from})
    if reported_accept_depth is not None:
        figs.append({"counter": "accepted depth", "reported": reported_accept_depth,
                     "as_commit_len": reported_accept_depth + 1, "from": depth_from})
    return figs


def identity_sentence(reported_commit_len, reported_accept_depth) -> str | None:
    """commit = depth + 1 between two reported means (None unless both are given)."""
    if reported_commit_len is None or reported_accept_depth is None:
        return None
    from specaudit.audit.compare import agrees
    d1 = reported_accept_depth + 1
    word = ("per unfinished step; a mean sits at most "
            f"{IDENTITY_CUT_SLACK:.0%} below, the cut last steps of requests")
    # means over a run: the step that ends a request is cut at EOS or the token limit, so
    # the mean commit length sits at or a little below mean depth + 1 (IDENTITY_CUT_SLACK)
    holds = bool(agrees(reported_commit_len, d1)) or (
        d1 * (1 - IDENTITY_CUT_SLACK) <= reported_commit_len <= d1)
    return (f"commit length = accepted depth + 1 ({word}): {_f(reported_commit_len)} against "
            f"{_f(reported_accept_depth)} + 1 = {_f(d1)}: "
            + ("holds" if holds else "broken, so at least one of the two counters is wrong"))


def judge(est: Estimate, *, reported_commit_len=None, reported_accept_depth=None,
          tolerance: float = DEFAULT_TOLERANCE, n_nodes: int | None = None, algo: str | None = None,
          commit_from: str = "reported", depth_from: str = "reported", derived_commit_len=None) -> dict:
    """Judge one or both counters against one estimate; the answer ends in one sentence.

    Returns {"verdict", "figures": [{counter, reported, as_commit_len, from, verdict}],
    "identity": sentence or None, "conclusion": sentence}. The overall verdict is the
    worst figure's (inconsistent > calibration mismatch > not enough data > consistent).

    Wording: a band that holds a figure *admits* it; the evidence *supports* a counter only
    when it tells it apart from the alternative (the other counter falls outside the band,
    and no other figure in the band disagrees with it). `derived_commit_len` (a trace's
    committed tokens per step, re-derived from the raw tensors) is such an alternative:
    when the band holds it beside an admitted counter that it disagrees with, throughput
    cannot tell the two apart, and the conclusion says so and what decides."""
    figs = _figures(reported_commit_len, reported_accept_depth, commit_from, depth_from)
    for f in figs:
        f["verdict"] = verdict(est, f["as_commit_len"], tolerance, n_nodes)
    band = f"[{_f(est.low * (1 - tolerance))}, {_f(est.high * (1 + tolerance))}]"
    identity = identity_sentence(reported_commit_len, reported_accept_depth)
    problem = range_problem(est, n_nodes)
    if problem:
        overall = MISMATCH
        conclusion = f"Cannot judge the engine: {problem}."
    elif not figs:
        overall = NOT_ENOUGH_DATA
        conclusion = ("Nothing to judge: no reported figure (give --reported-commit-len and/or "
                      "--reported-accept-depth).")
    elif est.rel_std > MAX_REL_STD:
        overall = NOT_ENOUGH_DATA
        conclusion = (f"Cannot tell: the throughput estimate {_f(est.value)} is too uncertain (relative sd "
                      f"{est.rel_std:.0%}) to tell any two figures apart; a measured cost profile "
                      "(`specaudit calibrate`) or more windows would decide.")
    else:
        ok = [f for f in figs if f["verdict"] == CONSISTENT]
        bad = [f for f in figs if f["verdict"] == INCONSISTENT]
        overall = INCONSISTENT if bad else CONSISTENT

        def name(f):
            return (f"the {f['counter']} counter ({_f(f['reported'])}"
                    + (f", i.e. {_f(f['as_commit_len'])} tokens per step)" if f["counter"] == "accepted depth"
                       else ")"))
        est_s = f"the throughput estimate {_f(est.value)} tokens per step (band {band})"
        # the re-derived figure, when the band holds it and it disagrees with an admitted counter:
        # throughput cannot tell that counter from the truth the trace's raw tensors give
        rivals = _rivals(est, ok, derived_commit_len, tolerance, n_nodes)
        if rivals:
            d = _f(derived_commit_len)
            head = (f"The evidence contradicts {name(bad[0])}; " if bad else "")
            conclusion = (head + f"{est_s} admits {' and '.join(name(f) for f in rivals)} but also holds the "
                          f"derived {d} tokens per step (the trace's committed tokens), so throughput cannot tell "
                          f"{'them' if len(rivals) > 1 else 'the two'} apart; the per-step trace decides: "
                          "`specaudit check` compares each counter with the committed tokens (SA5xx), or a "
                          "narrower band (a measured profile, more windows).")
            conclusion = conclusion[0].upper() + conclusion[1:]
        elif len(figs) == 2 and len(ok) == 1:
            conclusion = (f"The evidence supports {name(ok[0])} and contradicts {name(bad[0])}: "
                          f"{est_s} says the {bad[0]['counter']} counter is the wrong one.")
        elif len(figs) == 2 and len(bad) == 2:
            conclusion = f"The evidence contradicts both counters: {est_s} matches neither."
        elif len(figs) == 2 and identity and "broken" in identity:
            overall = NOT_ENOUGH_DATA   # one of them is wrong, and the evidence cannot say which
            conclusion = (f"Cannot tell which counter is wrong: {est_s} admits both, although they break the "
                          "identity; a narrower estimate (a measured profile, more windows) would decide.")
        elif len(figs) == 2:
            conclusion = f"The evidence admits both counters: {est_s} holds them, and they agree."
        elif bad:
            conclusion = f"The evidence contradicts {name(bad[0])}: {est_s}."
        else:
            conclusion = (f"The evidence admits {name(ok[0])}: {est_s} holds it (a band admits every figure "
                          "inside it; it tells this counter from none other).")
    return {"verdict": overall, "figures": figs, "identity": identity, "conclusion": conclusion}


def _reported(obs: Observation, reported_commit_len, reported_accept_depth):
    """The counters to judge: the ones given on the command line win over the input's."""
    if reported_commit_len is not None or reported_accept_depth is not None:
        return reported_commit_len, "--reported-commit-len", reported_accept_depth, "--reported-accept-depth"
    return (obs.reported_commit_len, f"from {obs.source}", obs.reported_accept_depth, f"from {obs.source}")


R_STATUS = {CONSISTENT: "possible", INCONSISTENT: "contradicted"}
R_VERDICT = {"named": INCONSISTENT, "contradicted": INCONSISTENT, "possible": CONSISTENT,
             "both excluded": MISMATCH, "nothing": NOT_ENOUGH_DATA}


def r_band_judgement(obs: Observation, base: tuple, band, *, reported_commit_len=None,
                     reported_accept_depth=None, tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """No cost factor: each counter's implied r against a band for r (specaudit.audit.r_band).
    The result has the keys estimate_and_judge's has where they mean something here."""
    from specaudit.audit.r_band import judge_r
    b, b_sd, b_label = base
    rep, rep_from, dep, dep_from = _reported(obs, reported_commit_len, reported_accept_depth)
    figs = _figures(rep, dep, rep_from, dep_from)
    rj = judge_r(figs, obs.tps, obs.tps_std, b, b_sd, band)
    identity = identity_sentence(rep, dep)
    v = R_VERDICT.get(rj["outcome"])
    if rj["outcome"] == "both possible":
        v = NOT_ENOUGH_DATA if identity and "broken" in identity else CONSISTENT
    for f, x in zip(figs, rj["figures"]):
        f["verdict"] = {"possible": CONSISTENT, "contradicted": INCONSISTENT}[x["status"]]
        f["implied_r"] = x["implied_r"]
    return {"label": obs.label, "source": obs.source, "concurrency": obs.concurrency, "n_nodes": obs.n_nodes,
            "samples": obs.samples, "mode": "r band", "observed_tps": obs.tps, "observed_std": obs.tps_std,
            "baseline_tps": b, "baseline_std": b_sd, "baseline_from": b_label, "r_band": rj, "figures": figs,
            "verdict": v, "tolerance": tolerance, "identity": identity, "conclusion": rj["conclusion"]}


def estimate_and_judge(obs: Observation, base: tuple, cost: tuple, *, reported_commit_len=None,
                       reported_accept_depth=None, tolerance: float = DEFAULT_TOLERANCE,
                       algo: str | None = None, band=None) -> dict:
    """One observation through the model and the judgement: the result dict that the CLI
    prints (text or JSON). base = (tps, sd, label), cost = (r, sd, label). Figures given
    here win over the ones the observation carries."""
    b, b_sd, b_label = base
    r, r_sd, r_label = cost
    est = estimate_commit_length(obs.tps, b, r, cost_factor_std=r_sd, tps_std=obs.tps_std, baseline_std=b_sd)
    rep, rep_from, dep, dep_from = _reported(obs, reported_commit_len, reported_accept_depth)
    j = judge(est, reported_commit_len=rep, reported_accept_depth=dep, tolerance=tolerance, n_nodes=obs.n_nodes,
              algo=algo or obs.extra.get("algo"), commit_from=rep_from, depth_from=dep_from,
              derived_commit_len=obs.extra.get("derived_commit_len"))
    main = j["figures"][0] if j["figures"] else None
    res = {"label": obs.label, "source": obs.source, "concurrency": obs.concurrency, "n_nodes": obs.n_nodes,
           "samples": obs.samples, "cost_factor_from": r_label, "baseline_from": b_label,
           "estimate": est.to_dict(), "reported_commit_len": main["as_commit_len"] if main else None,
           "reported_from": main["from"] if main else None, "verdict": j["verdict"], "tolerance": tolerance,
           "figures": j["figures"], "identity": j["identity"], "conclusion": j["conclusion"]}
    for f in j["figures"]:
        pv, plo, phi = est.predicted_tps(f["as_commit_len"])
        f["predicted_tps"] = {"value": round(pv, 3), "low": round(plo, 3), "high": round(phi, 3)}
    if main:
        res["predicted_tps"] = main["predicted_tps"]
    if obs.extra.get("derived_commit_len") is not None:
        res["derived_commit_len"] = round(obs.extra["derived_commit_len"], 4)
    if range_problem(est, obs.n_nodes):
        res["note"] = range_problem(est, obs.n_nodes)
    if obs.extra.get("confounder"):
        res["confounder"] = obs.extra["confounder"]
    if band is not None and j["figures"]:
        # how much the verdict rests on r: the r each counter implies, beside r's band; the
        # statuses are the estimate's verdicts (the same model read the other way round)
        from specaudit.audit.r_band import judge_r
        rj = judge_r(j["figures"], obs.tps, obs.tps_std, b, b_sd, band)
        for f, x in zip(j["figures"], rj["figures"]):
            x["status"] = R_STATUS.get(f["verdict"], f["verdict"])
            f["implied_r"] = x["implied_r"]
        rj.pop("conclusion")
        rj.pop("outcome")
        res["r_band"] = rj
    return res


@dataclass
class EstimateReport:
    """What `specaudit estimate` answers: one result per observation, the worst verdict."""

    results: list
    verdict: str

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "results": self.results}


def run_estimate(input=None, *, observed_tps=None, observed_std=0.0, load=None, source=None, baseline_tps=None,
                 baseline_std=0.0, baseline_file=None, baseline_from_profile=False, cost_factor=None,
                 cost_factor_std=None, profile=None, n_nodes=None, concurrency=None, reported_commit_len=None,
                 reported_accept_depth=None, tolerance: float = DEFAULT_TOLERANCE,
                 hardware: str | None = None, budget: int | None = None) -> EstimateReport:
    """The whole estimator: inputs -> observations -> estimate -> judgement of one or both
    counters. Without a cost factor or a profile, `hardware` (a class of
    specaudit.audit.r_band.HARDWARE) judges each counter by the r it implies instead.
    ValueError / InputError (one line) for bad input."""
    if tolerance is None or not (0 <= tolerance < 1):
        raise ValueError(f"--tolerance must be in [0, 1), got {tolerance}")
    reported_commit_len = reported_figure("--reported-commit-len", reported_commit_len)
    reported_accept_depth = reported_figure("--reported-accept-depth", reported_accept_depth)
    if budget is not None:
        if budget < 1:
            raise ValueError(f"--budget must be at least 1 drafted token per step, got {budget}")
        if n_nodes is not None and n_nodes != budget + 1:
            raise ValueError(f"--budget {budget} means N = {budget + 1} verify nodes, but --n-nodes is {n_nodes}")
        n_nodes = budget + 1
    if n_nodes is not None and n_nodes < 1:
        raise ValueError(f"--n-nodes must be at least 1, got {n_nodes}")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
    obs = gather(input, observed_tps=observed_tps, observed_std=observed_std, load=load, source=source,
                 concurrency=concurrency, n_nodes=n_nodes)
    prof = CostProfile.load(profile) if profile else None
    results = []
    for o in obs:
        if n_nodes is not None:
            o.n_nodes = n_nodes
        base = baseline_for(o, baseline_tps=baseline_tps, baseline_std=baseline_std, baseline_file=baseline_file,
                            baseline_from_profile=baseline_from_profile, profile=prof, concurrency=concurrency)
        if hardware is not None and (cost_factor is not None or prof is not None):
            raise ValueError("give one source of r: --cost-factor, --profile or --hardware")
        band = band_for(profile=prof, cost_factor=cost_factor, cost_factor_std=cost_factor_std, hardware=hardware,
                        n_nodes=n_nodes or o.n_nodes, concurrency=concurrency or o.concurrency, tolerance=tolerance)
        if hardware is not None:
            results.append(r_band_judgement(o, base, band, reported_commit_len=reported_commit_len,
                                            reported_accept_depth=reported_accept_depth, tolerance=tolerance))
            continue
        cost = cost_for(o, cost_factor=cost_factor, cost_factor_std=cost_factor_std, profile=prof, n_nodes=n_nodes,
                        concurrency=concurrency)
        results.append(estimate_and_judge(o, base, cost, reported_commit_len=reported_commit_len,
                                          reported_accept_depth=reported_accept_depth, tolerance=tolerance,
                                          band=band))
    overall = max((r["verdict"] for r in results), key=lambda v: SEVERITY[v])
    return EstimateReport(results, overall)


def live_judgement(tps: float, tps_std: float, *, concurrency: int, n_nodes: int, profile: CostProfile,
                   baseline_tps: float, reported_commit_len=None, tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """A live server's window through the same pipeline as `specaudit estimate`: the
    estimate, its verdict on the reported mean commit length, and the sentence. profile:
    a CostProfile (CostProfile.manual(r) for a hand-given factor); baseline_tps: plain
    decoding tokens/s of the same kind as tps (per request or aggregate) at concurrency."""
    obs = Observation(source="live", tps=tps, tps_std=tps_std if math.isfinite(tps_std) else 0.0,
                      concurrency=concurrency, n_nodes=n_nodes, reported_commit_len=reported_commit_len,
                      label="live window")
    r, r_sd = profile.lookup(n_nodes, concurrency)
    return estimate_and_judge(obs, (baseline_tps, 0.0, "baseline"), (r, r_sd, "profile"), tolerance=tolerance)


def _format_r_only(res: dict) -> str:
    from specaudit.audit.r_band import format_r
    where = ", ".join(f"{k}={res[v]}" for k, v in (("c", "concurrency"), ("N", "n_nodes")) if res.get(v))
    head = res["label"] + (f" ({where})" if where else "")
    out = [f"{head}:",
           f"  observed {res['observed_tps']:.1f} tokens/s (sd {res['observed_std']:.1f}), baseline "
           f"{res['baseline_tps']:.1f} tokens/s (sd {res['baseline_std']:.1f}, {res['baseline_from']}); "
           "no cost factor: each counter's implied r = commit length * baseline / observed"]
    rl = format_r(res["r_band"])
    out += rl[:-1]
    if res.get("identity"):
        out.append(f"  identity: {res['identity']}")
    out.append(f"  verdict: {res['verdict']}")
    out.append(rl[-1])
    return "\n".join(out) + "\n"


def format_text(res: dict) -> str:
    """One result as the CLI's text block."""
    if res.get("mode") == "r band":
        return _format_r_only(res)
    e = res["estimate"]
    head = res["label"] + (f" (c={res['concurrency']}, N={res['n_nodes']})"
                           if res.get("concurrency") or res.get("n_nodes") else "")
    out = [f"{head}:",
           f"  observed {e['observed_tps']:.1f} tokens/s (sd {e['tps_std']:.1f}), baseline {e['baseline_tps']:.1f} "
           f"tokens/s (sd {e['baseline_std']:.1f}), cost factor r = {e['cost_factor']:.3f} (sd "
           f"{e['cost_factor_std']:.3f}, {res['cost_factor_from']})",
           f"  estimated commit length {e['value']:.2f}  95% [{e['low']:.2f}, {e['high']:.2f}]  "
           f"= {e['observed_tps']:.1f} / {e['baseline_tps']:.1f} * {e['cost_factor']:.3f}"]
    for f in res.get("figures") or ():
        p = f["predicted_tps"]
        as_c = f" (= {f['as_commit_len']:.2f} tokens per step)" if f["counter"] == "accepted depth" else ""
        out.append(f"  reported {f['counter']} {f['reported']:.2f}{as_c} ({f['from']}) would give {p['value']:.1f} "
                   f"tokens/s [{p['low']:.1f}, {p['high']:.1f}]: {f['verdict']}")
    if res.get("derived_commit_len") is not None:
        out.append(f"  derived commit length {res['derived_commit_len']:.2f} (committed tokens per step, from the "
                   "trace's raw tensors)")
    if res.get("r_band"):
        from specaudit.audit.r_band import format_r
        out += format_r({**res["r_band"], "conclusion": ""})[:-1]
        out.append("  (the verdict rests on r: each counter above holds for the r it implies)")
    if res.get("identity"):
        out.append(f"  identity: {res['identity']}")
    for k in ("note", "confounder"):
        if res.get(k) and not (k == "note" and res["verdict"] == MISMATCH):   # the conclusion says it
            out.append(f"  {k}: {res[k]}")
    out.append(f"  verdict: {res['verdict']} (tolerance {res['tolerance']:.0%})")
    out.append(f"  {res['conclusion']}")
    return "\n".join(out) + "\n"
