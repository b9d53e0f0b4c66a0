"""Shared helpers of the SA7xx rules (engine logs and Prometheus text; no rules here).

Every SA7xx rule has scope "source": check(reading) receives a specaudit.audit.sources.Reading
(windows of what an engine reported, one per log line or scrape interval) and returns
Findings that point at the file and line.
"""
from __future__ import annotations

from specaudit.numfmt import count  # noqa: F401  (the SA7xx rules import it from here)
from specaudit.numfmt import fixed as fmt  # noqa: F401  (figures shown to the decimals engines print)

# Printed precision of the engines' figures: a check tolerates half a unit of the last
# printed digit of every figure it combines.
LEN_TOL = 0.005       # accept len / mean acceptance length: two decimals
RATE_TOL = 0.005      # SGLang accept rate: two decimals
POS_TOL = 0.0005      # vLLM per-position rate: three decimals
PCT_TOL = 0.05        # vLLM "Avg Draft acceptance rate": one decimal, in percent


def pos_tol(w) -> float:
    """Half a unit of the last printed digit of a window's per-position rates: POS_TOL
    (three decimals, vLLM's log), or the reader's own (`extra["pos_tol"]`: vLLM's
    spec_decode.py example prints two decimals)."""
    return w.extra.get("pos_tol", POS_TOL)


def where(w) -> str:
    """'(DP1 TP0, 10-02 14:03:11)' context for a message, or ''."""
    parts = [p for p in (w.rank, w.time) if p]
    return f" ({', '.join(parts)})" if parts else ""


def median(xs):
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return None
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def usable(w) -> bool:
    """A window that is not a counter reset (restarts are reported by SA700)."""
    return not w.extra.get("counter_reset")
