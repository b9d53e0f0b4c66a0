"""The one A/B decision and its "same" band, for both A/B modes.

    from specaudit.ab_verdict import SAME_WITHIN, verdict
    verdict([lo, hi], base=a_mean, same_within=SAME_WITHIN)   # "same" | "A better" | "B better" | "undecided"

The runtime arms (specaudit.traced_ab) and A/B from evidence
(specaudit.audit.ab_evidence) both decide with `verdict` from the 95% interval of B - A,
higher being better: `same` when the interval lies within +-same_within of A, `B better` /
`A better` when it excludes 0, else `undecided`. SAME_WITHIN is the band's default
(`specaudit ab --same-within`), defined here only; `check_same_within` is the one refusal
of a band outside [0, 1).

Ground floor of the A/B: imports nothing of specaudit, so the runtime layer and the
readers both import it at top level without a circle.
"""
from __future__ import annotations

import math

SAME_WITHIN = 0.02     # "same" when B - A lies within 2% of A (the default of --same-within)
VERDICTS = ("same", "A better", "B better", "undecided")


def check_same_within(same_within: float) -> None:
    """ValueError (one line, naming the flag) unless 0 <= same_within < 1."""
    if not 0 <= same_within < 1:
        raise ValueError(f"--same-within must be a fraction in [0, 1) (got {same_within})")


def verdict(diff_ci, base: float, same_within: float) -> str:
    """Verdict from the 95% interval [lo, hi] of B - A (higher is better) and A's mean `base`."""
    lo, hi = diff_ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "undecided"
    band = abs(base) * same_within
    if -band <= lo and hi <= band:
        return "same"
    if lo > 0:
        return "B better"
    if hi < 0:
        return "A better"
    return "undecided"
