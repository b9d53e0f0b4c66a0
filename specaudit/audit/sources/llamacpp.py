"""llama.cpp logs: llama-server's per-slot acceptance lines, the per-drafter statistics
lines, the per-round verbose lines and the llama-speculative / llama-lookup summary.

Formats by version (the words on the line tell them apart):

    old        slot print_timing: ... | draft acceptance rate = 0.81944 (  118 accepted /   144 generated)
    PR 23279   ... | draft acceptance = 0.74482 (24673 accepted / 33126 generated)
    mean len   ... | draft acceptance = 0.69048 (   58 accepted /    84 generated), mean len =  3.76
    PR 24536   ... | draft acceptance = 0.64479 (  167 accepted /   259 generated), mean acceptance length =
               2.92, acceptance rate per position = (0.805, 0.632, 0.483)
    statistics statistics     draft-eagle3: #calls(b,g,a) =    1     87     87, #gen drafts =     87,
               #acc drafts =    70, #gen tokens =    259, #acc tokens =   167, #mean acc len = 2.92,
               #acc rate/pos = (0.805, 0.632, 0.483), dur(b,g,a) = ...   (cumulative per drafter)
    per round  slot update_slots: id  3 | task 0 | accepted 3/4 draft tokens, new n_tokens = 702
    summary    n_draft = 4 / n_predict = 1025 / n_drafted = 712 / n_accept = 410 / accept = 57.584%

In the vocabulary: "generated" = drafted tokens sent to verification (since PR 14104 drafts
below --draft-min are not counted), "accepted" = accepted draft tokens (bonus excluded),
"#gen drafts" = verify steps. Mean acceptance length = 1 + accepted / verify steps (the
bonus counted, PR 24536); per-position rates are per verify step (unconditional).
"""
from __future__ import annotations

import re

from specaudit.audit.sources.reading import LineParser, Reading, Window

NUM = r"(-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|-?inf)"
SLOT_RE = re.compile(r"draft acceptance(?P<old> rate)? = " + NUM + r" \(\s*" + NUM + r" accepted /\s*" + NUM
                     + r" generated\)(?P<rest>.*)$")
MEAN_RE = re.compile(r"mean (?:acceptance length|len) =\s*(\d+\.\d\d)(?![\d.])")  # two decimals, or cut
POS_RE = re.compile(r"acceptance rate per position = \((?P<list>[^)]*)\)")
SLOT_ID_RE = re.compile(r"\bid\s+(?P<id>\d+)\s*\|\s*task\s+(?P<task>-?\d+)")
STATS_RE = re.compile(r"statistics\s+(?P<name>[\w.-]+):\s*#calls\(b,g,a\)\s*=\s*(?P<calls>[\d\s]+),"
                      r"\s*#gen drafts\s*=\s*"
                      + NUM + r",\s*#acc drafts\s*=\s*" + NUM + r",\s*#gen tokens\s*=\s*" + NUM
                      + r",\s*#acc tokens\s*=\s*" + NUM + r"(?P<rest>.*)$")
STATS_MEAN_RE = re.compile(r"#mean acc len\s*=\s*(\d+\.\d\d)(?![\d.])")
STATS_POS_RE = re.compile(r"#acc rate/pos\s*=\s*\((?P<list>[^)]*)\)")
ROUND_RE = re.compile(r"accepted (?P<a>-?\d+)/(?P<d>-?\d+) draft tokens")
SUMMARY_RE = re.compile(r"^\s*(?P<key>n_draft|n_predict|n_drafted|n_accept|accept)\s*=\s*(?P<val>" + NUM[1:-1]
                        + r")\s*(?P<pct>%)?")

RATE_CONV = ("accepted / generated, where generated counts drafts sent to verification (PR 14104; before it drafts "
             "skipped by --draft-min were counted too)")
LEN_CONV = "1 + accepted draft tokens / drafts verified: counts the bonus token (PR 24536)"
POS_CONV = "accepted at position i / drafts verified (unconditional, non-increasing in i at a fixed draft length)"


# substrings every line this reader uses holds (Lines' prefilter: other lines are never decoded);
# "accept" covers the slot, round and summary accept lines, "n_draft" / "n_predict" the summary
MARKERS = (b"accept", b"#gen drafts", b"n_draft", b"n_predict", b"print_timing", b"listening on http",
           b"loading draft model")
# llama-server's start-up: the line saying it listens (this build: `llama_server: listening on
# http://...`; 2025 builds: `main: server is listening on http://... - starting the main loop`)
# and the drafter it loaded (`... loading draft model '<path>'`)
LISTEN_RE = re.compile(r"(?:llama_server: listening on|main: server is listening on) https?://")
DRAFT_MODEL_RE = re.compile(r"loading draft model '(?P<path>[^']*)'")


def looks_like_line(line: str) -> bool:
    return (("draft acceptance" in line and "accepted /" in line) or "#gen drafts" in line
            or ("listening on http" in line and bool(LISTEN_RE.search(line)))
            or ("print_timing" in line and ("eval time =" in line or "total time =" in line))
            or ("draft tokens" in line and bool(ROUND_RE.search(line)))
            or line.lstrip().startswith("n_drafted ") or line.lstrip().startswith("n_drafted="))


def looks_like(text: str) -> bool:
    return any(looks_like_line(ln) for ln in text.splitlines())


def _finite_float(s):
    x = float(s)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(s)
    return x


def _list(s: str):
    out = []
    for tok in s.split(","):
        tok = tok.strip()
        if tok:
            out.append(_finite_float(tok))
    return out


class Parser(LineParser):
    source = "llamacpp-log"
    engine = "llamacpp"

    def __init__(self, path: str):
        super().__init__(path)
        self.block: dict = {}
        self.block_line = None
        self.header = None   # (slot, task, line) of a `slot print_timing: id N | task T |` line with nothing after
        self.listening = False   # llama-server's start-up line seen
        self.timings = 0         # request lines seen (print_timing)
        self.finished = 0        # requests finished (their print_timing `total time =` line)

    @property
    def recognised(self) -> str | None:
        """A llama-server log of start-up lines only (stream.NoFigures: reported with its account,
        exit 0), None otherwise; why_empty says why it holds no figures."""
        return "llama.cpp server log (start-up lines only)" if self.listening and not self.timings else None

    @property
    def why_empty(self) -> str | None:
        d = self.reading.config.get("draft_model")
        if self.recognised is None:
            if not (self.finished and d):
                return None
            # requests ran with a drafter loaded, and not one acceptance line: nothing was drafted
            return (f"a draft model loaded ({d}) and {self.finished} request{'s' * (self.finished != 1)} "
                    "finished, but no draft acceptance line: nothing was drafted (llama-server drafts with a "
                    "draft model only under --spec-type, e.g. draft-simple: -md alone loads it and never drafts)")
        spec = (f"a draft model loaded ({d}), but " if d else
                "no draft model loaded (speculative decoding off unless the build drafts without one), and ")
        return (f"{spec}no request finished while it logged (llama-server logs a slot's draft acceptance when "
                "its request ends)")

    def _close_block(self):
        b, line = self.block, self.block_line
        self.block, self.block_line = {}, None
        if "n_drafted" not in b or "n_accept" not in b:
            return
        w = Window(line=line, engine="llamacpp", kind="cumulative", version="llama-speculative summary",
                   draft_tokens=b["n_drafted"], accepted_tokens=b["n_accept"],
                   text=", ".join(f"{k} = {v:g}" for k, v in b.items()))
        if "accept" in b:
            w.accept_rate = b["accept"] / 100.0
            w.extra["printed_rate"] = (w.accept_rate, 0.0000051)  # printed in % with three decimals
        if "n_draft" in b:
            w.k = int(b["n_draft"])
        if "n_predict" in b:
            w.extra["generated_tokens"] = b["n_predict"]
        w.conventions = {"accept_rate": "n_accept / n_drafted (drafted tokens the target verified)"}
        self.reading.windows.append(w)

    def feed(self, i: int, raw: str) -> None:
        sm = SUMMARY_RE.match(raw) if "=" in raw and raw.lstrip()[:2] in ("n_", "ac") else None
        if sm:
            if self.block_line is None:
                self.block_line = i
            key = sm.group("key")
            if key in self.block:  # a second summary starts
                self._close_block()
                self.block_line = i
            try:
                self.block[key] = _finite_float(sm.group("val"))
            except ValueError:
                self.skip(i, f"llama.cpp summary value {sm.group('val')[:40]!r} is not a finite number", raw)
            return
        if self.block:
            self._close_block()
        try:
            self._feed(i, raw)
        except ValueError as e:
            self.skip(i, f"llama.cpp line with a value that is not a finite number ({str(e)[:40]})", raw)

    def _feed(self, i: int, raw: str) -> None:
        if "print_timing" in raw:
            self.timings += 1
            if "total time =" in raw:
                self.finished += 1
        elif "listening on http" in raw and LISTEN_RE.search(raw):
            self.listening = True
            return
        elif "loading draft model" in raw:
            m = DRAFT_MODEL_RE.search(raw)
            if m:
                self.reading.config["draft_model"] = m.group("path")
            return
        if "print_timing" in raw and "accept" not in raw:
            # the older server layout: the slot header stands on its own line and the timing
            # and draft acceptance lines follow without it
            sid = SLOT_ID_RE.search(raw)
            if sid and not raw[sid.end():].strip(" |\t"):
                self.header = (int(sid.group("id")), int(sid.group("task")), i)
            return
        if "accepted" not in raw and "#gen drafts" not in raw:
            return  # most lines of a server log (fast path)
        m = SLOT_RE.search(raw)
        if m:
            w = Window(line=i, engine="llamacpp", text=raw.strip()[:300], kind="interval")
            w.accept_rate = _finite_float(m.group(2))
            w.accepted_tokens, w.draft_tokens = _finite_float(m.group(3)), _finite_float(m.group(4))
            w.extra["printed_rate"] = (w.accept_rate, 0.0000051)  # five decimals
            sid = SLOT_ID_RE.search(raw)
            if sid:
                w.extra["slot"], w.extra["task"] = int(sid.group("id")), int(sid.group("task"))
            elif self.header is not None and i - self.header[2] <= 8:
                w.extra["slot"], w.extra["task"] = self.header[0], self.header[1]
                w.extra["header_line"] = self.header[2]
            rest = m.group("rest")
            mm = MEAN_RE.search(rest)
            pm = POS_RE.search(rest)
            if ("mean" in rest and not mm) or ("per position" in rest and not pm):
                self.skip(i, "truncated llama.cpp draft acceptance line", raw)
                return
            w.conventions = {"accept_rate": RATE_CONV}
            if m.group("old"):
                w.version = "before PR 23279 ('draft acceptance rate =')"
                if "header_line" in w.extra:
                    w.version += ", slot header on its own line"
            elif pm:
                w.version = "PR 24536 (mean acceptance length and per-position rates)"
            elif mm:
                w.version = "'mean len' variant"
            else:
                w.version = "PR 23279 ('draft acceptance =')"
            if mm:
                w.accept_len = _finite_float(mm.group(1))
                w.conventions["accept_len"] = LEN_CONV
                if w.accept_len > 1.005 and w.accepted_tokens > 0:
                    w.drafts = round(w.accepted_tokens / (w.accept_len - 1))
                    w.extra["drafts_derived"] = True
            if pm:
                w.per_pos = _list(pm.group("list"))
                w.per_pos_kind = "verify_steps"
                w.conventions["per_pos"] = POS_CONV
                w.k = len(w.per_pos)
            self.reading.windows.append(w)
            return
        m = STATS_RE.search(raw)
        if m:
            drafts, acc_drafts, gen_tok, acc_tok = (_finite_float(m.group(k)) for k in (3, 4, 5, 6))
            if drafts == 0 and gen_tok == 0 and acc_tok == 0:
                return  # a drafter that never drafted: nothing to audit
            w = Window(line=i, engine="llamacpp", kind="cumulative", rank=m.group("name"), text=raw.strip()[:300],
                       drafts=drafts, draft_tokens=gen_tok, accepted_tokens=acc_tok)
            w.extra["accepted_drafts"] = acc_drafts
            rest = m.group("rest")
            mm, pm = STATS_MEAN_RE.search(rest), STATS_POS_RE.search(rest)
            if ("#mean" in rest and not mm) or ("#acc rate/pos" in rest and not pm):
                self.skip(i, "truncated llama.cpp statistics line", raw)
                return
            w.version = "statistics with mean and per-position (PR 24536)" if mm else "statistics"
            w.conventions = {"accept_rate": RATE_CONV}
            if mm:
                w.accept_len = _finite_float(mm.group(1))
                w.conventions["accept_len"] = LEN_CONV
            if pm:
                # the statistics list is as long as the longest run accepted so far (common/
                # speculative.cpp resizes it on accept), not the draft length: no k from it
                w.per_pos = _list(pm.group("list"))
                w.per_pos_kind = "verify_steps"
                w.conventions["per_pos"] = POS_CONV
            self.reading.windows.append(w)
            return
        m = ROUND_RE.search(raw) if "draft tokens" in raw else None
        if m:
            a, d = float(m.group("a")), float(m.group("d"))
            w = Window(line=i, engine="llamacpp", kind="interval", text=raw.strip()[:300], drafts=1.0,
                       accepted_tokens=a, draft_tokens=d, version="per-round (verbose)")
            sid = SLOT_ID_RE.search(raw)
            if sid:
                w.rank = f"slot {sid.group('id')}"
            self.reading.windows.append(w)

    def finish(self) -> Reading:
        if self.block:
            self._close_block()
        return super().finish()

    def finalize(self, reading) -> None:
        reading.version = next((w.version for w in reading.windows if w.version), None)
        slots = {w.rank for w in reading.windows if w.rank and w.rank.startswith("slot ")}
        if len(slots) <= 1:
            for w in reading.windows:
                if w.rank and w.rank.startswith("slot "):
                    w.rank = None


def parse(text: str, path: str) -> Reading:
    p = Parser(path)
    for i, ln in enumerate(text.splitlines(), 1):
        p.feed(i, ln)
    return p.finish()
