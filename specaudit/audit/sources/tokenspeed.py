"""TokenSpeed scheduler log: its `Decode batch.` lines with speculative figures.

Every `decode_log_interval` decode steps the rank-0 scheduler logs one line; with a
drafter (spec_num_steps > 0) it reads:

    Decode batch. #running-req: 8, #pages(active/cached/total): 412/96/8192, page ratio:
        0.05, gen throughput (token/s): 812.45, avg_accept_len: 3.21, accept_rate: 0.74,
        #queue-req: 0

(newer versions add `#dp-rank: d, #pp-rank: p,` after `Decode batch.` and a `#req-state(...)`
field at the end). Over the interval: avg_accept_len = generated tokens / decode steps
(the bonus counted), accept_rate = (avg_accept_len - 1) / spec_num_steps, both with two
decimals. The draft length is not on the line: the reader infers the whole k that every
line's pair of figures fits (SA732 fires when none fits: TokenSpeed PR 1443 counted one
extra draft slot per verify step).
"""
from __future__ import annotations

import re

from specaudit.audit.sources.reading import LineParser, Reading, Window

HEAD_RE = re.compile(r"Decode batch\.\s*(?P<body>.*)$")
TS_RE = re.compile(r"(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)")
NUM = r"-?(?:\d+(?:\.\d*)?|\.\d+)"
FIELDS = {
    "#running-req": ("concurrency", float),
    "gen throughput (token/s)": ("gen_tps", float),
    "avg_accept_len": ("accept_len", float),
    "accept_rate": ("accept_rate", float),
}
REQUIRED = ("avg_accept_len", "accept_rate", "#running-req")
RATE_CONV = "(avg_accept_len - 1) / spec_num_steps (drafts only), two decimals"
LEN_CONV = "generated tokens / decode steps over the interval: counts the bonus token"

MARKERS = (b"avg_accept_len",)


def looks_like_line(line: str) -> bool:
    return "Decode batch." in line and "avg_accept_len:" in line


class Parser(LineParser):
    source = "tokenspeed-log"
    engine = "tokenspeed"

    def feed(self, i: int, raw: str) -> None:
        if "avg_accept_len" not in raw:
            return
        m = HEAD_RE.search(raw)
        if not m:
            return
        w = Window(line=i, text=raw.strip()[:300], engine="tokenspeed", kind="interval",
                   version="Decode batch. with avg_accept_len / accept_rate",
                   conventions={"accept_rate": RATE_CONV, "accept_len": LEN_CONV})
        tm = TS_RE.search(raw[: m.start()])
        w.time = tm.group("ts") if tm else None
        seen, dp = set(), None
        for part in m.group("body").split(", "):
            key, sep, val = part.partition(": ")
            key, val = key.strip(), val.strip().rstrip(",")
            if key == "#dp-rank":
                dp = val
                w.version = "Decode batch. with #dp-rank / #pp-rank"
                continue
            if not sep or key not in FIELDS:
                continue
            if not re.fullmatch(NUM, val):
                self.skip(i, f"truncated TokenSpeed decode line (unreadable {key!r}: {val[:20]!r})", raw)
                return
            attr, conv = FIELDS[key]
            setattr(w, attr, conv(val))
            seen.add(key)
        missing = [k for k in REQUIRED if k not in seen]
        if missing:
            self.skip(i, f"truncated TokenSpeed decode line (missing {', '.join(missing)})", raw)
            return
        w.rank = f"DP{dp}" if dp is not None else None
        self.reading.windows.append(w)

    def finalize(self, reading) -> None:
        ranks = {w.rank for w in reading.windows}
        if len(ranks) <= 1:
            for w in reading.windows:
                w.rank = None
        k = whole_k(reading.windows)
        if k:
            reading.config["num_spec_tokens"] = k
            for w in reading.windows:
                w.k = k
        reading.version = next((w.version for w in reading.windows if w.version), None)

    def finish(self) -> Reading:
        return super().finish()


def fits(w, k: int) -> bool:
    """accept_rate = (avg_accept_len - 1) / k within two printed decimals of each."""
    return abs((w.accept_len - 1) / k - w.accept_rate) <= 0.005 + 0.005 / k + 1e-9


def whole_k(windows, kmax: int = 64) -> int | None:
    """The smallest whole k that every informative window fits (a rate above 0.05 tells
    k apart), or None when none fits or no window tells."""
    ws = [w for w in windows if w.accept_rate is not None and w.accept_len is not None and w.accept_rate > 0.05]
    if not ws:
        return None
    return next((k for k in range(1, kmax + 1) if all(fits(w, k) for w in ws)), None)
