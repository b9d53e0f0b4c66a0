"""Intervals for a side's mean over windows, fit for how many windows there are.

Two methods, chosen per sample of windows and named in the output:

    t          fewer than BLOCK_MIN_WINDOWS windows: their lag-1 correlation cannot be
               estimated (its standard error is about 1/sqrt(n): from 4 windows it can
               come out almost anywhere), so the mean's interval is Student's t with
               n - 1 degrees of freedom over the windows' own spread. Replicates are
               drawn from that t (mean + se * T_{n-1}), so differences and weighted
               pools of strata combine as the bootstrap ones do (B - A: about Welch).
    block      BLOCK_MIN_WINDOWS or more: the moving-block bootstrap of
               specaudit.audit.ab_evidence (blocks at least the AR(1) correlation time
               long, never narrower than the t interval of the effective sample size).

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
