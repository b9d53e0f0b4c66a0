"""Readers for real engines' own output: SGLang and vLLM logs, Prometheus text.

    from specaudit.audit.sources import audit_file, read_source
    findings = audit_file("sglang_server.log")            # auto-detects the source
    reading = read_source("metrics.txt", "prom-text")      # Reading: windows + config

Sources (`--source` names):
    sglang-log   SGLang server log: `Decode batch, #running-req: 8, ..., accept len: 3.21,
                 accept rate: 0.74, cuda graph: True, gen throughput (token/s): 812.45,
                 #queue-req: 0` lines (and the `server_args=ServerArgs(...)` line for the
                 draft shape)
    vllm-log     vLLM server log: `SpecDecoding metrics: Mean acceptance length: 2.73,
                 ..., Accepted: 626 tokens, Drafted: 1062 tokens, Per-position acceptance
                 rate: 0.802, 0.551, 0.415, Avg Draft acceptance rate: 58.9%` lines, paired
                 with the `Engine 000: ... Avg generation throughput: ... Running: 4 reqs`
                 line logged just before
    prom-text    a Prometheus text scrape (one, or several appended to one file): vLLM's
                 `vllm:spec_decode_*_total` counters, SGLang's `sglang:spec_accept_length`
                 / `sglang:spec_accept_rate` / `sglang:gen_throughput` /
                 `sglang:num_running_reqs` gauges, or specaudit's own `specaudit_*` series

Each reader turns a file into a `Reading`: a list of `Window`s (one per log line, per
scrape interval, per iteration-stats record or per request) holding what the engine
reported, in ONE vocabulary (field names are stable; other tools code against them):

    engine           sglang | vllm | trtllm | llamacpp | aiperf | specaudit
    version          the format version the reader recognised ("v1-rate-first", "0.5.11",
                     "pr24536", ...) or None when it cannot be inferred (said so in findings)
    rank             "DP1 TP0", "engine 1", "slot 0", ... ; None = the only one
    concurrency      running requests (None when not printed)
    cuda_graph       True/False when the engine prints it
    k                draft length (tokens drafted per verify step) when known
    drafts           VERIFY STEPS: one per request per target forward that verified drafts
                     (vLLM num_drafts, llama.cpp drafts sent, SGLang spec_verify_ct,
                     TensorRT-LLM numRequestsWithDraftTokens); alias `verify_steps`
    draft_tokens     DRAFTED tokens sent to verification; alias `drafted`
    accepted_tokens  ACCEPTED DRAFT tokens, the bonus token EXCLUDED; alias `accepted`
    accept_len       mean acceptance length as the engine printed it (all four engines
                     count the bonus: 1 + accepted / verify steps)
    accept_rate      acceptance rate as printed, a fraction (its formula is the engine
                     version's: see `conventions`)
    per_pos          per-position acceptance rates as printed (fractions)
    per_pos_counts   accepted drafts at each position (counts), when printed or derivable
    per_pos_kind     the denominator of per_pos: "verify_steps" (vLLM, llama.cpp: an
                     unconditional rate, non-increasing in position when k is fixed) or
                     "drafted_at_position" (TensorRT-LLM: conditional on reaching it)
    per_pos_drafted  drafted tokens at each position (the "drafted_at_position" denominators)
    histogram        acceptance histogram h[i] = verify steps that accepted exactly i
                     drafts (bonus excluded): sum(h) = verify steps, sum(i*h_i) = accepted
    gen_tps          generation throughput (tokens/s, all running requests)
    kind             "interval" (a window's own figures), "cumulative" (since start-up:
                     counters that must not go down) or "gauge" (a last-window value that
                     must never be differenced)
    conventions      {figure: definition} the engine version used for its printed figures,
                     e.g. {"accept_rate": "(accepted + bs) / (bs * num_draft_tokens): counts
                     the bonus token"}; copied into every finding about that figure

The SA7xx rules of the invariant catalog (invariants/sa7xx_*.py, scope "source") then
check the identities that hold without traces. This package is a reader: it imports
schema.py, findings.py and the rule catalog, never another reader.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from specaudit.audit.findings import Finding
from specaudit.trace.schema import InputError

SOURCES = ("sglang-log", "vllm-log", "prom-text")
MAX_BYTES = 512 * 1024 * 1024  # refuse absurd inputs before reading them whole


@dataclass
class Window:
    """What an engine reported over one interval (one log line or one scrape delta)."""

    line: int | None = None          # 1-based line number in the file
    time: str | None = None          # timestamp as printed
    t: float | None = None           # seconds (scrapes with a known time), else None
    rank: str | None = None          # "DP1 TP0", "engine 1", ... ; None = the only one
    concurrency: float | None = None
    accept_len: float | None = None
    accept_rate: float | None = None
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    per_pos: list | None = None      # rates, fractions of drafts
    per_pos_counts: list | None = None
    gen_tps: float | None = None
    cuda_graph: bool | None = None
    printed_rate_pct: float | None = None   # vLLM "Avg Draft acceptance rate: X%"
    text: str = ""                   # the line (or a one-line summary of the interval)
    extra: dict = field(default_factory=dict)  # source-specific figures (counter_reset, ...)
    engine: str | None = None        # sglang | vllm | trtllm | llamacpp | aiperf | specaudit
    version: str | None = None       # the format version recognised, None = not inferable
    k: int | None = None             # draft length per verify step, when known
    per_pos_kind: str | None = None  # "verify_steps" | "drafted_at_position"
    per_pos_drafted: list | None = None   # drafted tokens per position (TensorRT-LLM)
    histogram: list | None = None    # h[i] = verify steps accepting exactly i drafts
    kind: str = "interval"           # interval | cumulative | gauge
    conventions: dict = field(default_factory=dict)  # figure -> the definition printed

    # the vocabulary's plain names (read-only aliases of the fields above)
    @property
    def verify_steps(self) -> float | None:
        return self.drafts

    @property
    def drafted(self) -> float | None:
        return self.draft_tokens

    @property
    def accepted(self) -> float | None:
        """Accepted draft tokens, bonus excluded."""
        return self.accepted_tokens

    @property
    def step_rate(self) -> float | None:
        """Verify steps per second per request implied by the window: gen_tps / (c * L).
        Honest counters keep it steady at a given concurrency; a counter that lies moves
        it. None when any factor is missing or zero."""
        if not (self.gen_tps and self.concurrency and self.accept_len):
            return None
        if self.gen_tps <= 0 or self.concurrency <= 0 or self.accept_len <= 0:
            return None
        return self.gen_tps / (self.concurrency * self.accept_len)


@dataclass
class Reading:
    """One file as read: its windows, the draft shape it declares, and notes."""

    source: str                      # sglang-log | vllm-log | prom-text
    engine: str                      # sglang | vllm | specaudit
    path: str
    windows: list[Window] = field(default_factory=list)
    config: dict = field(default_factory=dict)  # num_spec_tokens, num_draft_tokens, topk, dp_size
    notes: list[dict] = field(default_factory=list)  # skipped/truncated lines (rule SA700)
    series: dict = field(default_factory=dict)  # prom-text: the last scrape, per family
    # accept_len convention of the source: True when it counts the bonus token
    includes_bonus: bool = True
    version: str | None = None       # format version recognised (None = not inferable)
    conventions: dict = field(default_factory=dict)  # figure -> definition, file-wide

    def ranks(self) -> list:
        return sorted({w.rank for w in self.windows}, key=lambda r: (r is None, str(r)))

    def throughput(self, concurrency=None):
        """(mean gen tps, standard error, count, mean concurrency, mean accept_len) over the
        windows with a throughput, optionally only those at one concurrency."""
        ws = [w for w in self.windows if w.gen_tps is not None and w.gen_tps > 0
              and (concurrency is None or w.concurrency == concurrency)]
        if not ws:
            return None
        xs = [w.gen_tps for w in ws]
        n = len(xs)
        m = sum(xs) / n
        se = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n) if n > 1 else 0.0
        cs = [w.concurrency for w in ws if w.concurrency is not None]
        ls = [w.accept_len for w in ws if w.accept_len is not None]
        return (m, se, n, (sum(cs) / len(cs)) if cs else None, (sum(ls) / len(ls)) if ls else None)


def _read_text(path) -> str:
    p = Path(path)
    if not p.exists():
        raise InputError(p, "no such file")
    if p.is_dir():
        raise InputError(p, "is a folder; an engine log or a metrics scrape is one file")
    try:
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise InputError(p, f"file of {size / 2**20:.0f} MiB is too large; cut the window you need")
        data = p.read_bytes()
    except OSError as e:
        raise InputError(p, f"cannot read: {e.strerror or e}") from None
    if b"\x00" in data[:4096]:
        raise InputError(p, "binary file, not a log or Prometheus text (a trace dataset? use the folder)")
    return data.decode("utf-8", errors="replace")


def detect_text(text: str) -> str | None:
    """Which source a text is, or None. Mixed engines raise ValueError."""
    from specaudit.audit.sources import prom_text as prom, sglang, vllm
    hits = {"sglang-log": sglang.looks_like(text), "vllm-log": vllm.looks_like(text),
            "prom-text": prom.looks_like(text)}
    found = [k for k, v in hits.items() if v]
    if "prom-text" in found and len(found) > 1:
        # a scrape's HELP text may mention a log phrase; exposition lines win
        found = ["prom-text"]
    if len(found) > 1:
        raise ValueError("holds both SGLang decode lines and vLLM SpecDecoding lines (mixed engines); "
                         "split the file per engine or pass --source")
    return found[0] if found else None


def detect(path) -> str:
    """The source of a file (sglang-log, vllm-log or prom-text). InputError when it is none."""
    text = _read_text(path)
    try:
        s = detect_text(text)
    except ValueError as e:
        raise InputError(path, str(e)) from None
    if s is None:
        raise InputError(path, _unrecognised(text))
    return s


def _unrecognised(text: str) -> str:
    if not text.strip():
        return "empty file: no engine log lines or metrics"
    return ("not a recognised engine log or metrics scrape: no SGLang 'Decode batch' lines with accept len, "
            "no vLLM 'SpecDecoding metrics:' lines, no Prometheus spec-decoding series "
            "(pass --source sglang-log|vllm-log|prom-text to force one)")


def read_source(path, source: str | None = None) -> Reading:
    """Parse a file into a Reading. InputError when unrecognised or unreadable."""
    from specaudit.audit.sources import prom_text as prom, sglang, vllm
    if source is not None and source not in SOURCES:
        raise InputError(path, f"unknown --source {source!r}; one of {', '.join(SOURCES)}")
    text = _read_text(path)
    if source is None:
        try:
            source = detect_text(text)
        except ValueError as e:
            raise InputError(path, str(e)) from None
        if source is None:
            raise InputError(path, _unrecognised(text))
    parser = {"sglang-log": sglang.parse, "vllm-log": vllm.parse, "prom-text": prom.parse}[source]
    reading = parser(text, str(path))
    if not reading.windows:
        raise InputError(path, f"read as {source}, but no usable spec-decoding figures in it"
                         + (f" ({len(reading.notes)} lines skipped; line {reading.notes[0]['line']}: "
                            f"{reading.notes[0]['reason']})"
                            if reading.notes else ""))
    return reading


def audit_reading(reading: Reading, select=(), ignore=()) -> list[Finding]:
    """Run every SA7xx (scope "source") rule on a Reading."""
    from specaudit.invariants import load_rules
    findings = []
    for rule in load_rules(select=select, ignore=ignore, entry_points=False):
        if rule.scope != "source":
            continue
        out = rule.check(reading)
        if out is None:
            continue
        for f in out:
            if isinstance(f, Finding):
                findings.append(f)
            elif isinstance(f, dict):
                kw = {k: f.pop(k) for k in ("run_id", "request_id", "step", "file", "line") if k in f}
                kw.setdefault("file", reading.path)
                findings.append(rule.finding(**kw, **f))
    findings.sort(key=lambda f: (f.line if f.line is not None else -1, f.code))
    return findings


def audit_file(path, source: str | None = None, select=(), ignore=()) -> list[Finding]:
    """Read an SGLang log, a vLLM log or a Prometheus scrape and audit it.

    Returns the findings (errors fail a check, warnings do not). Raises
    specaudit.schema.InputError for a file that is none of these, empty, or mixed.
    """
    return audit_reading(read_source(path, source), select=select, ignore=ignore)


def note(path, line, reason, text="") -> dict:
    """A skipped or truncated line (reported by rule SA700, a warning)."""
    return {"file": str(path), "line": line, "reason": reason, "text": text.strip()[:200]}
