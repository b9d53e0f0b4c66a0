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
    consistent      low * (1 - tol) <= R <= high * (1 + tol)
    inconsistent    outside that band
    not enough data R missing, or the interval is too wide to tell anything apart
                    (s > MAX_REL_STD: a wide interval would call every reading consistent)

Cost profiles (written by `specaudit calibrate`) give r and its spread for a grid of
(N, c); `CostProfile.lookup(n_nodes, concurrency)` interpolates inside the grid and
refuses outside it.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specaudit.trace.schema import InputError

Z95 = 1.959963984540054   # two-sided 95% normal quantile
MAX_REL_STD = 0.25        # s above this: the 95% interval spans more than x1.6 either way
DEFAULT_TOLERANCE = 0.1
# A cost factor typed by hand is one number for every context length and batch shape;
# measured profiles of the reference runtime spread by about this much over a run's
# context lengths, so a hand-given r without its own spread is taken as +-10% (1 sd).
HAND_COST_FACTOR_REL_STD = 0.10
STALL_FACTOR = 4.0        # trace forwards slower than this x the median are stalls, set apart

CONSISTENT, INCONSISTENT, NOT_ENOUGH_DATA = "consistent", "inconsistent", "not enough data"
PROFILE_KIND = "specaudit-cost-profile"
PROFILE_VERSION = 1


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


def verdict(estimate: Estimate, reported_commit_len, tolerance: float = DEFAULT_TOLERANCE) -> str:
    """consistent / inconsistent / not enough data (see the module docstring)."""
    if tolerance is None or not (0 <= float(tolerance) < 1):
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    if reported_commit_len is None:
        return NOT_ENOUGH_DATA
    try:
        rep = float(reported_commit_len)
    except (TypeError, ValueError):
        return NOT_ENOUGH_DATA
    if not math.isfinite(rep) or not math.isfinite(estimate.value) or estimate.rel_std > MAX_REL_STD:
        return NOT_ENOUGH_DATA
    lo, hi = estimate.low * (1 - tolerance), estimate.high * (1 + tolerance)
    return CONSISTENT if lo <= rep <= hi else INCONSISTENT


def mean_and_se(samples) -> tuple[float, float, int]:
    """Mean, standard error of the mean, and count of finite samples (se 0 for one)."""
    xs = [float(x) for x in samples if x is not None and math.isfinite(float(x))]
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0
    m = sum(xs) / n
    if n == 1:
        return m, 0.0, 1
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    return m, math.sqrt(var / n), n


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
        p = Path(path)
        try:
            d = json.loads(p.read_text())
        except FileNotFoundError:
            raise InputError(p, "cost profile not found (make one with `specaudit calibrate`)") from None
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(p, f"cannot read cost profile: {e}") from None
        except json.JSONDecodeError as e:
            raise InputError(p, f"cost profile is not JSON ({e.msg} at line {e.lineno})") from None
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
        part = lambda xs: "any" if not xs else (f"{xs[0]}..{xs[-1]}" if len(xs) > 1 else str(xs[0]))  # noqa: E731
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
    label: str = ""                   # run id, window, file
    samples: int = 1
    extra: dict = field(default_factory=dict)


def observation_from_load_json(path) -> Observation:
    """The last JSON line of `scripts/load.py` output: client-side tokens/s.

    Uses tokens_per_s (aggregate, client-measured); when per_request_tokens_per_s is a
    list, its spread gives the standard error (relative, applied to the aggregate)."""
    p = Path(path)
    try:
        lines = [ln for ln in p.read_text().splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(p, f"cannot read: {e}") from None
    obj = None
    for ln in reversed(lines):
        try:
            obj = json.loads(ln)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            break
        obj = None
    if obj is None:
        raise InputError(p, "no JSON object line (expected scripts/load.py output: its last line)")
    if "tokens_per_s" not in obj:
        raise InputError(p, "load output lacks tokens_per_s")
    tps = obj["tokens_per_s"]
    if not isinstance(tps, (int, float)) or not math.isfinite(tps) or tps <= 0:
        raise InputError(p, f"tokens_per_s must be positive, got {tps!r}")
    per = obj.get("per_request_tokens_per_s")
    se = 0.0
    n = int(obj.get("requests") or 1)
    if isinstance(per, list) and len(per) > 1:
        m, s, k = mean_and_se(per)
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
        conc = int(cfg.get("concurrency") or max(d["batch_size"]))
        fw: dict[float, list] = {}  # t_start -> [tokens, step_s, rows]
        for ts, toks, ss in zip(d["t_start"], d["committed_tokens"], d["step_s"]):
            e = fw.setdefault(ts, [0, ss, 0])
            e[0] += len(toks or ())
            e[2] += 1
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
        # mean_commit_len always counts the bonus (the contract's word); an engine's own
        # "accept length" figure follows its declared convention, as the checker reads it
        reported = man.get("reported") or {}
        rep = reported.get("mean_commit_len")
        if rep is None and reported.get("mean_accept_length") is not None:
            rep = reported["mean_accept_length"]
            if manifest_conventions(man).get("accept_length") == "excludes_bonus":
                rep = rep + 1
        budget = cfg.get("budget", d["budget"][0] if d["budget"] else None)
        out.append(Observation(source="traces", tps=tps, tps_std=se, concurrency=conc,
                               n_nodes=(int(budget) + 1) if budget is not None else None,
                               reported_commit_len=rep, label=rf.run_id, samples=n,
                               extra={"forwards": len(fw), "full_forwards": len(full), "stalls": len(stalls),
                                      "steady": len(full) >= 3, "tokens": tokens,
                                      "run_tps": tokens / span if span > 0 else None,
                                      "algo": cfg.get("algo")}))
    return out


def timing_cost_factor(draft_s, verify_s, t_ar_s: float) -> tuple[float, float]:
    """r from a trace's own per-step timings against a plain decode step time:
    r = mean(draft_s + verify_s) / t_ar, with the standard error of that mean."""
    t_ar = _finite_positive("plain decode step time", t_ar_s)
    m, se, n = mean_and_se([a + b for a, b in zip(draft_s, verify_s)])
    if n == 0:
        raise ValueError("no step timings to derive a cost factor from")
    return m / t_ar, se / t_ar
