"""The throughput-derived commit length of a window (specaudit.audit.estimate), with
its two flags: --baseline-tps (plain decoding tokens/s per request, one number or per
concurrency) and --cost-factor (verify step cost / plain step, one or one per side).
"""
from __future__ import annotations

import math

from specaudit.audit.ab_evidence.window import EvWindow


def parse_per_concurrency(text, what: str):
    """'98' -> 98.0 (every concurrency); '1=98,8=90' -> {1: 98.0, 8: 90.0}."""
    if text is None:
        return None
    if isinstance(text, (int, float, dict)):
        return text
    s = str(text).strip()
    try:
        if "=" not in s:
            v = float(s)
            if not (math.isfinite(v) and v > 0):
                raise ValueError
            return v
        out = {}
        for part in s.split(","):
            c, _, v = part.partition("=")
            out[int(c)] = float(v)
            if not (math.isfinite(out[int(c)]) and out[int(c)] > 0):
                raise ValueError
        return out
    except ValueError:
        raise ValueError(f"{what} {text!r}: give one positive number or CONCURRENCY=VALUE pairs, "
                         "comma-separated (e.g. 1=98,8=90)") from None


def parse_cost_factor(text):
    if text is None:
        return None
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        vals = []
    if len(vals) not in (1, 2) or not all(math.isfinite(v) and v > 0 for v in vals):
        raise ValueError(f"--cost-factor {text!r}: one positive factor for both sides, or two (A,B)")
    return {"A": vals[0], "B": vals[-1]}


def add_throughput_commit(windows: list[EvWindow], baseline, cost) -> int:
    """Fill commit_len_tput where the window's concurrency has a baseline; count them."""
    from specaudit.audit.estimate_model import estimate_commit_length
    n = 0
    for w in windows:
        if w.tokens_per_s is None or w.concurrency is None:
            continue
        base = baseline if isinstance(baseline, float) else baseline.get(int(round(w.concurrency)))
        if base is None:
            continue
        w.commit_len_tput = estimate_commit_length(w.tokens_per_s / w.concurrency, base, cost[w.side]).value
        n += 1
    return n
