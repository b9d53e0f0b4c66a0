"""specaudit/stats: the shared statistics (one home each)."""
from __future__ import annotations

import math

import numpy as np

from specaudit.stats import mean_se, percentile_ci


def test_mean_se():
    m, se, n = mean_se([1.0, 2.0, 3.0, None, math.nan])
    assert (m, n) == (2.0, 3) and math.isclose(se, 1 / math.sqrt(3))   # sd 1, n 3
    assert mean_se([4]) == (4.0, 0.0, 1) and mean_se([])[2] == 0


def test_percentile_ci_ignores_non_finite_replicates():
    reps = np.concatenate([np.arange(1001, dtype=float), [np.nan, np.inf]])
    assert percentile_ci(reps) == [25.0, 975.0]
    lo, hi = percentile_ci([np.nan])
    assert math.isnan(lo) and math.isnan(hi)
