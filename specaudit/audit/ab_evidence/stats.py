"""The statistics of A/B evidence: intervals for a side's mean over windows, fit for how
many windows there are and named in the output, and the permutation test.

Two interval methods, chosen per sample of windows (method_for) and named in the output;
mean_replicates draws [n_boot] replicates of the mean by the method:

    t          fewer than BLOCK_MIN_WINDOWS windows: their lag-1 correlation cannot be
               estimated (its standard error is about 1/sqrt(n): from 4 windows it can
               come out almost anywhere), so the mean's interval is Student's t with
               n - 1 degrees of freedom over the windows' own spread. Replicates are
               drawn from that t (mean + se * T_{n-1}), so differences and weighted
               pools of strata combine as the bootstrap ones do (B - A: about Welch).
    block      BLOCK_MIN_WINDOWS or more: the moving-block bootstrap (blocks at least the
               AR(1) correlation time long, never narrower than the t interval of the
               effective sample size; above BOOT_EXACT_MAX windows its normal limit).

Beside the interval, `permutation_p` is the two-sided permutation test of the
difference of means over windows (exact when the relabellings are few enough to list,
else PERM_DRAWS random ones): with 4 A windows each above each of 8 B windows, no
other relabelling than its mirror can be as extreme, p <= 2 / C(12, 4) = 0.004.

`more_windows` says how many more windows per side would turn an "undecided" into a
verdict at the current spread: the interval narrows as 1 / sqrt(n).
"""
from __future__ import annotations

import math
from itertools import combinations

import numpy as np

BLOCK_MIN_WINDOWS = 20     # below: t with n - 1 df (autocorrelation not estimable)
PERM_EXACT_MAX = 20000     # relabellings listed exactly up to this many
PERM_DRAWS = 5000
METHOD_T = "t"
METHOD_BLOCK = "block"
METHOD_TEXT = {METHOD_T: "t interval, n-1 df (too few windows to estimate their autocorrelation)",
               METHOD_BLOCK: "moving-block bootstrap over neighbouring windows"}
BOOT_EXACT_MAX = 5000       # more windows than this: the bootstrap mean is drawn from its normal limit
Z95 = 1.959963984540054


def method_for(n: int) -> str:
    """The interval method for a sample of n windows."""
    return METHOD_T if n < BLOCK_MIN_WINDOWS else METHOD_BLOCK


def t_reps(rng, x: np.ndarray, n_boot: int) -> np.ndarray:
    """[n_boot] replicates of the mean of windows x [n] from its t distribution with
    n - 1 df (x's sample sd / sqrt(n)); constant when n < 2 or x has no spread."""
    n = len(x)
    m = float(x.mean())
    if n < 2:
        return np.full(n_boot, m)
    se = float(x.std(ddof=1)) / math.sqrt(n)
    return m + se * rng.standard_t(n - 1, size=n_boot)


def mean_replicates(rng, x: np.ndarray, n_boot: int) -> np.ndarray:
    """[n_boot] replicates of the mean of windows x [n] (in time order).

    Fewer than BLOCK_MIN_WINDOWS: drawn from the t distribution with n - 1 df
    (their correlation cannot be estimated from so few).
    Otherwise moving-block bootstrap resamples:
    Up to BOOT_EXACT_MAX windows the resamples are drawn (blocks of block_len(n)
    neighbouring windows, [n_boot, n] indices); above, the resampled mean is drawn from
    its normal limit N(mean, sd' / sqrt(n)), sd' widened for neighbour correlation (the
    central limit theorem is exact enough there, and a 1 GB log's million windows would
    need n_boot x 10^6 draws)."""
    n = len(x)
    if method_for(n) == METHOD_T:
        return t_reps(rng, x, n_boot)        # too few windows to see their correlation
    if n > BOOT_EXACT_MAX:
        return rng.normal(x.mean(), _block_sd(x) / math.sqrt(n), size=n_boot)
    r = _lag1(x)
    L = block_len(n, r)
    nb = -(-n // L)                                                   # blocks per resample
    starts = rng.integers(0, n - L + 1, size=(n_boot, nb))            # [n_boot, nb]
    idx = (starts[:, :, None] + np.arange(L)[None, None, :]).reshape(n_boot, nb * L)[:, :n]
    reps = x[idx].mean(axis=1)                                        # [n_boot]
    # few blocks under-cover: never narrower than the effective-sample-size t interval
    n_eff = max(n * (1 - r) / (1 + r), 2.0)
    want = _t975(n_eff - 1) * _block_sd(x) / math.sqrt(n)             # half-width it must reach
    have = Z95 * float(reps.std())
    if have > 0 and want > have:
        reps = x.mean() + (reps - reps.mean()) * (want / have)
    return reps


def _t975(df: float) -> float:
    """Student's t 97.5% quantile (Cornish-Fisher expansion in 1/df; df >= 1), no scipy."""
    z = Z95
    df = max(float(df), 1.0)
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def block_len(n: int, r: float = 0.0) -> int:
    """Moving-block length for n windows in time order: n^(1/3), or the windows' AR(1)
    correlation time (1 + r) / (1 - r) when longer (r: lag-1 correlation), at most n / 2.
    Neighbouring log windows share their load (a burst spans several): resampling single
    windows would read correlated windows as independent evidence and narrow the interval."""
    tau = (1 + r) / (1 - r)
    return int(max(1, min(max(round(n ** (1 / 3)), round(tau)), n // 2)))


def _lag1(x: np.ndarray) -> float:
    """Lag-1 correlation of neighbouring windows, clipped to [0, 0.95] (0 when undefined)."""
    if len(x) < 3 or float(x.std()) == 0:
        return 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        r = float(np.corrcoef(x[:-1], x[1:])[0, 1])
    return min(max(r if math.isfinite(r) else 0.0, 0.0), 0.95)


def _block_sd(x: np.ndarray) -> float:
    """Standard deviation for the mean's normal limit, inflated for neighbour correlation
    (the AR(1) factor sqrt((1 + r) / (1 - r)))."""
    r = _lag1(x)
    return float(x.std()) * math.sqrt((1 + r) / (1 - r))


def permutation_p(xa: np.ndarray, xb: np.ndarray, rng=None) -> float | None:
    """Two-sided permutation p-value of mean(B) - mean(A) over the windows (None when a
    side is empty). Exact enumeration up to PERM_EXACT_MAX relabellings."""
    na, nb = len(xa), len(xb)
    if na == 0 or nb == 0:
        return None
    allx = np.concatenate([xa, xb])
    tot = float(allx.sum())
    obs = abs(float(xb.mean()) - float(xa.mean()))
    eps = 1e-12 * max(1.0, abs(obs))
    if math.comb(na + nb, na) <= PERM_EXACT_MAX:
        idx = np.array(list(combinations(range(na + nb), na)), dtype=np.int64)   # [C, na]
        sa = allx[idx].sum(axis=1)                                                # [C]
        d = np.abs((tot - sa) / nb - sa / na)
        return float(np.mean(d >= obs - eps))
    rng = rng if rng is not None else np.random.default_rng(0)
    hits = 1
    for _ in range(PERM_DRAWS):
        p = rng.permutation(allx)
        hits += abs(float(p[na:].mean()) - float(p[:na].mean())) >= obs - eps
    return hits / (PERM_DRAWS + 1)


def more_windows(na: int, nb: int, diff_ci, diff_mean: float, base: float, same_within: float) -> int | None:
    """About how many more windows per side would decide an undecided comparison at the
    current spread: the half-width h shrinks as sqrt(n / n'); a verdict needs h' < |d|
    (a winner) or |d| + h' <= same_within * |A| (the same). None when no number of
    windows would (the gap is zero and no same-band is set)."""
    lo, hi = diff_ci
    h = (hi - lo) / 2
    d = abs(diff_mean)
    target = max(d, same_within * abs(base) - d)
    if h <= 0 or target <= 0:
        return None
    n = min(na, nb)
    need = math.ceil(n * (h / target) ** 2 * 1.1)     # 10% margin: the spread is itself estimated
    return max(need - n, 1)
