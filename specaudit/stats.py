"""Small statistics every reader shares: one definition of a mean and its standard error."""
from __future__ import annotations

import math

Z95 = 1.959963984540054   # the two-sided 95% quantile of the standard normal (every 95% interval here)


def mean_se(samples) -> tuple[float, float, int]:
    """(mean, standard error of the mean, n) over the finite samples; se is 0 for one
    sample, and (nan, nan, 0) for none. Sample standard deviation (n - 1) / sqrt(n)."""
    xs = [float(x) for x in samples if x is not None and math.isfinite(float(x))]
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0
    m = math.fsum(xs) / n
    if n == 1:
        return m, 0.0, 1
    var = math.fsum((x - m) ** 2 for x in xs) / (n - 1)
    return m, math.sqrt(var / n), n


def percentile_ci(reps) -> list[float]:
    """[2.5th, 97.5th] percentile of the finite bootstrap replicates: the 95% interval the
    A/B comparisons print; [nan, nan] when none is finite."""
    import numpy as np
    reps = np.asarray(reps, dtype=float)
    reps = reps[np.isfinite(reps)]
    if reps.size == 0:
        return [float("nan"), float("nan")]
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return [float(lo), float(hi)]
