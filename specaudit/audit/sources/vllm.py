"""vLLM server log: the `SpecDecoding metrics:` lines and the engine stats beside them.

Every `--log-stats` interval (10 s) vLLM (V1) logs, per engine:

    INFO 08-04 20:51:08 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s,
        Avg generation throughput: 131.2 tokens/s, Running: 4 reqs, Waiting: 0 reqs, ...
    INFO 08-04 20:51:08 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 2.73,
        Accepted throughput: 61.90 tokens/s, Drafted throughput: 113.40 tokens/s,
        Accepted: 619 tokens, Drafted: 1134 tokens, Per-position acceptance rate: 0.802,
        0.551, 0.415, Avg Draft acceptance rate: 54.6%

(older V1 versions omit the throughput fields; some prefix `(APIServer pid=N)`). Over the
interval, with `drafts` the number of verify steps (never printed):
    Mean acceptance length = 1 + Accepted / drafts        (two decimals; bonus included)
    Per-position rate i    = drafts accepting position i / drafts   (three decimals)
    so  1 + sum(per-position rates) = Mean acceptance length, and
    Avg Draft acceptance rate = 100 * Accepted / Drafted  (one decimal)
The reader recovers drafts = Accepted / (Mean acceptance length - 1).

The V0 engine's `Speculative metrics: Draft acceptance rate: 0.642, System efficiency:
0.598, Number of speculative tokens: 3, Number of accepted tokens: 8547, Number of draft
tokens: 13311, Number of emitted tokens: 10616.` lines are cumulative; drafts = draft
tokens / k and emitted tokens = accepted prefixes + one bonus per draft, so the mean
acceptance length is emitted / drafts (V0's "accepted" also counts drafts accepted after
a rejected one: a rate numerator only).
"""
from __future__ import annotations

import re

from specaudit.audit.sources import Reading, Window

NUM = r"(-?(?:\d+(?:\.\d*)?|\.\d+)|nan|inf)"
SPEC_RE = re.compile(r"SpecDecoding metrics:\s*(?P<body>.*)$")
V0_RE = re.compile(r"Speculative metrics:\s*(?P<body>.*)$")
ENGINE_RE = re.compile(r"(?:Engine (?P<eng>\d+):\s*)?Avg prompt throughput: [^,]*, Avg generation throughput: "
                       + NUM + r" tokens/s, Running: (?P<run>\d+) reqs")
TS_RE = re.compile(r"\b(?:INFO|WARNING|DEBUG|ERROR)\s+(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)")
F = {
    "mean": re.compile(r"Mean acceptance length: " + NUM),
    "accepted": re.compile(r"(?:^|,\s*)Accepted: " + NUM + r" tokens(?!/)"),
    "drafted": re.compile(r"(?:^|,\s*)Drafted: " + NUM + r" tokens(?!/)"),
    "rate_pct": re.compile(r"Avg Draft acceptance rate: " + NUM + "%"),
    "rate_frac": re.compile(r"(?<!Avg )Draft acceptance rate: " + NUM + r"(?!%)"),
}
PER_POS_RE = re.compile(r"Per-position acceptance rate: (?P<list>[-0-9.naif, ]+)")
V0 = {
    "rate": re.compile(r"Draft acceptance rate: " + NUM),
    "k": re.compile(r"Number of speculative tokens: " + NUM),
    "accepted": re.compile(r"Number of accepted tokens: " + NUM),
    "drafted": re.compile(r"Number of draft tokens: " + NUM),
    "emitted": re.compile(r"Number of emitted tokens: " + NUM),
}


def looks_like(text: str) -> bool:
    return "SpecDecoding metrics:" in text or "Speculative metrics: Draft acceptance rate" in text


def _num(rx, body):
    m = rx.search(body)
    return float(m.group(1)) if m else None


def _per_pos(body: str):
    m = PER_POS_RE.search(body)
    if not m:
        return None
    out = []
    for tok in m.group("list").split(","):
        tok = tok.strip()
        if not tok:
            continue
        try:
            out.append(float(tok))
        except ValueError:
            break
    return out


def parse(text: str, path: str) -> Reading:
    from specaudit.audit.sources import note
    reading = Reading(source="vllm-log", engine="vllm", path=path)
    last_engine: dict[str, tuple] = {}  # engine -> (gen tps, running, line)
    current = None
    for i, raw in enumerate(text.splitlines(), 1):
        em = ENGINE_RE.search(raw)
        if em:
            eng = em.group("eng")
            current = str(int(eng)) if eng is not None else None
            last_engine[current] = (float(em.group(2)), float(em.group("run")), i)
            continue
        sm = SPEC_RE.search(raw)
        vm = V0_RE.search(raw) if not sm else None
        if not sm and not vm:
            continue
        tm = TS_RE.search(raw)
        w = Window(line=i, time=tm.group("ts") if tm else None, text=raw.strip())
        if sm:
            body = sm.group("body")
            w.accept_len = _num(F["mean"], body)
            w.accepted_tokens = _num(F["accepted"], body)
            w.draft_tokens = _num(F["drafted"], body)
            w.printed_rate_pct = _num(F["rate_pct"], body)
            frac = _num(F["rate_frac"], body)
            w.per_pos = _per_pos(body)
            if w.printed_rate_pct is not None:
                w.accept_rate = w.printed_rate_pct / 100.0
            elif frac is not None:
                w.accept_rate = frac
            if w.accept_len is None or w.accepted_tokens is None or w.draft_tokens is None:
                missing = [n for n, v in (("Mean acceptance length", w.accept_len), ("Accepted", w.accepted_tokens),
                                          ("Drafted", w.draft_tokens)) if v is None]
                reading.notes.append(note(path, i, f"truncated vLLM SpecDecoding line (missing {', '.join(missing)})",
                                          raw))
                continue
            if w.per_pos:
                reading.config["num_spec_tokens"] = max(reading.config.get("num_spec_tokens", 0), len(w.per_pos))
            # drafts = Accepted / (mean - 1); only when that is well defined
            if w.accept_len is not None and w.accept_len > 1.005 and w.accepted_tokens and w.accepted_tokens > 0:
                w.drafts = round(w.accepted_tokens / (w.accept_len - 1))
        else:
            body = vm.group("body")
            k = _num(V0["k"], body)
            w.accepted_tokens = _num(V0["accepted"], body)
            w.draft_tokens = _num(V0["drafted"], body)
            emitted = _num(V0["emitted"], body)
            w.accept_rate = _num(V0["rate"], body)
            if None in (k, w.accepted_tokens, w.draft_tokens, emitted):
                reading.notes.append(note(path, i, "truncated vLLM Speculative metrics line", raw))
                continue
            reading.config["num_spec_tokens"] = int(k)
            # V0 drafts k tokens per proposal; emitted = the accepted prefix + the bonus per
            # proposal. Its "accepted" also counts drafts accepted after a rejected one, so
            # it is a rate numerator, not the prefix length.
            w.drafts = w.draft_tokens / k if k > 0 else None
            w.accept_len = emitted / w.drafts if w.drafts else None
            reading.config["cumulative"] = True
        # pair with the engine stats logged just before (same engine, a few lines up)
        if current in last_engine and i - last_engine[current][2] <= 5:
            w.gen_tps, w.concurrency, _ = last_engine[current]
        w.rank = f"engine {current}" if current is not None else None
        reading.windows.append(w)
    if len({w.rank for w in reading.windows}) <= 1:
        for w in reading.windows:  # one engine: no rank to name
            w.rank = None
    return reading
