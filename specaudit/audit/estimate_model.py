"""Throughput-derived commit length: the model, its interval and its verdict on one figure.

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

The rest of the estimator: cost profiles (audit/cost_profile.py), observed throughput
(audit/observed_throughput.py), judging one or two counters (audit/estimate_judge.py) and
the pipeline `specaudit estimate` runs (audit/estimate.py).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

Z95 = 1.959963984540054   # two-sided 95% normal quantile
MAX_REL_STD = 0.25        # s above this: the 95% interval spans more than x1.6 either way
DEFAULT_TOLERANCE = 0.1

CONSISTENT, INCONSISTENT, NOT_ENOUGH_DATA = "consistent", "inconsistent", "not enough data"
MISMATCH = "calibration mismatch"


def finite_positive(name: str, x, what: str = "a positive number of tokens/s or a positive factor") -> float:
    """float(x) when it is finite and above 0; else ValueError: `{name} must be {what}, got x`."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, not {x!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be {what}, got {x!r}")
    return v


def finite_nonneg(name: str, x) -> float:
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
    tps = finite_positive("observed throughput", observed_tps)
    base = finite_positive("baseline throughput", baseline_tps)
    r = finite_positive("cost factor", cost_factor)
    sr = finite_nonneg("cost factor std", cost_factor_std)
    st = finite_nonneg("observed throughput std", tps_std)
    sb = finite_nonneg("baseline throughput std", baseline_std)
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
