"""The account of one reading: what was read, what was checked with which numbers, what
could not be checked and why (issue 28 item 1: a bare "No violations" never closes an
engine input).

    acc = Account(path, source)          # one per input file
    for reading in chunks: acc.add(reading)   # streamed: counters only, no windows kept
    doc = acc.finish(findings)           # a JSON-able dict; render(doc) -> text lines

The identities listed here are the ones the SA7xx rules check; the account only shows
the numbers (the first window's arithmetic and the pooled figures) and takes each
identity's verdict from the rules' findings, so the two can never disagree.
"""
from __future__ import annotations

# identity id -> (what it says, rule codes that judge it)
IDENTITIES = {
    "rate": ("acceptance rate = accepted / drafted", ("SA703", "SA726")),
    "bounds": ("accepted <= drafted and every rate <= 1", ("SA701", "SA702")),
    "len": ("mean acceptance length = 1 + accepted / verify steps", ("SA704", "SA705", "SA726")),
    "len_pos": ("mean acceptance length = 1 + sum of the per-position rates", ("SA705",)),
    "pos": ("per-position rates non-increasing (per verify step)", ("SA721",)),
    "k": ("drafted <= draft length x verify steps", ("SA722",)),
    "sglang_rate": ("SGLang accept rate = accept len / D (bonus counted) or (accept len - 1) / (D - 1)",
                    ("SA720",)),
    "ts_rate": ("TokenSpeed accept_rate = (avg_accept_len - 1) / k, one whole k for every line", ("SA732",)),
    "hist": ("histogram: sum(h) = verify steps, sum(i*h_i) = accepted", ("SA723",)),
    "monotone": ("cumulative counters never go down", ("SA724",)),
    "emitted": ("V0: accepted drafts <= emitted - verify steps (what the emitted tokens can hold)", ("SA729",)),
    "output": ("output tokens >= verify steps + accepted drafts", ("SA731",)),
    "window": ("accepted and drafted throughputs cover the line's own window", ("SA730",)),
    "throughput": ("accept length agrees with throughput at one concurrency", ("SA708", "SA709", "SA710")),
    "collapse": ("drafting continues only while something is accepted", ("SA727",)),
    "ranks": ("ranks of one server agree", ("SA707", "SA711")),
}
FIGURES = (  # Window attribute -> the name shown
    ("accept_len", "mean acceptance length"), ("accept_rate", "acceptance rate"), ("drafts", "verify steps"),
    ("draft_tokens", "drafted tokens"), ("accepted_tokens", "accepted drafts"), ("k", "draft length"),
    ("concurrency", "running requests"), ("gen_tps", "generation throughput (tokens/s)"),
)
# why an engine generates without drafting, by engine (the account's verdict on zero spec counters)
NO_DRAFTING = {
    "llamacpp": "llama-server drafts with a draft model only under --spec-type, e.g. draft-simple: "
                "-md alone loads the drafter and never drafts",
    "vllm": "an ngram drafter finds no match in these prompts, or the requests ran without drafts",
    None: "speculative decoding not configured for these requests",
}
MAX_REMARKS = 5   # a file's rule remarks shown in full; the rest counted
SEED_DEPTH = ("no depth counter in this output: an accept-depth figure (e.g. the seed's 'depth 7.00') needs "
              "--reported-accept-depth (specaudit estimate) or a trace")


def _shown(x) -> str:
    """A number as the account shows it: an integer as one, else 4 significant digits; ? when missing."""
    if x is None:
        return "?"
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x)}"
    return f"{x:.4g}"


_INF = float("inf")


def _all_finite(*xs) -> bool:
    """Every x a finite number (the hot path of the account: no generator, no isfinite call)."""
    for x in xs:
        if x is None or x.__class__ not in (float, int) or x != x or x == _INF or x == -_INF:
            return False
    return True


def _numbers(ident: str, w, cfg: dict) -> str | None:
    """The arithmetic of one identity on one window, or None when it does not apply."""
    a, d, s, L, r = w.accepted_tokens, w.draft_tokens, w.drafts, w.accept_len, w.accept_rate
    if ident == "rate" and _all_finite(a, d, r) and d > 0:
        return f"{_shown(a)} / {_shown(d)} = {a / d:.4f} vs printed {r:.4g}"
    if ident == "bounds" and (_all_finite(a, d) or _all_finite(r)):
        parts = []
        if _all_finite(a, d):
            parts.append(f"accepted {_shown(a)} <= drafted {_shown(d)}")
        if _all_finite(r):
            parts.append(f"rate {r:.4g} <= 1")
        return ", ".join(parts)
    if ident == "len" and _all_finite(a, s, L) and s > 0 and not w.extra.get("drafts_derived") \
            and not w.extra.get("accepted_not_prefix") and not w.extra.get("accept_len_derived"):
        return f"1 + {_shown(a)} / {_shown(s)} = {1 + a / s:.3f} vs printed {L:.3g}"
    if ident == "len_pos" and _all_finite(L) and w.per_pos and w.per_pos_kind == "verify_steps":
        if w.extra.get("accept_len_derived"):   # the length is the accepted counter's: two counters compared
            return (f"1 + sum({', '.join(f'{p:.3g}' for p in w.per_pos[:8])}) = {1 + sum(w.per_pos):.3f} vs "
                    f"1 + accepted / verify steps = {L:.3f}")
        return f"1 + sum({', '.join(f'{p:.3g}' for p in w.per_pos[:8])}) = {1 + sum(w.per_pos):.3f} vs printed {L:.3g}"
    if ident == "pos" and w.per_pos and len(w.per_pos) > 1 and w.per_pos_kind == "verify_steps":
        return " >= ".join(f"{p:.3g}" for p in w.per_pos[:8])
    if ident == "k":
        k = w.k or cfg.get("num_spec_tokens")
        if _all_finite(d, s, k) and s > 0:
            return f"{_shown(d)} <= {_shown(k)} x {_shown(s)} = {_shown(k * s)}"
    if ident == "sglang_rate" and w.engine == "sglang" and _all_finite(L, r) and not w.extra.get("request"):
        D = cfg.get("num_draft_tokens")
        if D:
            return f"accept len {L:.2f}, D = {D}: {L / D:.3f} or {(L - 1) / max(D - 1, 1):.3f} vs printed {r:.2f}"
        if "rate_formula" not in w.extra:
            return f"accept len {L:.2f}, accept rate {r:.2f}, D unknown (no server_args line)"
        f = w.extra["rate_formula"]
        return (f"accept len {L:.2f}, accept rate {r:.2f}, D unknown (no server_args line): "
                f"{'fits ' + f if f else 'no whole D fits either formula'}")
    if ident == "ts_rate" and w.engine == "tokenspeed" and _all_finite(L, r):
        if w.k:
            return f"({L:.2f} - 1) / {w.k} = {(L - 1) / w.k:.3f} vs printed {r:.2f}"
        return f"avg_accept_len {L:.2f}, accept_rate {r:.2f}: no whole k fits every line"
    if ident == "hist" and w.histogram:
        h = w.histogram
        return f"sum(h) = {_shown(sum(h))} vs steps {_shown(s)}, " \
               f"sum(i*h_i) = {_shown(sum(i * x for i, x in enumerate(h)))} vs accepted {_shown(a)}"
    if ident == "monotone" and w.kind == "cumulative" and (_all_finite(a) or _all_finite(d)):
        return f"accepted {_shown(a)}, drafted {_shown(d)} (since start-up)"
    if ident == "emitted" and w.extra.get("emitted") is not None and _all_finite(a, s):
        e = w.extra["emitted"]
        return f"accepted {_shown(a)} vs emitted {_shown(e)} - verify steps {_shown(s)} = {_shown(e - s)}"
    if ident == "output" and w.extra.get("output_tokens") is not None and _all_finite(a, s) \
            and not w.extra.get("drafts_derived"):
        return (f"output {_shown(w.extra['output_tokens'])} vs steps {_shown(s)} + accepted {_shown(a)} "
                f"= {_shown(s + a)}")
    if ident == "window" and w.extra.get("acc_tps") and w.extra.get("dr_tps") and _all_finite(a, d):
        return (f"{_shown(a)} / {w.extra['acc_tps']:.2f} = {a / w.extra['acc_tps']:.1f} s, "
                f"{_shown(d)} / {w.extra['dr_tps']:.2f} = {d / w.extra['dr_tps']:.1f} s")
    if ident == "throughput" and w.step_rate is not None:
        return (f"{_shown(w.gen_tps)} tokens/s / ({_shown(w.concurrency)} requests x {L:.2f}) = {w.step_rate:.3g} "
                "verify steps/s per request")
    if ident == "collapse" and _all_finite(a, d) and d > 0:
        return f"{_shown(a)} of {_shown(d)} drafted accepted ({a / d:.1%})"
    if ident == "ranks" and w.rank and _all_finite(L):
        return f"rank {w.rank}: accept length {_shown(L)}"
    return None


def _applicable(w, cfg: dict) -> list:
    """The identities whose arithmetic _numbers() can give on window w: the same
    conditions, evaluated once per window without building any text (the account's hot
    path: every window after an identity's first only counts)."""
    a, d, s, L, r = w.accepted_tokens, w.draft_tokens, w.drafts, w.accept_len, w.accept_rate
    x = w.extra
    ok_a, ok_d, ok_s, ok_L, ok_r = _all_finite(a), _all_finite(d), _all_finite(s), _all_finite(L), _all_finite(r)
    out = []
    if ok_a and ok_d:
        if ok_r and d > 0:
            out.append("rate")
        out.append("bounds")
        if d > 0:
            out.append("collapse")
        if x and x.get("acc_tps") and x.get("dr_tps"):
            out.append("window")
    elif ok_r:
        out.append("bounds")
    derived = x.get("drafts_derived") if x else None
    if ok_a and ok_s and ok_L and s > 0 and not derived and not (x and (x.get("accepted_not_prefix")
                                                                      or x.get("accept_len_derived"))):
        out.append("len")
    pp = w.per_pos
    if pp and w.per_pos_kind == "verify_steps":
        if ok_L:
            out.append("len_pos")
        if len(pp) > 1:
            out.append("pos")
    if ok_d and ok_s and s > 0 and _all_finite(w.k or cfg.get("num_spec_tokens")):
        out.append("k")
    if ok_L and ok_r:
        if w.engine == "sglang" and not (x and x.get("request")):
            out.append("sglang_rate")
        elif w.engine == "tokenspeed":
            out.append("ts_rate")
    if w.histogram:
        out.append("hist")
    if w.kind == "cumulative" and (ok_a or ok_d):
        out.append("monotone")
    if x and ok_a and ok_s:
        if x.get("emitted") is not None:
            out.append("emitted")
        if x.get("output_tokens") is not None and not derived:
            out.append("output")
    if w.step_rate is not None:
        out.append("throughput")
    if w.rank and ok_L:
        out.append("ranks")
    return out


class Account:
    """Counters of what a file held; streamed readings are added one chunk at a time."""

    def __init__(self, path, source: str, engine: str | None = None, what: str | None = None):
        self.path, self.source, self.engine, self.what = str(path), source, engine, what
        self.versions: dict = {}
        self.engines: dict = {}
        self.windows = 0
        self.first_line = self.last_line = None
        # what a window's number counts: a log's or a scrape file's lines; a Prometheus range's windows,
        # numbered in time order (their end times kept: a range has no lines)
        self.unit = "window" if source == "prometheus" else "line"
        self.first_time = self.last_time = None
        self.skipped = 0
        self.first_skipped: dict | None = None
        self.figures: dict = {}       # name -> [n, min, max]
        self.per_pos = 0
        self.histograms = 0
        self.derived_steps = 0
        self.derived_len = 0          # windows whose accept length the reader computed (none exported)
        self.ranks: set = set()
        self.kinds: dict = {}
        self.cfg: dict = {}
        self.idents: dict = {}        # id -> [windows it applies to, first example "line N: ..."]
        self.extra_notes: list = []
        self.empty_why = None         # why an engine's output holds no figures, when its reader knows
        self.remarks: list = []       # what rules left unflagged and why (reading.remarks), the first few
        self.more_remarks = 0
        self.pooled: dict = {}        # interval windows' drafts and drafted tokens, summed
        self.pooled_n = 0

    def add(self, reading) -> None:
        self.engine = self.engine or reading.engine
        self.cfg.update({k: v for k, v in reading.config.items() if isinstance(v, (int, float, str, bool))})
        miss = reading.config.get("missing_series")
        if miss and not any("series absent" in n for n in self.extra_notes):
            self.note(f"series absent from this scrape: {', '.join(miss)}; judged on the series it holds")
        for n in reading.notes:
            self.skipped += 1
            if self.first_skipped is None:
                self.first_skipped = {"line": n["line"], "reason": n["reason"], "text": n["text"][:120]}
        idents, cfg = self.idents, reading.config
        for w in reading.windows:
            self.windows += 1
            if w.line is not None:
                self.first_line = w.line if self.first_line is None else min(self.first_line, w.line)
                self.last_line = w.line if self.last_line is None else max(self.last_line, w.line)
            if self.unit == "window" and w.time:
                self.first_time = w.time if self.first_time is None else min(self.first_time, w.time)
                self.last_time = w.time if self.last_time is None else max(self.last_time, w.time)
            v = w.version or reading.version
            if v:
                self.versions[v] = self.versions.get(v, 0) + 1
            if w.engine:
                self.engines[w.engine] = self.engines.get(w.engine, 0) + 1
            self.kinds[w.kind] = self.kinds.get(w.kind, 0) + 1
            if w.rank and len(self.ranks) < 64:
                self.ranks.add(w.rank)
            figs = self.figures
            for attr, _name in FIGURES:
                x = getattr(w, attr)
                if x is None or x.__class__ not in (float, int) or x != x or x == _INF or x == -_INF:
                    continue
                f = figs.get(attr)
                if f is None:
                    figs[attr] = [1, x, x]
                    continue
                f[0] += 1
                if x < f[1]:
                    f[1] = x
                elif x > f[2]:
                    f[2] = x
            if w.extra.get("accept_len_derived"):
                self.derived_len += 1
            if w.extra.get("drafts_derived"):
                self.derived_steps += 1
            elif _all_finite(w.drafts, w.draft_tokens) and (w.kind == "interval" or self.windows == 1):
                self.pooled["drafts"] = self.pooled.get("drafts", 0) + w.drafts
                self.pooled["draft_tokens"] = self.pooled.get("draft_tokens", 0) + w.draft_tokens
                self.pooled_n += 1
            self.per_pos += bool(w.per_pos)
            self.histograms += bool(w.histogram)
            for ident in _applicable(w, cfg):
                e = idents.get(ident)
                if e is not None:          # the example is kept: count the window only
                    e[0] += 1
                    continue
                num = _numbers(ident, w, cfg)
                if num is not None:
                    idents[ident] = [1, (f"{self.unit} {w.line}: " if w.line else "") + num]

    def merge(self, o: Account) -> None:
        """Add another range's account of the same file (the parallel audit)."""
        for d, od in ((self.versions, o.versions), (self.engines, o.engines), (self.kinds, o.kinds)):
            for k, v in od.items():
                d[k] = d.get(k, 0) + v
        self.windows += o.windows
        for attr, pick in (("first_line", min), ("last_line", max)):
            a, b = getattr(self, attr), getattr(o, attr)
            setattr(self, attr, b if a is None else (a if b is None else pick(a, b)))
        self.skipped += o.skipped
        if o.first_skipped and (self.first_skipped is None or o.first_skipped["line"] < self.first_skipped["line"]):
            self.first_skipped = o.first_skipped
        for k, f in o.figures.items():
            g = self.figures.setdefault(k, [0, f[1], f[2]])
            g[0] += f[0]
            g[1], g[2] = min(g[1], f[1]), max(g[2], f[2])
        self.per_pos += o.per_pos
        self.histograms += o.histograms
        self.derived_steps += o.derived_steps
        self.derived_len += o.derived_len
        for k, v in o.pooled.items():
            self.pooled[k] = self.pooled.get(k, 0) + v
        self.pooled_n += o.pooled_n
        self.ranks |= o.ranks
        self.cfg.update(o.cfg)
        for k, (n, ex) in o.idents.items():
            e = self.idents.setdefault(k, [0, ex])
            e[0] += n
        self.extra_notes += [n for n in o.extra_notes if n not in self.extra_notes]
        for text in o.remarks:
            self.remark(text)
        self.more_remarks += o.more_remarks

    def note(self, text: str) -> None:
        self.extra_notes.append(text)

    def remark(self, text: str) -> None:
        """A rule's word on what it looked at and left unflagged (the first MAX_REMARKS kept)."""
        if text in self.remarks:
            return
        if len(self.remarks) < MAX_REMARKS:
            self.remarks.append(text)
        else:
            self.more_remarks += 1

    def _all_zero(self) -> bool:
        """Counters read, and every one 0 on every window (drafts, drafted and accepted tokens)."""
        got = [self.figures[a] for a in ("drafts", "draft_tokens", "accepted_tokens") if a in self.figures]
        return bool(got) and all(f[1] == 0 and f[2] == 0 for f in got)

    def _generated_tps(self):
        """The highest generation throughput read (tokens/s), or None when none above 0."""
        f = self.figures.get("gen_tps")
        return f[2] if f and f[2] > 0 else None

    def _not_checkable(self) -> list:
        if not self.windows:
            return ["every identity: this output holds no spec-decoding figures", SEED_DEPTH]
        out = []
        f = self.figures
        if "drafts" not in f or self.derived_steps == f["drafts"][0]:
            why = ("no verify-step count in this output: mean acceptance length = 1 + accepted / verify steps "
                   "cannot be checked")
            if self.derived_steps:
                why += " (the reader derives verify steps from that very length)"
            out.append(why)
        if self.derived_len and "len" not in self.idents:
            out.append("no mean acceptance length exported: it is derived here as 1 + accepted / verify steps, "
                       "so that identity has no second figure to check (the per-position counters, where "
                       "exported, are checked against it)")
        miss = [n for a, n in (("accepted_tokens", "accepted"), ("draft_tokens", "drafted")) if a not in f]
        if miss:
            out.append(f"no {' or '.join(miss)} token count: the acceptance rate cannot be recomputed from counts")
        if "k" not in f and not self.cfg.get("num_spec_tokens") and not self.cfg.get("num_draft_tokens"):
            out.append("no draft length (k) in this output: drafted <= k x verify steps cannot be checked "
                       "(SGLang: keep the server_args line; vLLM: the per-position list gives k)")
        if "concurrency" not in f:
            out.append("no running-request count: throughput cannot be compared at one concurrency "
                       "(SA708-SA710 need windows with concurrency)")
        elif "gen_tps" not in f:
            out.append("no generation throughput: accept length cannot be tested against throughput")
        if self.cfg.get("counters_at") == "request_end":
            from specaudit.invariants.sa7xx_spans import MIN_SPANS, SPAN_S
            out.append(f"accept length against throughput window by window: these counters move only when a "
                       f"request ends, so a scrape window holds a whole number of requests; SA708-SA710 compare "
                       f"spans of at least {SPAN_S:g} s instead (at least {MIN_SPANS} spans of one concurrency, "
                       f"i.e. minutes of steady load, before anything is judged)")
        if self.windows == 1:
            out.append("one window only: shifts between windows cannot be seen")
        out.append(SEED_DEPTH)
        return out

    def finish(self, findings=()) -> dict:
        hits: dict = {}
        sev: dict = {}
        for fd in findings:
            hits[fd.code] = hits.get(fd.code, 0) + 1
            sev[fd.code] = fd.severity
        checked = []
        for ident, (what, codes) in IDENTITIES.items():
            if ident not in self.idents or (ident == "ranks" and len(self.ranks) < 2):
                continue
            n, example = self.idents[ident]
            broken = {c: hits[c] for c in codes if c in hits}
            checked.append({"identity": what, "rules": list(codes), "windows": n, "example": example,
                            "result": (("broken: " if any(sev[c] == "error" for c in broken) else "flagged: ")
                                       + ", ".join(f"{c} x{k}" for c, k in broken.items())
                                       if broken else f"holds on all {n} window{'s' * (n != 1)}")})
        figures = {(name + " (derived: 1 + accepted / verify steps)"
                    if attr == "accept_len" and self.derived_len == f[0] else name):
                   {"windows": f[0], "min": f[1], "max": f[2]}
                   for attr, name in FIGURES if (f := self.figures.get(attr))}
        d, s = self.pooled.get("draft_tokens"), self.pooled.get("drafts")
        if d and s and not self.derived_steps:
            figures["drafted per verify step"] = {"windows": self.pooled_n, "min": round(d / s, 4),
                                                  "max": round(d / s, 4)}
        if self.per_pos:
            figures["per-position rates"] = {"windows": self.per_pos}
        if self.histograms:
            figures["acceptance histogram"] = {"windows": self.histograms}
        errors = sum(1 for fd in findings if fd.severity == "error")
        warns = sum(1 for fd in findings if fd.severity != "error")
        if not self.windows:
            verdict = (f"no speculative figures in it: nothing to judge "
                       f"({self.empty_why or 'speculative decoding off, or not exported'})")
        elif errors:
            verdict = f"{errors} finding{'s contradict' if errors != 1 else ' contradicts'} the figures (listed below)"
        elif self._all_zero() and (self.cfg.get("tokens_generated") or self._generated_tps()):
            # tokens generated, none drafted: the server ran without speculative decoding
            gen = (f"{_shown(self.cfg['tokens_generated'])} tokens since start-up"
                   if self.cfg.get("tokens_generated") else f"tokens (up to {_shown(self._generated_tps())}/s)")
            verdict = (f"every speculative counter is 0 while the server generated {gen}: it generated without "
                       f"drafting, nothing to judge ({NO_DRAFTING.get(self.engine, NO_DRAFTING[None])})")
        elif self._all_zero():
            # the identities hold on 0 = 0 by arithmetic alone: saying they were checked would claim too much
            verdict = ("every speculative counter is 0 in what was read (nothing drafted: an idle server, or a "
                       "range before any request): nothing to judge yet; read it again after requests ran")
        elif checked:
            verdict = (f"nothing contradicts the {len(checked)} identit{'ies' if len(checked) != 1 else 'y'} "
                       "checked; see what could not be checked")
            if warns:
                verdict += (f"; {warns} warning{'s name' if warns != 1 else ' names'} a definition, a convention "
                            "or a skipped line (listed below)")
        else:
            verdict = "read, but no identity applies to these figures alone: see what could not be checked"
        return {
            "file": self.path, "source": self.source, "what": self.what,
            "engine": max(self.engines, key=self.engines.get) if self.engines else self.engine,
            "engines": dict(self.engines),
            "versions": dict(self.versions) or ({f"{self.cfg['engine_version']} (its start-up line)": 0}
                                                if self.cfg.get("engine_version") and not self.windows
                                                else {"not inferable from this output": self.windows}),
            "windows": self.windows, "lines": [self.first_line, self.last_line], "unit": self.unit,
            "times": [self.first_time, self.last_time] if self.first_time else None,
            "ranks": sorted(map(str, self.ranks)),
            "kinds": dict(self.kinds), "skipped": self.skipped, "first_skipped": self.first_skipped,
            "config": {k: v for k, v in self.cfg.items() if not str(k).startswith("_")},
            "figures": figures, "checked": checked, "not_checkable": self._not_checkable(),
            "notes": list(self.extra_notes) + list(self.remarks)
            + ([f"{self.more_remarks} more like these"] if self.more_remarks else []), "verdict": verdict,
        }


def render(doc: dict) -> list[str]:
    """The account as text lines (the `check` report prints them before the findings)."""
    vers = ", ".join(f"{v} ({n})" if len(doc["versions"]) > 1 else v for v, n in doc["versions"].items())
    out = [f"{doc['file']}: {doc.get('what') or doc['source']} [--source {doc['source']}], engine {doc['engine']}, "
           f"version {vers}"]
    lines = doc["lines"]
    if doc.get("unit", "line") != "line":   # a Prometheus range: its windows' end times, not line numbers
        t = doc.get("times")
        span = (f" (ending {t[0]}{'' if t[0] == t[1] else ' to ' + t[1]})" if t else "")
    else:
        span = f" (lines {lines[0]}-{lines[1]})" if lines and lines[0] is not None else ""
    read = f"  read {doc['windows']} window{'s' * (doc['windows'] != 1)}{span}"
    if doc["ranks"]:
        read += f" over {len(doc['ranks'])} rank{'s' * (len(doc['ranks']) != 1)} ({', '.join(doc['ranks'][:6])})"
    if doc["skipped"]:
        fs = doc["first_skipped"]
        read += f"; skipped {doc['skipped']} (first: line {fs['line']}: {fs['reason']})"
    else:
        read += "; skipped none"
    out.append(read)
    if doc["figures"]:
        figs = []
        for name, f in doc["figures"].items():
            if "min" in f:
                rng = _shown(f["min"]) if f["min"] == f["max"] else f"{_shown(f['min'])}..{_shown(f['max'])}"
                figs.append(f"{name} {rng} ({f['windows']})")
            else:
                figs.append(f"{name} ({f['windows']})")
        out.append("  figures: " + "; ".join(figs))
    shape = {k: doc["config"][k] for k in ("num_spec_tokens", "num_steps", "topk", "num_draft_tokens", "dp_size")
             if k in doc["config"]}
    if shape:
        out.append("  draft shape: " + ", ".join(f"{k} {v}" for k, v in shape.items()))
    for c in doc["checked"]:
        out.append(f"  checked: {c['identity']} [{'/'.join(c['rules'])}]: {c['example']}; {c['result']}")
    for n in doc["not_checkable"]:
        out.append(f"  not checkable: {n}")
    for n in doc["notes"]:
        out.append(f"  note: {n}")
    out.append(f"  verdict: {doc['verdict']}")
    return out
