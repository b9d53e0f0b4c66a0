"""SA708-SA710 on counters that move in request-sized jumps (llama-server's /metrics).

A simulated llama-server at concurrency 1: requests of 400 tokens, each with its own
acceptance, a verify step costing the same whatever it accepts; the counters grow by a whole
request when it ends, scraped every 5 s. Window by window the healthy stream breaks SA708
(a window holding one high-acceptance request beside one holding three low ones); judged
over spans, as the readers mark llama.cpp's readings, it is clean. A counter that counts every
drafted token as accepted from minute 2 on is still caught over spans.
"""
from __future__ import annotations

from specaudit.audit.sources import Reading, Window
from specaudit.audit.sources.rules import audit_reading

STEP_S = 0.03    # a verify step: requests of 400 tokens last 2-7 s, a few per 5 s window
ACCEPT = [2.1, 3.7, 5.5, 5.2, 1.8]   # mean accept length per request, cycled (the five live prompts, k=6)


def stream(seconds=240.0, window_s=5.0, fault_from=None, request_end=True) -> Reading:
    """Windows of a simulated llama-server scrape. fault_from: seconds after which the
    accepted-tokens counter adds every drafted token (6 per verify step) as accepted."""
    ends = []   # (end time, tokens, steps, accepted)
    t, i = 0.0, 0
    while t < seconds:
        L = ACCEPT[i % len(ACCEPT)]
        steps = round(400 / L)
        t += steps * STEP_S + 0.02 * (i % 3)        # a little jitter between requests
        acc = 400 - steps
        if fault_from is not None and t >= fault_from:
            acc = 6 * steps
        ends.append((t, 400, steps, acc))
        i += 1
    r = Reading(source="prometheus", engine="llamacpp", path="sim llamacpp")
    if request_end:
        r.config["counters_at"] = "request_end"
    line, a = 0, 0.0
    while a + window_s <= seconds:
        b = a + window_s
        inside = [e for e in ends if a < e[0] <= b]
        a = b
        if not inside:
            continue
        line += 1
        w = Window(line=line, t=b, rank=None, concurrency=1.0)
        w.engine, w.kind = "llamacpp", "interval"
        w.drafts = float(sum(e[2] for e in inside))
        w.accepted_tokens = float(sum(e[3] for e in inside))
        w.draft_tokens = 6.0 * w.drafts
        w.accept_len = 1 + w.accepted_tokens / w.drafts
        w.gen_tps = sum(e[1] for e in inside) / window_s
        w.extra["seconds"] = window_s
        r.windows.append(w)
    return r


def codes(reading):
    return sorted({f.code for f in audit_reading(reading, select=["SA708", "SA709", "SA710"])})


def test_window_by_window_the_healthy_stream_would_break_sa708():
    # the premise: without the request-end mark the per-window comparison fires on health
    assert "SA708" in codes(stream(request_end=False))


def test_healthy_request_end_counters_are_clean_over_spans():
    assert codes(stream()) == []


def test_drafted_counted_as_accepted_is_still_caught_over_spans():
    found = audit_reading(stream(fault_from=120.0), select=["SA708"])
    assert [f.code for f in found] == ["SA708"], [f.message for f in found]
    assert "spans of at least 20 s" in found[0].message


def test_too_short_a_range_judges_nothing_and_the_account_says_why():
    from specaudit.audit.sources.account import Account
    short = stream(seconds=60.0, fault_from=30.0)       # three spans: fewer than MIN_SPANS
    assert codes(short) == []
    acc = Account(short.path, short.source)
    acc.add(short)
    doc = acc.finish([])
    assert any("request ends" in n and "spans of at least 20 s" in n for n in doc["not_checkable"]), doc


def test_the_readers_mark_llamacpp_readings():
    from specaudit.audit.sources.prom_text import parse
    text = ("llamacpp:spec_decode_num_drafts_total 10\nllamacpp:spec_decode_num_draft_tokens_total 60\n"
            "llamacpp:spec_decode_num_accepted_tokens_total 20\n")
    assert parse(text, "m.prom").config["counters_at"] == "request_end"
    from specaudit.audit.sources.prom_http import _readings
    raw = {"drafts": [({"job": "llama", "instance": "i"}, [(0.0, 1.0), (5.0, 9.0)])]}
    assert _readings("http://127.0.0.1:9", "llamacpp", raw, 1.0)[0].config["counters_at"] == "request_end"
    # and no other engine's
    assert "counters_at" not in _readings("http://127.0.0.1:9", "vllm", {"drafts": raw["drafts"]}, 1.0)[0].config
