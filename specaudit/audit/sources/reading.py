"""What every engine reader makes: the Window, the Reading, and the LineParser base.

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


A skipped or truncated line is a note (note(): rule SA700 reports them, a warning); a file
read with no usable figures is NoFigures. This module imports nothing of the readers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specaudit.stats import mean_se
from specaudit.trace.safe_io import InputError

MAX_NOTES = 1000                # notes kept per file (the rest are counted)


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
    # what a rule looked at and did not flag, with the reason (the account prints each as a note:
    # a split SA708 leaves to the throughput, say), filled while the rules run
    remarks: list[str] = field(default_factory=list)

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


class NoFigures(InputError):
    """A file read as `source` with no usable spec-decoding figures. `recognised` names the
    engine output it was recognised as by its own words (then `check` reports it with its
    account and exit 0: judged on what it holds), None when nothing says it is an engine's."""

    def __init__(self, path, reason, recognised=None, notes=(), why=None, config=None):
        super().__init__(path, reason)
        self.recognised = recognised
        self.notes = list(notes)
        self.why = why                    # why this engine output holds no figures, when the reader knows
        self.config = dict(config or {})  # what its lines said of the set-up (start-up lines)
        if why:   # the one-line error (ab, estimate) says why too; `check` shows it as the verdict
            Exception.__init__(self, f"{self.path}: {reason} ({why})" if self.path else f"{reason} ({why})")



def note(path, line, reason, text="") -> dict:
    """A skipped or truncated line (reported by rule SA700, a warning)."""
    return {"file": str(path), "line": line, "reason": reason, "text": text.strip()[:200]}



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
