"""Spans of windows for counters that move in request-sized jumps (llama.cpp's server).

llama-server adds a request's generated tokens, verify steps, drafted and accepted tokens
to /metrics only when the request ends. A scrape window of a few seconds therefore holds a
whole number of requests, each with its own acceptance, and its throughput counts the
requests that happened to end inside it: two healthy windows differ in tokens per step and
in tokens/s by whole requests, not by a counter fault. The throughput rules (SA708-SA710)
judge such a reading over consecutive spans of at least SPAN_S seconds, each holding many
requests, never window by window.
"""
from __future__ import annotations

from dataclasses import replace

SPAN_S = 20.0    # seconds of windows merged into one span (many requests of a few hundred tokens)
MIN_SPANS = 4    # = the estimator's MIN_WINDOWS: spans of one group before a split is judged


def at_request_end(reading) -> bool:
    """True when the reading's counters move only when a request ends."""
    return (reading.config or {}).get("counters_at") == "request_end"


def _merge(ws):
    """Windows of one rank, consecutive, as one: counters summed, throughput and concurrency
    weighted by each window's seconds (a window without seconds counts 1)."""
    secs = [w.extra.get("seconds") or 1.0 for w in ws]
    total = sum(secs)
    first, last = ws[0], ws[-1]
    # a copy of the first window (no import of the sources package: it imports this module)
    m = replace(first, time=last.time, t=last.t, concurrency=None, accept_len=None, accept_rate=None,
                per_pos=None, per_pos_counts=None, gen_tps=None, printed_rate_pct=None, histogram=None,
                per_pos_drafted=None, extra={}, conventions={})

    def add(attr):
        vals = [getattr(w, attr) for w in ws]
        return None if any(v is None for v in vals) else sum(vals)

    m.drafts, m.draft_tokens, m.accepted_tokens = add("drafts"), add("draft_tokens"), add("accepted_tokens")
    if m.drafts and m.accepted_tokens is not None:
        m.accept_len = 1 + m.accepted_tokens / m.drafts
    if all(w.gen_tps is not None for w in ws):
        m.gen_tps = sum(w.gen_tps * s for w, s in zip(ws, secs)) / total
    if all(w.concurrency is not None for w in ws):
        m.concurrency = sum(w.concurrency * s for w, s in zip(ws, secs)) / total
    m.extra = {"seconds": total, "windows": len(ws), "lines": (first.line, last.line)}
    m.text = f"{len(ws)} windows, {total:.0f} s"
    return m


def spans(windows, span_s: float = SPAN_S) -> list:
    """Consecutive usable windows of each rank merged until a span covers span_s seconds;
    a last span shorter than that is left out (it holds too few requests to judge)."""
    by_rank: dict = {}
    for w in windows:
        if not w.extra.get("counter_reset"):
            by_rank.setdefault(w.rank, []).append(w)
    out = []
    for ws in by_rank.values():
        cur: list = []
        for w in ws:
            cur.append(w)
            if sum(x.extra.get("seconds") or 0.0 for x in cur) >= span_s:
                out.append(_merge(cur))
                cur = []
    return out


def judged_windows(reading) -> list:
    """The windows the throughput rules compare: the reading's own, or its spans."""
    return spans(reading.windows) if at_request_end(reading) else reading.windows
