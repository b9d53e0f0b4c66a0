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

import math
import re

from specaudit.audit.sources.reading import LineParser, Reading, Window
from specaudit.audit.sources.vllm_startup import startup

NUM = r"(-?(?:\d+(?:\.\d*)?|\.\d+)|nan|inf)"
SPEC_RE = re.compile(r"SpecDecoding metrics:\s*(?P<body>.*)$")
V0_RE = re.compile(r"Speculative metrics:\s*(?P<body>.*)$")
ENGINE_RE = re.compile(r"(?:Engine (?P<eng>\d+):\s*|(?P<agg>\d+) Engines Aggregated:\s*)?Avg prompt throughput: [^,]*, "
                       r"Avg generation throughput: " + NUM + r" tokens/s, Running: (?P<run>\d+) reqs"
                       r"(?:, Waiting: (?P<wait>\d+) reqs)?(?:, Deferred: (?P<defer>\d+) reqs)?")
TS_RE = re.compile(r"\b(?:INFO|WARNING|DEBUG|ERROR)\s+(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)")
F = {
    "mean": re.compile(r"Mean acceptance length: " + NUM),
    "accepted": re.compile(r"(?:^|,\s*)Accepted: " + NUM + r" tokens(?!/)"),
    "drafted": re.compile(r"(?:^|,\s*)Drafted: " + NUM + r" tokens(?!/)"),
    "rate_pct": re.compile(r"Avg Draft acceptance rate: " + NUM + "%"),
    "rate_first_pct": re.compile(r"(?<!Avg )Draft acceptance rate: " + NUM + "%"),
    "rate_frac": re.compile(r"(?<!Avg )Draft acceptance rate: (-?\d+\.\d+|-?\d+|nan|inf)(?![\d.%])"),
    "depth": re.compile(r"Current speculative depth: " + NUM),
}
V0 = {
    "rate": re.compile(r"Draft acceptance rate: " + NUM),
    "k": re.compile(r"Number of speculative tokens: " + NUM),
    "accepted": re.compile(r"Number of accepted tokens: " + NUM),
    "drafted": re.compile(r"Number of draft tokens: " + NUM),
    "emitted": re.compile(r"Number of emitted tokens: " + NUM),
}


V1_LEN = ("1 + accepted drafts / drafts (verify steps): counts the bonus token (vLLM >= PR 17908, May 2025; "
          "before it the same figure left the bonus out)")
V1_RATE = "Accepted / Drafted (draft tokens only), printed in percent with one decimal"
V1_POS = "accepted at position i / drafts (verify steps): unconditional, non-increasing in i at a fixed k"
V0_RATE = ("V0: accepted / draft tokens, where V0's 'accepted' also counts drafts accepted after a rejected one "
           "(a rate numerator, not the accepted prefix)")
V0_LEN = "V0: emitted tokens / (draft tokens / k) (accepted prefix + bonus per proposal)"


# substrings every line this reader uses holds (Lines' prefilter: other lines are never decoded)
MARKERS = (b"metrics:", b"Avg prompt throughput", b"non-default args:", b"Initializing a V1 LLM engine")
# the start-up lines that name the models (seeded into every range of a large log)
CONFIG_MARKERS = (b"non-default args:", b"Initializing a V1 LLM engine")


def looks_like_line(line: str) -> bool:
    """A spec-decoding line, the engine stats line every vLLM server logs, or its engine's
    start-up line (a log with speculative decoding off, or one that ends before its first
    stats line, is still vLLM's: judged on what it holds)."""
    return ("SpecDecoding metrics:" in line or "Speculative metrics: Draft acceptance rate" in line
            or ("Avg prompt throughput:" in line and "Avg generation throughput:" in line)
            or "Initializing a V1 LLM engine (v" in line)


def looks_like(text: str) -> bool:
    return any(looks_like_line(ln) for ln in text.splitlines())


def _num(rx, body):
    m = rx.search(body)
    return float(m.group(1)) if m else None


_KEYS = {"Mean acceptance length", "Current speculative depth", "Accepted", "Drafted", "Avg Draft acceptance rate",
         "Draft acceptance rate", "Accepted throughput", "Drafted throughput"}


class _Cut(ValueError):
    """A SpecDecoding body that ends inside a value: the line was cut (copied mid-write)."""


# what vLLM prints after a count (a value without it was cut), and the decimals of the
# figures that can end a line: a last value printed with fewer was cut mid-number
_UNIT = {"Accepted": " tokens", "Drafted": " tokens", "Accepted throughput": " tokens/s",
         "Drafted throughput": " tokens/s"}
_DECIMALS = {"Mean acceptance length": 2, "per_pos": 3}


def _decimals(tok: str) -> int:
    return len(tok) - tok.index(".") - 1 if "." in tok else 0


def _fields(body: str):
    """{key: number} and the per-position list of a SpecDecoding body, in one pass over its
    ', '-separated parts (a percentage is stored under key + '%'). ValueError on a number
    that does not parse; _Cut when the body ends inside a value (the rate-first variants
    end with a number, so a cut line would otherwise read as a smaller count)."""
    kv: dict = {}
    per_pos = None
    in_pos = False
    parts = body.rstrip().split(", ")
    last = len(parts) - 1
    for n, part in enumerate(parts):
        key, sep, val = part.partition(": ")
        if sep:
            key = key.strip()
            in_pos = key == "Per-position acceptance rate"
            if in_pos:
                tok = val.strip()
                if n == last and tok and _decimals(tok) < _DECIMALS["per_pos"]:
                    raise _Cut(part)
                per_pos = [float(tok)] if tok else []
                continue
            if key not in _KEYS:
                continue
            val = val.strip().rstrip(",")
            unit = _UNIT.get(key)
            if unit is not None and not val.endswith(unit):
                raise _Cut(part)
            if val.endswith("%"):
                kv[key + "%"] = float(val[:-1])
            else:
                if n == last and unit is None and ("rate" in key or _decimals(val) < _DECIMALS.get(key, 0)):
                    raise _Cut(part)  # a rate without its % sign, a mean with one decimal
                kv[key] = float(val.split(" ", 1)[0])
        elif in_pos and part.strip():
            tok = part.strip().rstrip(",")
            if n == last and _decimals(tok) < _DECIMALS["per_pos"]:
                raise _Cut(part)
            try:
                per_pos.append(float(tok))
            except ValueError:
                in_pos = False
    return kv, per_pos


def _all_finite(kv: dict, per_pos) -> bool:
    """Every value of a parsed body is a finite number: two C-level sums (nan and inf
    propagate; a sum that overflows only sends the line to the exact check)."""
    return math.isfinite(sum(kv.values())) and (not per_pos or math.isfinite(sum(per_pos)))


def _finite(*xs) -> bool:
    return all(x is None or (x == x and abs(x) != float("inf")) for x in xs)


class Parser(LineParser):
    source = "vllm-log"
    engine = "vllm"

    def __init__(self, path: str):
        super().__init__(path)
        self.last_engine: dict = {}  # engine -> (gen tps, running, line)
        self.current = None
        self.engines: set = set()
        self.queue: dict = {}        # engine -> {"waiting": n, "deferred": n} of its last stats line
        self.stats_lines = 0         # engine stats lines seen (logged every interval while requests run)

    @property
    def recognised(self) -> str | None:
        """A log of start-up lines without one stats line (stream.NoFigures: reported with its
        account, exit 0), None otherwise; why_empty says why it holds no figures."""
        cfg = self.reading.config
        if self.stats_lines or "startup_line" not in cfg:
            return None
        ver = f" {cfg['engine_version']}" if cfg.get("engine_version") else ""
        return f"vLLM{ver} server log (start-up lines only)"

    @property
    def why_empty(self) -> str | None:
        cfg = self.reading.config
        if cfg.get("spec_off"):
            return "speculative decoding off: the engine's start-up line has speculative_config=None"
        if self.recognised is None:
            return None
        spec = (f"speculative decoding configured ({cfg['spec_method']}, k = {cfg['num_spec_tokens']}), but "
                if cfg.get("spec_method") and cfg.get("num_spec_tokens") else "")
        return (f"{spec}no stats line: no request ran while it logged, the log ends before the first stats "
                "interval (VLLM_LOG_STATS_INTERVAL, 10 s by default), or the server ran with --disable-log-stats")

    def feed(self, i: int, raw: str) -> None:
        if "metrics:" not in raw and "Avg prompt throughput" not in raw:
            if "non-default args:" in raw or "Initializing a V1 LLM engine" in raw:
                self.reading.config.update(startup(raw, i))
            return  # most lines of a server log: nothing for this reader (fast path)
        em = ENGINE_RE.search(raw) if "Avg prompt throughput" in raw else None
        if em:
            self.stats_lines += 1
            eng, agg = em.group("eng"), em.group("agg")
            # data parallel: per-engine lines (`Engine 00N:`) or one line for all engines
            # (`N Engines Aggregated:`, its SpecDecoding line summed over them)
            self.current = str(int(eng)) if eng is not None else (f"agg{int(agg)}" if agg is not None else None)
            try:
                self.last_engine[self.current] = (float(em.group(3)), float(em.group("run")), i)   # 3: NUM
            except ValueError:
                pass
            self.queue[self.current] = {k: int(em.group(g)) for k, g in (("waiting", "wait"), ("deferred", "defer"))
                                        if em.group(g) is not None}
            return
        sm = SPEC_RE.search(raw)
        vm = V0_RE.search(raw) if not sm else None
        if not sm and not vm:
            return
        tm = TS_RE.search(raw, 0, 120)  # the timestamp is near the start
        w = Window(line=i, time=tm.group("ts") if tm else None, text=raw.strip()[:300], engine="vllm")
        if sm:
            body = sm.group("body")
            try:
                if i == self.unterminated and not body.rstrip().endswith("%"):
                    # the last line, without its newline, of a variant that ends with a list
                    # (rate first): nothing tells a cut between two rates from the end
                    raise _Cut(body[-40:])
                kv, per_pos = _fields(body)
            except _Cut:
                self.skip(i, "truncated vLLM SpecDecoding line (it ends inside a value)", raw)
                return
            except ValueError:
                self.skip(i, "vLLM SpecDecoding line with a value that is not a number", raw)
                return
            w.accept_len = kv.get("Mean acceptance length")
            w.accepted_tokens = kv.get("Accepted")
            w.draft_tokens = kv.get("Drafted")
            w.printed_rate_pct = kv.get("Avg Draft acceptance rate%")
            first_pct = kv.get("Draft acceptance rate%") if w.printed_rate_pct is None else None
            frac = kv.get("Draft acceptance rate") if w.printed_rate_pct is None and first_pct is None else None
            depth = kv.get("Current speculative depth")
            for key, name in (("Accepted throughput", "acc_tps"), ("Drafted throughput", "dr_tps")):
                if key in kv:
                    w.extra[name] = kv[key]
            w.per_pos = per_pos
            if not _all_finite(kv, per_pos) and not _finite(w.accept_len, w.accepted_tokens, w.draft_tokens,
                                                            w.printed_rate_pct, first_pct, frac, *(w.per_pos or [])):
                self.skip(i, "vLLM SpecDecoding line with a value that is not a finite number", raw)
                return
            if w.printed_rate_pct is None and first_pct is None and frac is None:
                # every V1 variant prints the acceptance rate; without it the line was cut
                self.skip(i, "truncated vLLM SpecDecoding line (no acceptance rate at its end)", raw)
                return
            if first_pct is not None:
                # the rate first, in percent: early V1 (April 2025, PR 15902) with counts only,
                # later (Aug-Sep 2025: PRs 24049, 24127) with the mean and per-position rates
                w.printed_rate_pct = first_pct
                w.version = ("V1 rate first, with mean acceptance length (2025)"
                             if w.accept_len is not None else "V1 early (rate first, PR 15902)")
            if w.printed_rate_pct is not None:
                w.accept_rate = w.printed_rate_pct / 100.0
            elif frac is not None:
                w.accept_rate = frac
                w.version = "V1 early (rate as a fraction)"
            if w.accepted_tokens is None or w.draft_tokens is None:
                missing = [n for n, v in (("Accepted", w.accepted_tokens), ("Drafted", w.draft_tokens)) if v is None]
                if w.accept_len is None or w.printed_rate_pct is None:
                    self.skip(i, f"truncated vLLM SpecDecoding line (missing {', '.join(missing)})", raw)
                    return
                w.version = w.version or "V1 (no counts: throughputs only)"
            if depth is not None:
                w.k = int(depth)
                w.extra["dynamic_depth"] = True
                w.version = "V1 dynamic speculation (Current speculative depth)"
            w.version = w.version or ("V1 with throughput" if "Accepted throughput" in body else "V1")
            w.conventions = {"accept_rate": V1_RATE}
            if w.accept_len is not None:
                w.conventions["accept_len"] = V1_LEN
            if w.per_pos:
                w.per_pos_kind = "verify_steps"
                w.conventions["per_pos"] = V1_POS
                if w.k is None:
                    w.k = len(w.per_pos)
                self.reading.config["num_spec_tokens"] = max(self.reading.config.get("num_spec_tokens", 0),
                                                             len(w.per_pos))
            # drafts = Accepted / (mean - 1); only when that is well defined
            if w.accept_len is not None and w.accept_len > 1.005 and w.accepted_tokens and w.accepted_tokens > 0:
                w.drafts = round(w.accepted_tokens / (w.accept_len - 1))
                w.extra["drafts_derived"] = True
            elif w.per_pos and w.accepted_tokens and w.per_pos[0] > 0.0005:
                w.drafts = round(w.accepted_tokens / sum(w.per_pos)) if sum(w.per_pos) > 0 else None
                w.extra["drafts_derived"] = True
        else:
            body = vm.group("body")
            k = _num(V0["k"], body)
            w.accepted_tokens = _num(V0["accepted"], body)
            w.draft_tokens = _num(V0["drafted"], body)
            emitted = _num(V0["emitted"], body)
            w.accept_rate = _num(V0["rate"], body)
            if not _finite(k, w.accepted_tokens, w.draft_tokens, emitted, w.accept_rate):
                self.skip(i, "vLLM Speculative metrics line with a value that is not a finite number", raw)
                return
            if w.accepted_tokens is None or w.draft_tokens is None or w.accept_rate is None:
                self.skip(i, "truncated vLLM Speculative metrics line", raw)
                return
            w.conventions = {"accept_rate": V0_RATE}
            w.kind = "cumulative"
            if k is None or emitted is None:
                # V1 before PR 15902 (March 2025) printed the V0 words without k and emitted
                w.version = "V1 first (V0 wording, no k)"
            else:
                w.version = "V0"
                w.k = int(k)
                self.reading.config["num_spec_tokens"] = int(k)
                # V0 drafts k tokens per proposal; emitted = the accepted prefix + the bonus per
                # proposal. Its "accepted" also counts drafts accepted after a rejected one, so
                # it is a rate numerator, not the prefix length.
                w.drafts = w.draft_tokens / k if k > 0 else None
                w.accept_len = emitted / w.drafts if w.drafts else None
                w.conventions["accept_len"] = V0_LEN
                w.extra["emitted"] = emitted
                self.reading.config["cumulative"] = True
                w.extra["accepted_not_prefix"] = True
        # pair with the engine stats logged just before (same engine, a few lines up)
        cur = self.current
        if cur in self.last_engine and i - self.last_engine[cur][2] <= 5:
            w.gen_tps, w.concurrency, _ = self.last_engine[cur]
            w.extra.update(self.queue.get(cur, {}))
        if cur is not None and cur.startswith("agg"):
            w.rank = f"{cur[3:]} engines aggregated"
            w.version = (w.version or "V1") + ", data parallel aggregated"
        else:
            w.rank = f"engine {cur}" if cur is not None else None
        self.engines.add(w.rank)
        self.reading.windows.append(w)

    def finalize(self, reading) -> None:
        if len(self.engines) <= 1:
            for w in reading.windows:  # one engine: no rank to name
                w.rank = None
        reading.version = next((w.version for w in reading.windows if w.version), None)


def parse(text: str, path: str) -> Reading:
    """Parse a whole text (tests, small inputs); files are streamed by the package."""
    p = Parser(path)
    for i, ln in enumerate(text.splitlines(), 1):
        p.feed(i, ln)
    return p.finish()
