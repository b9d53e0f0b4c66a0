"""Prometheus text scrapes: vLLM's and SGLang's spec-decoding series, and specaudit's own.

One scrape (`curl -s localhost:8000/metrics > scrape.txt`) gives cumulative counters:
one window over the server's lifetime. Several scrapes appended to one file give one
window per interval (counter deltas) and a throughput:

    while sleep 15; do echo "# scraped_at: $(date +%s)"; curl -s localhost:8000/metrics; done >> scrape.txt

A new scrape starts at a `# scraped_at: <unix seconds>` comment, or where a series repeats;
sample timestamps (`name{...} value 1700000000000`) also date a scrape.

Series read (per `engine` / `dp_rank` label, then summed):
    vLLM      vllm:spec_decode_num_drafts_total, ..._num_draft_tokens_total,
              ..._num_accepted_tokens_total, ..._num_accepted_tokens_per_pos_total{position},
              vllm:generation_tokens_total, vllm:num_requests_running
    SGLang    sglang:spec_accept_length, sglang:spec_accept_rate (gauges over the last
              log interval), sglang:gen_throughput, sglang:num_running_reqs
    TRT-LLM   trtllm_spec_decode_num_draft_tokens_total, ..._num_accepted_tokens_total
              (counters since PR 12545, gauges before), gauges trtllm_spec_decode_acceptance_length
              and _draft_overhead, per position (PR 12636) trtllm_spec_decode_drafted_tokens_total
              and _accepted_tokens_total{token_position} (denominator: drafted at that position),
              trtllm_speculative_config_info{spec_num_tokens}
    llama.cpp llamacpp:spec_decode_num_drafts_total, _num_draft_tokens_total,
              _num_accepted_tokens_total, _num_accepted_tokens_per_pos_total{position} (PR 26389)
    specaudit specaudit_verify_steps_total, _drafted_tokens_total, _accepted_tokens_total,
              _committed_tokens_total, _derived_*_total, _depth_accepted_total{depth},
              _generated_tokens_total, _running_requests, _reported_commit_length,
              _estimated_commit_length{,_lower,_upper}
"""
from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from specaudit.audit.sources.reading import Reading, Window
from specaudit.trace.safe_io import InputError

SCRAPED_AT_RE = re.compile(r"^#\s*scraped_at:\s*(?P<t>[0-9.]+)")
KNOWN_RE = re.compile(r"^(vllm:spec_decode_|sglang:spec_accept_|sglang:gen_throughput|trtllm_spec_decode_|"
                      r"llamacpp:spec_decode_|specaudit_(verify_steps|drafted_tokens|accepted_tokens|"
                      r"reported_commit_length))")

VLLM = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "generated": "vllm:generation_tokens_total",
    "running": "vllm:num_requests_running",
}
SGLANG = {
    "accept_len": "sglang:spec_accept_length",
    "accept_rate": "sglang:spec_accept_rate",
    "gen_tps": "sglang:gen_throughput",
    "running": "sglang:num_running_reqs",
}
SPECAUDIT = {
    "drafts": "specaudit_verify_steps_total",
    "draft_tokens": "specaudit_drafted_tokens_total",
    "accepted_tokens": "specaudit_accepted_tokens_total",
    "committed": "specaudit_committed_tokens_total",
    "derived_accepted": "specaudit_derived_accepted_tokens_total",
    "derived_committed": "specaudit_derived_committed_tokens_total",
    "per_pos": "specaudit_depth_accepted_total",
    "generated": "specaudit_generated_tokens_total",
    "running": "specaudit_running_requests",
    "reported": "specaudit_reported_commit_length",
    "estimated": "specaudit_estimated_commit_length",
    "estimated_low": "specaudit_estimated_commit_length_lower",
    "estimated_high": "specaudit_estimated_commit_length_upper",
}
TRTLLM = {
    "draft_tokens": "trtllm_spec_decode_num_draft_tokens_total",
    "accepted_tokens": "trtllm_spec_decode_num_accepted_tokens_total",
    "draft_tokens_gauge": "trtllm_spec_decode_num_draft_tokens",
    "accepted_tokens_gauge": "trtllm_spec_decode_num_accepted_tokens",
    "accept_len": "trtllm_spec_decode_acceptance_length",
    "per_pos": "trtllm_spec_decode_accepted_tokens_total",
    "per_pos_drafted": "trtllm_spec_decode_drafted_tokens_total",
    "running": "trtllm_num_requests_running",
}
LLAMACPP = {
    "drafts": "llamacpp:spec_decode_num_drafts_total",
    "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "llamacpp:spec_decode_num_accepted_tokens_total",
    "per_pos": "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
}
# the engine's generated-tokens counter (read for the account only, never differenced here for llama.cpp)
GENERATED = {"vllm": "vllm:generation_tokens_total", "llamacpp": "llamacpp:tokens_predicted_total"}
RANK_LABELS = ("engine", "dp_rank")
POS_LABELS = ("position", "depth", "token_position")
# engine -> (series names, required fields, per-position denominator)
FAMILIES = {
    "vllm": (VLLM, ("drafts", "draft_tokens", "accepted_tokens"), "verify_steps"),
    "sglang": (SGLANG, ("accept_len",), None),
    "trtllm": (TRTLLM, (), "drafted_at_position"),
    "llamacpp": (LLAMACPP, ("drafts", "draft_tokens", "accepted_tokens"), "verify_steps"),
    "specaudit": (SPECAUDIT, ("drafts", "draft_tokens", "accepted_tokens"), "verify_steps"),
}
PREFIX = {"vllm": "vllm:spec_decode", "sglang": "sglang:spec_accept", "trtllm": "trtllm_spec_decode",
          "llamacpp": "llamacpp:spec_decode", "specaudit": "specaudit_"}


# any series of an engine (a scrape without spec-decoding series is still that engine's)
ENGINE_SERIES_RE = re.compile(r"^(vllm:|sglang:|trtllm_|llamacpp:)[a-z_]+(\{| -?[0-9])")
ENGINE_OF = {"vllm:": "vLLM", "sglang:": "SGLang", "trtllm_": "TensorRT-LLM", "llamacpp:": "llama.cpp"}


def looks_like_line(line: str) -> bool:
    s = line.lstrip()
    if s.startswith("# TYPE ") or s.startswith("# HELP "):
        s = s.split(" ", 2)[2] if s.count(" ") >= 2 else ""
    return bool(KNOWN_RE.match(s)) or bool(ENGINE_SERIES_RE.match(s))


def looks_like(text: str) -> bool:
    return any(looks_like_line(ln) for ln in text.splitlines())


class Scrape:
    def __init__(self, t=None, line=None):
        self.t, self.line = t, line
        self.samples: dict[tuple, tuple[float, int]] = {}  # (name, labels) -> (value, line)


class Parser:
    """Prometheus text fed line by line: scrapes, then windows at finish()."""

    source = "prom-text"

    def __init__(self, path: str):
        self.path = path
        self.scrapes = [Scrape(line=1)]
        self.notes: list[dict] = []
        self.types: dict[str, tuple[str, int]] = {}  # family -> (TYPE, line)
        self.info: dict = {}
        self.reading = Reading(source="prom-text", engine="", path=path)  # chunking never applies

    def feed(self, i: int, raw: str) -> None:
        from specaudit.audit.sources.reading import MAX_NOTES, note
        s = raw.strip()
        if not s:
            return
        m = SCRAPED_AT_RE.match(s)
        if m:
            if self.scrapes[-1].samples or self.scrapes[-1].t is not None:
                self.scrapes.append(Scrape(line=i))
            try:
                self.scrapes[-1].t = float(m.group("t"))
            except ValueError:
                pass
            self.scrapes[-1].line = i
            return
        if s.startswith("# TYPE "):
            parts = s.split()
            if len(parts) >= 4:
                self.types[parts[2]] = (parts[3], i)
            return
        if s.startswith("#"):
            return
        try:
            fams = list(text_string_to_metric_families(s + "\n"))
        except Exception as e:  # the parser raises ValueError/IndexError/... on a bad line
            if len(self.notes) < MAX_NOTES:
                self.notes.append(note(self.path, i, f"unreadable Prometheus line ({type(e).__name__}: "
                                                     f"{str(e)[:80]})", raw))
            return
        for fam in fams:
            for smp in fam.samples:
                if smp.name == "trtllm_speculative_config_info":
                    self.info.update(smp.labels)
                v = float(smp.value)
                if v != v or v in (float("inf"), float("-inf")):
                    if len(self.notes) < MAX_NOTES:
                        self.notes.append(note(self.path, i, f"{smp.name} is not a finite number", raw))
                    continue
                key = (smp.name, tuple(sorted(smp.labels.items())))
                if key in self.scrapes[-1].samples:  # a repeated series starts the next scrape
                    self.scrapes.append(Scrape(line=i))
                self.scrapes[-1].samples[key] = (v, i)
                if smp.timestamp is not None and self.scrapes[-1].t is None:
                    self.scrapes[-1].t = float(smp.timestamp)

    def take(self) -> Reading:  # windows exist only at the end (scrapes are differenced)
        return Reading(source="prom-text", engine="", path=self.path)

    def finish(self) -> Reading:
        scrapes = [sc for sc in self.scrapes if sc.samples]
        return build(scrapes, self.notes, self.path, self.types, self.info)


def split_scrapes(text: str, path: str):
    """-> list[Scrape], notes. Each sample line is parsed on its own (for line numbers)."""
    p = Parser(path)
    for i, raw in enumerate(text.splitlines(), 1):
        p.feed(i, raw)
    return [sc for sc in p.scrapes if sc.samples], p.notes


def _by_rank(scrape: Scrape, names: dict) -> dict:
    """rank -> field -> value (per_pos, per_pos_drafted: {pos: value}); sums over other labels."""
    rev = {v: k for k, v in names.items()}
    out: dict = {}
    for (name, labels), (value, line) in scrape.samples.items():
        f = rev.get(name)
        if f is None:
            continue
        lab = dict(labels)
        rank = next((f"{k} {lab[k]}" for k in RANK_LABELS if k in lab), None)
        d = out.setdefault(rank, {"_line": line})
        d["_line"] = min(d["_line"], line)
        if f in ("per_pos", "per_pos_drafted"):
            pos = next((lab[k] for k in POS_LABELS if k in lab), None)
            try:
                p = int(pos)
            except (TypeError, ValueError):
                continue
            d.setdefault(f, {})
            d[f][p] = d[f].get(p, 0.0) + value
        else:
            d[f] = d.get(f, 0.0) + value
            d.setdefault("_lines", {})[f] = line
    return out


def parse(text: str, path: str) -> Reading:
    scrapes, notes = split_scrapes(text, path)
    return build(scrapes, notes, path)


def build(scrapes, notes, path, types=None, info=None) -> Reading:
    names = set()
    for sc in scrapes:
        names |= {k[0] for k in sc.samples}
    engine = next((e for e, pre in PREFIX.items() if any(n.startswith(pre) for n in names)), None)
    if engine is None:
        seen = next((v for pre, v in ENGINE_OF.items() if any(n.startswith(pre) for n in names)), None)
        if seen:   # the engine's own series, none of them speculative: judged on what it holds
            from specaudit.audit.sources.reading import NoFigures
            raise NoFigures(path, f"a {seen} scrape with no spec-decoding series (speculative decoding off, or "
                                  "not exported by this version)", recognised=f"{seen} Prometheus scrape", notes=notes)
        raise InputError(path, "no spec-decoding series (vllm:spec_decode_*, sglang:spec_accept_*, trtllm_spec_decode_*"
                               ", llamacpp:spec_decode_*, specaudit_*) in this Prometheus text")
    fam, required, pos_kind = FAMILIES[engine]
    missing = [fam[k] for k in required if fam[k] not in names]
    reading = Reading(source="prom-text", engine=engine, path=path, notes=notes)
    if missing:   # a partial scrape: judged on the series it holds; the account names the rest
        reading.config["missing_series"] = missing
    gen = GENERATED.get(engine)
    if gen and scrapes and any(n == gen for n, _l in scrapes[-1].samples):
        # tokens generated since start-up (the last scrape): beside spec counters that are all 0
        # it tells a server that generated without drafting from an idle one (sources.account)
        reading.config["tokens_generated"] = sum(v for (n, _l), (v, _i) in scrapes[-1].samples.items() if n == gen)
    if engine == "llamacpp":
        reading.version = "llama-server /metrics spec_decode_* counters (PR 26389)"
        reading.config["counters_at"] = "request_end"   # a request's counts land when it ends
    models = {dict(labels).get("model_name") for sc in scrapes for (n, labels) in sc.samples
              if n.startswith(PREFIX[engine])} - {None, ""}
    if len(models) == 1:   # one model served: the A/B evidence's model stratum reads it
        reading.config["model_name"] = next(iter(models))
    types = types or {}
    # a counter exported as a gauge (TensorRT-LLM before PR 12545): never difference it
    for base in ("draft_tokens_gauge", "accepted_tokens_gauge"):
        if fam.get(base) in names:
            reading.config.setdefault("gauge_counters", []).append(fam[base])
    for n, (typ, line) in types.items():
        if typ == "gauge" and (n.endswith("_total") or n.endswith("_num_draft_tokens")
                               or n.endswith("_num_accepted_tokens")) and n.startswith(PREFIX[engine]):
            reading.config.setdefault("gauge_counters", []).append(n)
            reading.config.setdefault("gauge_counter_lines", {})[n] = line
    ranked = [_by_rank(sc, fam) for sc in scrapes]
    reading.series = ranked[-1] if ranked else {}
    reading.config["scrapes"] = len(scrapes)
    pos = max((len(d.get("per_pos") or {}) for d in reading.series.values()), default=0)
    if pos and engine in ("vllm", "llamacpp"):
        reading.config["num_spec_tokens"] = pos  # vLLM / llama.cpp export every position 0..k-1
    if engine == "trtllm" and info and str(info.get("spec_num_tokens", "")).isdigit():
        reading.config["num_spec_tokens"] = int(info["spec_num_tokens"])
    if engine == "sglang":
        # gauges: each scrape is a window over SGLang's last decode-log interval
        for sc, by in zip(scrapes, ranked):
            for rank, d in by.items():
                if "accept_len" not in d:
                    continue
                reading.windows.append(Window(
                    line=d["_line"], t=sc.t, rank=rank, accept_len=d["accept_len"],
                    accept_rate=d.get("accept_rate"), gen_tps=d.get("gen_tps"), engine="sglang", kind="gauge",
                    concurrency=d.get("running"), text=f"{fam['accept_len']} = {d['accept_len']:g}"))
        return reading
    # counters: one cumulative window per rank from the last scrape, then interval deltas
    if len(scrapes) == 1:
        pairs = [(None, scrapes[0], {}, ranked[0])]
    else:
        pairs = [(scrapes[j - 1], scrapes[j], ranked[j - 1], ranked[j]) for j in range(1, len(scrapes))]
    counters = ("drafts", "draft_tokens", "accepted_tokens")
    for prev_s, sc, prev, cur in pairs:
        for rank, d in cur.items():
            if not any(k in d for k in counters) and "per_pos" not in d:
                if "draft_tokens_gauge" in d or "accepted_tokens_gauge" in d:
                    # token counts exported as gauges (TensorRT-LLM before PR 12545): one
                    # iteration's values, read as they are and never differenced (SA725)
                    reading.windows.append(Window(
                        line=d["_line"], t=sc.t, rank=rank, engine=engine, kind="gauge",
                        draft_tokens=d.get("draft_tokens_gauge"), accepted_tokens=d.get("accepted_tokens_gauge"),
                        accept_len=d.get("accept_len"), extra={"accept_len_gauge": True},
                        text=f"gauges: drafted {d.get('draft_tokens_gauge')}, "
                             f"accepted {d.get('accepted_tokens_gauge')}"))
                continue
            p = prev.get(rank, {})
            delta = lambda k, d=d, p=p: (d[k] - p.get(k, 0.0)) if k in d else None
            w = Window(line=d["_line"], t=sc.t, rank=rank, engine=engine,
                       kind="cumulative" if prev_s is None else "interval")
            w.drafts, w.draft_tokens = delta("drafts"), delta("draft_tokens")
            w.accepted_tokens = delta("accepted_tokens")
            w.k = reading.config.get("num_spec_tokens")
            if "per_pos" in d:
                pp, qq = d["per_pos"], p.get("per_pos", {})
                w.per_pos_counts = [pp[k] - qq.get(k, 0.0) for k in sorted(pp)]
                w.per_pos_kind = pos_kind
                if pos_kind == "verify_steps" and w.drafts and w.drafts > 0:
                    w.per_pos = [c / w.drafts for c in w.per_pos_counts]
                if "per_pos_drafted" in d:
                    dd, ee = d["per_pos_drafted"], p.get("per_pos_drafted", {})
                    w.per_pos_drafted = [dd.get(k, 0.0) - ee.get(k, 0.0) for k in sorted(pp)]
                    w.per_pos = [(c / x if x > 0 else None) for c, x in zip(w.per_pos_counts, w.per_pos_drafted)]
                    if any(r is None for r in w.per_pos):
                        w.per_pos = None
            if w.drafts and w.drafts > 0 and w.accepted_tokens is not None:
                w.accept_len = 1 + w.accepted_tokens / w.drafts
                w.extra["accept_len_derived"] = True   # computed here, not exported: nothing to check it against
            elif "accept_len" in d:
                w.accept_len = d["accept_len"]
                w.extra["accept_len_gauge"] = True
            if prev_s is not None and any(d.get(k, 0.0) < p.get(k, 0.0) for k in counters):
                w.extra["counter_reset"] = True
            for k in ("running",):
                if k in d:
                    w.concurrency = d[k]
            if prev_s is not None and sc.t is not None and prev_s.t is not None and sc.t > prev_s.t \
                    and "generated" in d:
                w.gen_tps = (d["generated"] - p.get("generated", 0.0)) / (sc.t - prev_s.t)
            for k in ("committed", "derived_accepted", "derived_committed"):
                if k in d:
                    w.extra[k] = delta(k)
            for k in ("reported", "estimated", "estimated_low", "estimated_high"):
                if k in d:
                    w.extra[k] = d[k]
            if engine == "specaudit" and "reported" in d:
                w.extra["reported_commit_len"] = d["reported"]
            w.text = (f"drafts {w.drafts if w.drafts is not None else '?':g}, " if w.drafts is not None else "") + \
                (f"drafted {w.draft_tokens if w.draft_tokens is not None else '?'}, "
                 f"accepted {w.accepted_tokens if w.accepted_tokens is not None else '?'}")
            reading.windows.append(w)
    return reading
