"""Readers for real engines' own output: SGLang, vLLM, TensorRT-LLM, llama.cpp, AIPerf.

    from specaudit.audit.sources import audit_file, read_source, iter_readings
    findings = audit_file("sglang_server.log")            # auto-detects the source, streams
    reading = read_source("metrics.txt", "prom-text")      # Reading: windows + config
    for chunk in iter_readings("huge.log"): ...            # bounded memory for any size

Sources (`--source` names; `specaudit check --list-sources` prints one example each):
    sglang-log   SGLang scheduler log: `Decode batch, #running-req: 8, ..., accept len: 3.21,
                 accept rate: 0.74, cuda graph: True, gen throughput (token/s): 812.45` lines
                 (every prefix style, hybrid-model fields) and `server_args=ServerArgs(...)`
    vllm-log     vLLM log: V1 `SpecDecoding metrics:` lines in every variant (rate first in
                 percent, no throughput, `Current speculative depth`, `Engine 00N` pairing)
                 and V0 / first-V1 `Speculative metrics:` lines
    llamacpp-log llama.cpp: per-slot `draft acceptance [rate] = ...` lines (old and PR 24536),
                 `statistics <drafter>:` lines, per-round `accepted A/B draft tokens`, and the
                 llama-speculative / llama-lookup summary
    vllm-bench   vLLM's benchmark summaries: `vllm bench serve`'s Speculative Decoding section
                 and examples/offline_inference/spec_decode.py's summary
    tokenspeed-log TokenSpeed `Decode batch.` lines (avg_accept_len, accept_rate; k inferred)
    prom-text    Prometheus text (one scrape, or several appended): vllm:spec_decode_*,
                 sglang:spec_accept_* gauges, trtllm_spec_decode_*, llamacpp:spec_decode_*,
                 specaudit_*
    json-records JSON or JSONL: vLLM per-request metrics.speculative_decoding, SGLang meta_info
                 spec keys (every release's names), TensorRT-LLM iteration stats and
                 per-request perf metrics, llama.cpp timings, AIPerf profile_export records

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
check the identities that hold without traces. audit_file_account() adds the reading's
account (sources/account.py: what was recognised, read and skipped, each identity with its
numbers, what could not be checked and why); `specaudit check` prints it for every input.
A paste's Markdown, CRLF and colour codes are unwrapped line by line (unwrap()). This package is a reader: it imports
schema.py, findings.py and the rule catalog, never another reader.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from specaudit.audit.findings import Finding, rule_findings
from specaudit.stats import mean_se
from specaudit.trace.schema import InputError

# --source name -> (module, kind, one-line description, example). Kept in one place so
# `specaudit check --list-sources` and detection agree.
SOURCES = {
    "sglang-log": ("sglang", "log", "SGLang scheduler log: 'Decode batch' lines (+ server_args for the shape)",
                   "[2026-03-18 11:22:05 TP0] Decode batch, #running-req: 2, #token: 5046, token usage: 0.01, "
                   "accept len: 2.64, accept rate: 0.66, cuda graph: True, gen throughput (token/s): 242.08"),
    "vllm-log": ("vllm", "log", "vLLM log: 'SpecDecoding metrics:' (V1, every variant) and 'Speculative metrics:' (V0)",
                 "SpecDecoding metrics: Mean acceptance length: 2.91, Accepted: 44 tokens, Drafted: 161 tokens, "
                 "Per-position acceptance rate: 0.739, 0.478, ..., Avg Draft acceptance rate: 27.3%"),
    "llamacpp-log": ("llamacpp", "log", "llama.cpp server/CLI log: per-slot draft acceptance, 'statistics <drafter>:',"
                     " per-round 'accepted A/B draft tokens', llama-speculative summary",
                     "slot print_timing: id  1 | task 0 | draft acceptance = 0.64479 (  167 accepted /   259 "
                     "generated), mean acceptance length =  2.92, acceptance rate per position = "
                     "(0.805, 0.632, 0.483)"),
    "vllm-bench": ("vllm_bench", "log", "vLLM benchmark summaries: `vllm bench serve`'s 'Speculative Decoding' "
                   "section and the summary of examples/offline_inference/spec_decode.py",
                   "Acceptance rate (%):  61.02 / Acceptance length:  2.83 / Drafts:  1234 / Draft tokens:  3702 / "
                   "Accepted tokens:  2259  (or num_drafts: / num_accepted_tokens: / mean acceptance length:)"),
    "tokenspeed-log": ("tokenspeed", "log", "TokenSpeed scheduler log: 'Decode batch.' lines with avg_accept_len and "
                       "accept_rate",
                       "Decode batch. #running-req: 8, #pages(active/cached/total): 412/96/8192, page ratio: 0.05, "
                       "gen throughput (token/s): 812.45, avg_accept_len: 3.21, accept_rate: 0.74, #queue-req: 0"),
    "prom-text": ("prom_text", "prom", "Prometheus text: vllm:spec_decode_*, sglang:spec_accept_*, "
                  "trtllm_spec_decode_*, "
                  "llamacpp:spec_decode_*, specaudit_*",
                  "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\"} 106.0"),
    "json-records": ("records", "json", "JSON / JSONL records: vLLM metrics.speculative_decoding, SGLang meta_info "
                     "spec_* (every key name), TokenSpeed meta_info, TensorRT-LLM iteration stats and per-request perf "
                     "metrics, llama.cpp and mlx-vlm timings, FastDeploy speculate_metrics, AIPerf profile_export "
                     "records",
                     '{"meta_info": {"spec_verify_ct": 43, "spec_num_correct_drafts": 63, '
                     '"spec_num_proposed_drafts": 215, "spec_accept_length": 2.465}}'),
}
MAX_BYTES = 512 * 1024 * 1024  # a JSON document (not JSONL) is parsed whole: refuse absurd ones
MAX_LINE = 1024 * 1024          # a longer line is not a log line: skipped with a note
MAX_NOTES = 1000                # notes kept per file (the rest are counted)
CHUNK_WINDOWS = 10_000          # audit_file runs the rules per chunk of windows (bounded memory)
HEAD_BYTES = 8 * 1024 * 1024    # detection reads this much of the file first
READ_CHUNK = 4 * 1024 * 1024    # Lines reads the file in blocks of this size


@dataclass(slots=True)
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

    def usable_windows(self) -> list:
        """The windows that are not counter resets (SA700 reports those), computed once per
        list of windows: every SA7xx rule asks for them."""
        ws = self.windows
        cached = self.__dict__.get("_usable")
        if cached is not None and cached[0] is ws and cached[1] == len(ws):
            return cached[2]
        out = [w for w in ws if not w.extra.get("counter_reset")]
        self.__dict__["_usable"] = (ws, len(ws), out)
        return out

    def ranks(self) -> list:
        return sorted({w.rank for w in self.windows}, key=lambda r: (r is None, str(r)))

    def throughput(self, concurrency=None):
        """(mean gen tps, standard error, count, mean concurrency, mean accept_len) over the
        windows with a throughput, optionally only those at one concurrency."""
        ws = [w for w in self.windows if w.gen_tps is not None and w.gen_tps > 0
              and (concurrency is None or w.concurrency == concurrency)]
        if not ws:
            return None
        m, se, n = mean_se([w.gen_tps for w in ws])
        cs = [w.concurrency for w in ws if w.concurrency is not None]
        ls = [w.accept_len for w in ws if w.accept_len is not None]
        return (m, se, n, (sum(cs) / len(cs)) if cs else None, (sum(ls) / len(ls)) if ls else None)


# ------------------------------------------------------------------ streaming input


_MD_QUOTE = re.compile(r"^[ \t]{0,3}(?:>[ \t]?)+")
_MD_BULLET = re.compile(r"^[ \t]{0,3}[-*+][ \t]+(?=\S)")
_MD_FENCE = re.compile(r"^[ \t]{0,3}(?:```|~~~)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def unwrap(text: str) -> str:
    """A pasted line without what was wrapped around it: Markdown `>` quotes and a leading
    `- ` / `* ` bullet, a code fence (the fence line itself reads as blank), terminal colour
    codes and a Windows line end. The engine's own text is left as printed."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    c = text[:1]
    if c and c in " \t>-*+`~":
        if _MD_FENCE.match(text):
            return ""
        text = _MD_QUOTE.sub("", text, count=1)
        text = _MD_BULLET.sub("", text, count=1)
    return text.rstrip("\r")


def _check_path(path) -> Path:
    from specaudit.inputs import open_input
    p = Path(path)
    if os.path.isdir(p):
        raise InputError(p, "is a folder; an engine log or a metrics scrape is one file")
    try:
        with open_input(p) as f:   # regular files only: a FIFO or a device would block or never end
            head = f.read(4096)
    except OSError as e:
        raise InputError(p, f"cannot read: {e.strerror or e}") from None
    if b"\x00" in head:
        raise InputError(p, "binary file, not a log or Prometheus text (a trace dataset? use the folder)")
    return p


def _progress(p: Path):
    """A tqdm byte counter on a terminal (stderr), None otherwise."""
    import sys
    try:
        size = p.stat().st_size
    except OSError:
        return None
    if size < 64 * 1024 * 1024 or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {p.name}", leave=False, file=sys.stderr)


class Lines:
    """The lines of a file, streamed: (line number, text) with bounded memory.

    Read in READ_CHUNK binary blocks and split in C (no per-line readline). With
    `markers` (a tuple of byte strings, or a compiled bytes regex) only the lines holding
    one of them are decoded and yielded, numbered as in the file: a reader's prefilter. For
    a block of plain ASCII lines the markers are found with bytes.find over the whole block
    and only the lines around the hits are touched, so the noise of a server log costs no
    Python work per line; other blocks are filtered line by line. Bytes that are not UTF-8 are replaced
    (and noted once, whether or not that line is yielded); a line over MAX_LINE bytes is
    skipped with a note; a file cut mid-line yields its last partial line like any other
    (the parsers note it as truncated when it does not parse). `notes` collects these.
    Memory: one block plus one line (at most MAX_LINE), whatever the file size.
    """

    def __init__(self, path, progress: bool = True, markers=None, start: int = 0, end: int | None = None,
                 first_line: int = 1, counter=None):
        self.path = _check_path(path)
        self.notes: list[dict] = []
        self.progress = progress
        self.markers = markers
        self.unterminated = None   # number of a last line with no newline (cut mid-write?)
        # a byte range [start, end) that begins at a line start, numbered from first_line
        # (the parallel audit); counter: a shared multiprocessing.Value of bytes read
        self.start, self.end, self.first_line, self.counter = start, end, first_line, counter
        self.marks = tuple(markers) if isinstance(markers, (tuple, list)) else None
        if self.marks is not None:
            import re
            self.markers = re.compile(b"|".join(re.escape(m) for m in self.marks))

    def __iter__(self):
        bar = _progress(self.path) if self.progress and self.counter is None else None
        search = self.markers.search if self.markers is not None else None
        bad_utf8 = False
        i = self.first_line - 1
        left = self.end - self.start if self.end is not None else None
        try:
            from specaudit.inputs import open_input
            with open_input(self.path) as f:
                if self.start:
                    f.seek(self.start)
                rest = b""            # the unfinished last line of the previous block
                skipping = 0          # bytes of an over-long line being drained (0: none)
                while True:
                    if left is None:
                        block = f.read(READ_CHUNK)
                    else:
                        block = f.read(min(READ_CHUNK, left)) if left > 0 else b""
                        left -= len(block)
                    if bar is not None and block:
                        bar.update(len(block))
                    if self.counter is not None and block:
                        with self.counter.get_lock():
                            self.counter.value += len(block)
                    if not block:
                        raws = [rest] if rest and not skipping else []
                        if raws:
                            self.unterminated = i + 1
                        if skipping:  # an over-long last line without a newline
                            i += 1
                            self.notes.append(note(self.path, i, f"line of {skipping + len(rest)} bytes skipped "
                                                                 "(not a log line)"))
                        rest = b""
                    else:
                        raws = (rest + block).split(b"\n") if rest else block.split(b"\n")
                        rest = raws.pop()
                        if skipping:
                            if not raws:      # still inside the long line
                                skipping += len(rest)
                                rest = b""
                                continue
                            i += 1
                            self.notes.append(note(self.path, i, f"line of {skipping + len(raws[0]) + 1} bytes "
                                                                 "skipped (not a log line)"))
                            skipping = 0
                            raws = raws[1:]
                        if len(rest) > MAX_LINE:
                            skipping, rest = len(rest), b""
                    if self.marks is not None and raws and max(map(len, raws)) <= MAX_LINE \
                            and all(map(bytes.isascii, raws)):
                        yield from self._hits(raws, i)
                        i += len(raws)
                        if not block:
                            break
                        continue
                    for raw in raws:
                        i += 1
                        if len(raw) > MAX_LINE:
                            self.notes.append(note(self.path, i, f"line of {len(raw) + 1} bytes skipped (not a log "
                                                                 "line)"))
                            continue
                        if search is not None and search(raw) is None:
                            if not bad_utf8 and not raw.isascii():
                                try:
                                    raw.decode("utf-8")
                                except UnicodeDecodeError:
                                    bad_utf8 = True
                                    self.notes.append(note(self.path, i, "bytes that are not UTF-8 (replaced; first "
                                                                         "such line shown)",
                                                           raw.decode("utf-8", errors="replace")))
                            continue
                        try:
                            text = raw.decode("utf-8")
                        except UnicodeDecodeError:
                            text = raw.decode("utf-8", errors="replace")
                            if not bad_utf8:
                                bad_utf8 = True
                                self.notes.append(note(self.path, i, "bytes that are not UTF-8 (replaced; first such "
                                                                     "line shown)", text))
                        yield i, unwrap(text)
                    if not block:
                        break
        except OSError as e:
            raise InputError(self.path, f"cannot read: {e.strerror or e}") from None
        finally:
            if bar is not None:
                bar.close()


    def _hits(self, raws: list, i: int):
        """The lines of raws (plain ASCII, none over-long; line i + 1 first) that hold a
        marker, found by bytes.find over the joined block, in file order."""
        buf = b"\n".join(raws)
        spans: dict = {}
        for m in self.marks:
            p = buf.find(m)
            while p >= 0:
                ls = buf.rfind(b"\n", 0, p) + 1
                le = buf.find(b"\n", p)
                if le < 0:
                    le = len(buf)
                spans[ls] = le
                p = buf.find(m, le + 1)
        newlines, prev = 0, 0   # newlines before ls: the line number is i + 1 + newlines
        for ls in sorted(spans):
            newlines += buf.count(b"\n", prev, ls)
            prev = ls
            yield i + 1 + newlines, unwrap(buf[ls:spans[ls]].decode("ascii"))


def _modules():
    import importlib
    return {name: importlib.import_module(f"specaudit.audit.sources.{mod}") for name, (mod, *_r) in SOURCES.items()}


def _log_markers(mods):
    """Every log reader's MARKERS (for Lines): a line without any of them is no
    reader's line and no other engine's (the mixed-engine check needs those too)."""
    return tuple(sorted({m for name, mod in mods.items() if SOURCES[name][1] == "log" for m in mod.MARKERS}))


def detect_lines(lines, majority: bool = False) -> str | None:
    """Which source an iterable of text lines is (looking at the first HEAD_BYTES, then on
    until a first hit), or None. Mixed engines raise ValueError, or with `majority` give
    the engine with the most lines there (ties: the first seen)."""
    mods = _modules()
    found: dict[str, int] = {}
    seen = 0
    first_char = None
    for _, ln in lines:
        s = ln.strip()
        if not s:
            continue
        if first_char is None:
            first_char = s[0]
            if mods["json-records"].looks_like_first(s):
                return "json-records"
        for name, mod in mods.items():
            if name != "json-records" and mod.looks_like_line(ln):
                found.setdefault(name, 0)
                found[name] += 1
        seen += len(ln) + 1
        if found and seen > HEAD_BYTES:
            break
    if "prom-text" in found and len(found) > 1:
        # a scrape's HELP text may mention a log phrase; exposition lines win
        return "prom-text"
    if len(found) > 1 and majority:
        return max(found, key=found.get)   # dicts keep first-seen order: max keeps the first of a tie
    if len(found) > 1:
        names = " and ".join(SOURCES[k][2].split(":")[0] for k in sorted(found))
        raise ValueError(f"holds lines of more than one engine ({names}: mixed engines); split the file per engine "
                         "or pass --source")
    return next(iter(found), None)


def detect(path) -> str:
    """The source of a file (one of SOURCES). InputError when it is none of them."""
    p = _check_path(path)
    try:
        s = detect_lines(Lines(p, progress=False))
    except ValueError as e:
        raise InputError(path, str(e)) from None
    if s is None:
        raise InputError(path, _unrecognised(p))
    return s


def _unrecognised(p: Path) -> str:
    try:
        empty = p.stat().st_size == 0 or not any(t.strip() for _, t in Lines(p, progress=False))
    except InputError:
        empty = False
    if empty:
        return "empty file: no engine log lines or metrics"
    return ("not a recognised engine log or metrics scrape: no SGLang 'Decode batch' lines with accept len, "
            "no vLLM 'SpecDecoding metrics:' lines, no llama.cpp draft acceptance lines, no spec-decoding JSON "
            "records, no Prometheus spec-decoding series (pass --source "
            + "|".join(SOURCES) + " to force one)")


def list_sources() -> str:
    """`specaudit check --list-sources`: each source, what it reads, and an example line."""
    out = []
    width = max(map(len, SOURCES)) + 1
    for name, (_mod, _kind, what, example) in SOURCES.items():
        out.append(f"{name:{width}}{what}\n{'':{width}}e.g. {example}")
    return "\n".join(out) + "\n"


def _resolve(path, source):
    if source is not None and source not in SOURCES:
        raise InputError(path, f"unknown --source {source!r}; one of {', '.join(SOURCES)}")
    p = _check_path(path)
    if source is None:
        try:
            source = detect_lines(Lines(p, progress=False))
        except ValueError as e:
            raise InputError(path, str(e)) from None
        if source is None:
            raise InputError(path, _unrecognised(p))
    return p, source


def _stream(path, source: str, forced: bool, lines, parser, chunk: int, stats: dict):
    """Readings of at most `chunk` windows from `lines` through `parser`; stats gets the
    windows and notes counted and the last chunk's notes."""
    mods = _modules()
    # lines of another engine past the part detection read (a mixed file): noted, not read
    others = [] if forced or SOURCES[source][1] != "log" else \
        [(n, m.looks_like_line) for n, m in mods.items() if n != source and SOURCES[n][1] == "log"]
    mixed = 0
    total = 0
    notes_total = 0
    emitted = False
    for i, ln in lines:
        for name, looks in others:
            if looks(ln):
                if not mixed:
                    parser.skip(i, f"a {name} line in a {source} file (mixed engines: this and later such lines "
                                   "are not read; split the file per engine)", ln)
                mixed += 1
                break
        else:
            if i == lines.unterminated:
                parser.unterminated = i
            parser.feed(i, ln)
        if len(parser.reading.windows) >= chunk:
            r = parser.take()
            total += len(r.windows)
            r.notes = lines.notes + r.notes
            lines.notes = []
            notes_total += len(r.notes)
            emitted = True
            yield r
            del r   # (held here, the chunk would live on while the next one is read: two in memory)
    r = parser.finish()
    r.notes = lines.notes + r.notes
    total += len(r.windows)
    notes_total += len(r.notes)
    stats.update(windows=total, notes=notes_total, last_notes=r.notes[:1],
                 recognised=getattr(parser, "recognised", None), all_notes=r.notes[:MAX_NOTES] if not total else ())
    if r.windows or not emitted or r.notes:
        yield r


class NoFigures(InputError):
    """A file read as `source` with no usable spec-decoding figures. `recognised` names the
    engine output it was recognised as by its own words (then `check` reports it with its
    account and exit 0: judged on what it holds), None when nothing says it is an engine's."""

    def __init__(self, path, reason, recognised=None, notes=()):
        super().__init__(path, reason)
        self.recognised = recognised
        self.notes = list(notes)


def _no_figures(path, source, stats, recognised=None) -> InputError:
    last = stats.get("last_notes")
    return NoFigures(path, f"read as {source}, but no usable spec-decoding figures in it"
                     + (f" ({stats['notes']} lines skipped; line {last[0]['line']}: {last[0]['reason']})"
                        if last else ""), recognised=recognised, notes=stats.get("all_notes", ()))


def iter_readings(path, source: str | None = None, chunk: int = CHUNK_WINDOWS):
    """Stream a file into Readings of at most `chunk` windows each (the last may be
    smaller); each carries the config and notes seen so far. Bounded memory for any size."""
    forced = source is not None
    p, source = _resolve(path, source)
    yield from _iter(p, path, source, forced, chunk)


def _recognised(source: str, forced: bool, stats: dict) -> str | None:
    """What a file without figures was recognised as by its own words: a log detected by
    its lines, or what the parser saw (a record or series family of an engine)."""
    if stats.get("recognised"):
        return stats["recognised"]
    if not forced and SOURCES[source][1] == "log":
        return SOURCES[source][2].split(":")[0]
    return None


def _iter(p: Path, path, source: str, forced: bool, chunk: int = CHUNK_WINDOWS):
    mods = _modules()
    lines = Lines(p, markers=_log_markers(mods) if SOURCES[source][1] == "log" else None)
    parser = mods[source].Parser(str(path))
    stats: dict = {}
    try:
        for r in _stream(path, source, forced, lines, parser, chunk, stats):
            if "windows" in stats and stats["windows"] == 0:
                raise _no_figures(path, source, stats, _recognised(source, forced, stats))
            yield r
            del r   # one chunk in memory at a time (see _stream)
    except NoFigures:
        raise
    except InputError as e:   # a reader's own refusal (e.g. a scrape with no spec series)
        rec = getattr(parser, "recognised", None)
        if rec:
            raise NoFigures(e.path, e.reason, recognised=rec, notes=lines.notes) from None
        raise
    if stats.get("windows", 0) == 0:
        raise _no_figures(path, source, stats, _recognised(source, forced, stats))


# ------------------------------------------------------------------ parallel audit of a large log
#
# A log of PARALLEL_MIN bytes or more is cut into one byte range per worker (each starting
# at a line start, numbered from its true line number), and each worker reads, parses and
# audits its range chunk by chunk exactly as the sequential path does: the rules already
# run per chunk of CHUNK_WINDOWS windows, so a range boundary is one more chunk boundary.
# Reader state that a range cannot see is seeded: the configuration lines of the file's
# head (SGLang's server_args) through the reader's CONFIG_MARKERS. Findings come back in
# file order; memory stays one block and one chunk per worker.

PARALLEL_MIN = 64 * 1024 * 1024


def workers() -> int:
    """Worker processes for a large log: SPECAUDIT_WORKERS, else the CPUs this process may
    use (at most 8); 1 = sequential."""
    import os
    env = os.environ.get("SPECAUDIT_WORKERS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


_COUNTER = None


def _init_worker(counter):
    global _COUNTER
    _COUNTER = counter


def _audit_range(path, source, forced, start, end, first_line, seed, select, ignore, chunk):
    mods = _modules()
    parser = mods[source].Parser(str(path))
    parser.reading.config.update(seed)
    lines = Lines(path, markers=_log_markers(mods), start=start, end=end, first_line=first_line, counter=_COUNTER)
    stats: dict = {}
    out: list = []
    from specaudit.audit.sources.account import Account
    acc = Account(path, source)
    for r in _stream(path, source, forced, lines, parser, chunk, stats):
        acc.add(r)
        out += audit_reading(r, select=select, ignore=ignore)
        del r   # audited: not kept while the next chunk is read
    stats["account"] = acc
    return out, stats


def _ranges(p: Path, n: int) -> list[tuple[int, int, int]]:
    """n byte ranges (start, end, first line number), each starting at a line start."""
    size = p.stat().st_size
    from specaudit.inputs import open_input
    cuts = [0]
    with open_input(p) as f:
        for j in range(1, n):
            f.seek(max(size * j // n, cuts[-1]))
            f.readline(MAX_LINE + 1)  # to the next line start (a long line: its part is noted by one range)
            pos = f.tell()
            if pos < size and pos > cuts[-1]:
                cuts.append(pos)
        cuts.append(size)
        # the first line number of each range: newlines before its start, counted in blocks
        firsts, count, pos = [1], 0, 0
        f.seek(0)
        for c in cuts[1:-1]:
            while pos < c:
                block = f.read(min(READ_CHUNK, c - pos))
                if not block:
                    break
                count += block.count(b"\n")
                pos += len(block)
            firsts.append(count + 1)
    return [(cuts[j], cuts[j + 1], firsts[j]) for j in range(len(cuts) - 1)]


def _seed_config(p: Path, source: str) -> dict:
    """The configuration a reader collects from the file's head (its CONFIG_MARKERS lines)."""
    mod = _modules()[source]
    marks = getattr(mod, "CONFIG_MARKERS", ())
    if not marks:
        return {}
    parser = mod.Parser(str(p))
    for i, ln in Lines(p, progress=False, markers=tuple(marks), end=min(p.stat().st_size, HEAD_BYTES)):
        parser.feed(i, ln)
    return dict(parser.reading.config)


def _audit_parallel(p: Path, path, source: str, forced: bool, n: int, select, ignore, acc=None) -> list[Finding]:
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    ranges = _ranges(p, n)
    seed = _seed_config(p, source)
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    counter = ctx.Value("q", 0)
    bar = _progress(p)
    try:
        with ProcessPoolExecutor(max_workers=len(ranges), mp_context=ctx, initializer=_init_worker,
                                 initargs=(counter,)) as ex:
            futs = [ex.submit(_audit_range, str(path), source, forced, a, b, first, seed, tuple(select),
                              tuple(ignore), CHUNK_WINDOWS) for a, b, first in ranges]
            pending = set(futs)
            while pending:
                _done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                if bar is not None:
                    bar.update(counter.value - bar.n)
            results = [f.result() for f in futs]
    finally:
        if bar is not None:
            bar.close()
    out: list[Finding] = []
    for fs, stats in results:
        out += fs
        if acc is not None and stats.get("account") is not None:
            acc.merge(stats["account"])
    if sum(st.get("windows", 0) for _fs, st in results) == 0:
        stats = {"notes": sum(st.get("notes", 0) for _fs, st in results),
                 "last_notes": next((st["last_notes"] for _fs, st in results if st.get("last_notes")), [])}
        raise _no_figures(path, source, stats)
    return out


def read_source(path, source: str | None = None) -> Reading:
    """Parse a whole file into one Reading. InputError when unrecognised or unreadable.
    (For any size use iter_readings or audit_file, which stream.)"""
    out = None
    for r in iter_readings(path, source, chunk=10**12):
        out = r
    return out


def audit_reading(reading: Reading, select=(), ignore=()) -> list[Finding]:
    """Run every SA7xx (scope "source") rule on a Reading. Each finding carries the engine,
    the format version recognised and the conventions of the figures it is about."""
    from specaudit.invariants import load_rules
    findings = []
    for rule in load_rules(select=select, ignore=ignore, entry_points=False):
        if rule.scope != "source":
            continue
        findings += rule_findings(rule, rule.check(reading), file=reading.path)
    by_line = {w.line: w for w in reading.windows if w.line is not None}
    for f in findings:
        w = by_line.get(f.line)
        f.values.setdefault("engine", (w.engine if w is not None and w.engine else reading.engine))
        version = (w.version if w is not None and w.version else reading.version)
        f.values.setdefault("version", version or "not inferable from this output")
        conv = dict(reading.conventions)
        if w is not None:
            conv.update(w.conventions)
        if conv:
            f.values.setdefault("conventions", conv)
    findings.sort(key=lambda f: (f.line if f.line is not None else -1, f.code))
    return findings


def audit_file_account(path, source: str | None = None, select=(), ignore=()) -> tuple[list[Finding], dict]:
    """audit_file plus the reading's account (sources.account): what was recognised and
    read, each identity checked with its numbers, what could not be checked and why. A file
    recognised by its own words but holding no spec-decoding figures gives no findings and
    an account that says so; NoFigures / InputError only for input that is no engine's."""
    from specaudit.audit.sources.account import Account
    try:
        p, src = _resolve(path, source)
        mixed = ""
    except InputError as e:   # two engines' lines in one file: read the engine with most lines
        if source is not None or "mixed engines" not in e.reason:
            raise
        p, mixed = _check_path(path), e.reason
        src = detect_lines(Lines(p, progress=False), majority=True)
    acc = Account(path, src, what=SOURCES[src][2].split(":")[0])
    if mixed:
        acc.note(f"{mixed.split(';')[0]}: read the {SOURCES[src][2].split(':')[0]} lines, the other engine's "
                 "lines are skipped (SA700 names the first)")
    out: list[Finding] = []
    n = workers()
    try:
        if n > 1 and SOURCES[src][1] == "log" and p.stat().st_size >= PARALLEL_MIN:
            out = _audit_parallel(p, path, src, source is not None, n, select, ignore, acc)
        else:
            for r in _iter(p, path, src, source is not None):
                acc.add(r)
                out += audit_reading(r, select=select, ignore=ignore)
                del r   # audited: not kept while the next chunk is read
    except NoFigures as e:
        if not e.recognised:
            raise
        acc.what = e.recognised
        acc.engine = next((eng for word, eng in (("TensorRT", "trtllm"), ("SGLang", "sglang"), ("vLLM", "vllm"),
                                                  ("llama", "llamacpp"), ("TokenSpeed", "tokenspeed"),
                                                  ("mlx", "mlx")) if word in e.recognised), None)
        acc.add(Reading(source=src, engine="", path=str(path), notes=e.notes))
        acc.note(f"{e.reason}; recognised as {e.recognised}: judged on what it holds")
        return [f for f in rule_findings_of_notes(path, e.notes, select, ignore)], acc.finish([])
    return out, acc.finish(out)


def rule_findings_of_notes(path, notes, select=(), ignore=()) -> list[Finding]:
    """SA700 findings for the skipped lines of a file that gave no windows."""
    if not notes:
        return []
    return audit_reading(Reading(source="", engine="", path=str(path), notes=list(notes)), select=select,
                         ignore=ignore)


def audit_file(path, source: str | None = None, select=(), ignore=()) -> list[Finding]:
    """Read an engine log, a metrics scrape or JSON records and audit them, streaming.

    Returns the findings (errors fail a check, warnings do not). Raises
    specaudit.trace.schema.InputError for a file that is none of these, empty, or mixed.
    """
    p, src = _resolve(path, source)
    n = workers()
    if n > 1 and SOURCES[src][1] == "log" and p.stat().st_size >= PARALLEL_MIN:
        return _audit_parallel(p, path, src, source is not None, n, select, ignore)
    out: list[Finding] = []
    for r in _iter(p, path, src, source is not None):
        out += audit_reading(r, select=select, ignore=ignore)
        del r   # audited: not kept while the next chunk is read
    return out


def note(path, line, reason, text="") -> dict:
    """A skipped or truncated line (reported by rule SA700, a warning)."""
    return {"file": str(path), "line": line, "reason": reason, "text": text.strip()[:200]}


def finite(x) -> bool:
    """A number that a rule can compare (not None, nan or inf)."""
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


class LineParser:
    """Base of the line readers: feed(lineno, text) per line, take() a chunk, finish().

    Subclasses implement feed(); they append Windows to self.reading.windows and notes
    with self.skip(). take() hands over the windows so far (keeping config and state).
    """

    source = ""
    engine = ""
    unterminated = None  # the file's last line when it has no newline (iter_readings sets it)

    def __init__(self, path: str):
        self.path = path
        self.reading = Reading(source=self.source, engine=self.engine, path=path)
        self._notes_dropped = 0

    def skip(self, line, reason, text=""):
        if len(self.reading.notes) < MAX_NOTES:
            self.reading.notes.append(note(self.path, line, reason, text))
        else:
            self._notes_dropped += 1

    def feed(self, lineno: int, text: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def finalize(self, reading: Reading) -> None:
        """Derive config-dependent figures on a chunk before it is handed over."""

    def take(self) -> Reading:
        r = self.reading
        self.finalize(r)
        self.reading = Reading(source=r.source, engine=r.engine, path=r.path, config=dict(r.config),
                               includes_bonus=r.includes_bonus, version=r.version, conventions=dict(r.conventions))
        return r

    def finish(self) -> Reading:
        r = self.take()
        if self._notes_dropped:
            r.notes.append(note(self.path, r.notes[-1]["line"] if r.notes else 1,
                                f"{self._notes_dropped} more lines skipped (not listed)"))
        return r
