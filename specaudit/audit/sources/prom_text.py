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
    specaudit specaudit_verify_steps_total, _drafted_tokens_total, _accepted_tokens_total,
              _committed_tokens_total, _derived_*_total, _depth_accepted_total{depth},
              _generated_tokens_total, _running_requests, _reported_commit_length,
              _estimated_commit_length{,_lower,_upper}
"""
from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from specaudit.trace.schema import InputError
from specaudit.audit.sources import Reading, Window

SCRAPED_AT_RE = re.compile(r"^#\s*scraped_at:\s*(?P<t>[0-9.]+)")
KNOWN_RE = re.compile(r"^(vllm:spec_decode_|sglang:spec_accept_|sglang:gen_throughput|specaudit_(verify_steps|"
                      r"drafted_tokens|accepted_tokens|reported_commit_length))")

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
RANK_LABELS = ("engine", "dp_rank")
POS_LABELS = ("position", "depth")


def looks_like(text: str) -> bool:
    for ln in text.splitlines():
        s = ln.lstrip()
        if s.startswith("# TYPE ") or s.startswith("# HELP "):
            s = s.split(" ", 2)[2] if s.count(" ") >= 2 else ""
        if KNOWN_RE.match(s):
            return True
    return False


class Scrape:
    def __init__(self, t=None, line=None):
        self.t, self.line = t, line
        self.samples: dict[tuple, tuple[float, int]] = {}  # (name, labels) -> (value, line)


def split_scrapes(text: str, path: str):
    """-> list[Scrape], notes. Each sample line is parsed on its own (for line numbers)."""
    from specaudit.audit.sources import note
    scrapes, notes = [Scrape(line=1)], []
    for i, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s:
            continue
        m = SCRAPED_AT_RE.match(s)
        if m:
            if scrapes[-1].samples or scrapes[-1].t is not None:
                scrapes.append(Scrape(line=i))
            scrapes[-1].t = float(m.group("t"))
            scrapes[-1].line = i
            continue
        if s.startswith("#"):
            continue
        try:
            fams = list(text_string_to_metric_families(s + "\n"))
        except Exception as e:  # the parser raises ValueError/IndexError/... on a bad line
            notes.append(note(path, i, f"unreadable Prometheus line ({type(e).__name__}: {e})", raw))
            continue
        for fam in fams:
            for smp in fam.samples:
                key = (smp.name, tuple(sorted(smp.labels.items())))
                if key in scrapes[-1].samples:  # a repeated series starts the next scrape
                    scrapes.append(Scrape(line=i))
                scrapes[-1].samples[key] = (float(smp.value), i)
                if smp.timestamp is not None and scrapes[-1].t is None:
                    scrapes[-1].t = float(smp.timestamp)
    return [s for s in scrapes if s.samples], notes


def _by_rank(scrape: Scrape, names: dict) -> dict:
    """rank -> field -> value (per_pos: {pos: value}); sums over other labels."""
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
        if f == "per_pos":
            pos = next((lab[k] for k in POS_LABELS if k in lab), None)
            try:
                p = int(pos)
            except (TypeError, ValueError):
                continue
            d.setdefault("per_pos", {})
            d["per_pos"][p] = d["per_pos"].get(p, 0.0) + value
        else:
            d[f] = d.get(f, 0.0) + value
            d.setdefault("_lines", {})[f] = line
    return out


def parse(text: str, path: str) -> Reading:
    scrapes, notes = split_scrapes(text, path)
    names = set()
    for s in scrapes:
        names |= {k[0] for k in s.samples}
    if any(n.startswith("vllm:spec_decode") for n in names):
        engine, fam = "vllm", VLLM
        required = ("drafts", "draft_tokens", "accepted_tokens")
    elif any(n.startswith("sglang:spec_accept") for n in names):
        engine, fam = "sglang", SGLANG
        required = ("accept_len",)
    elif any(n.startswith("specaudit_") for n in names):
        engine, fam = "specaudit", SPECAUDIT
        required = ("drafts", "draft_tokens", "accepted_tokens")
    else:
        raise InputError(path, "no spec-decoding series (vllm:spec_decode_*, sglang:spec_accept_*, specaudit_*) "
                               "in this Prometheus text")
    missing = [fam[k] for k in required if fam[k] not in names]
    if missing:
        raise InputError(path, f"{engine} metrics lack {', '.join(missing)}: cannot audit spec decoding from them")
    reading = Reading(source="prom-text", engine=engine, path=path, notes=notes)
    ranked = [_by_rank(s, fam) for s in scrapes]
    reading.series = ranked[-1]
    reading.config["scrapes"] = len(scrapes)
    pos = max((len(d.get("per_pos") or {}) for d in ranked[-1].values()), default=0)
    if pos and engine == "vllm":
        reading.config["num_spec_tokens"] = pos
    if engine == "sglang":
        # gauges: each scrape is a window over SGLang's last decode-log interval
        for s, by in zip(scrapes, ranked):
            for rank, d in by.items():
                if "accept_len" not in d:
                    continue
                reading.windows.append(Window(
                    line=d["_line"], t=s.t, rank=rank, accept_len=d["accept_len"],
                    accept_rate=d.get("accept_rate"), gen_tps=d.get("gen_tps"),
                    concurrency=d.get("running"), text=f"{fam['accept_len']} = {d['accept_len']:g}"))
        return reading
    # counters: one cumulative window per rank from the last scrape, then interval deltas
    if len(scrapes) == 1:
        pairs = [(None, scrapes[0], {}, ranked[0])]
    else:
        pairs = [(scrapes[j - 1], scrapes[j], ranked[j - 1], ranked[j]) for j in range(1, len(scrapes))]
    for prev_s, s, prev, cur in pairs:
        for rank, d in cur.items():
            if "drafts" not in d:
                continue
            p = prev.get(rank, {})
            delta = lambda k: (d[k] - p.get(k, 0.0)) if k in d else None  # noqa: E731
            w = Window(line=d["_line"], t=s.t, rank=rank)
            w.drafts, w.draft_tokens = delta("drafts"), delta("draft_tokens")
            w.accepted_tokens = delta("accepted_tokens")
            if "per_pos" in d:
                pp, qq = d["per_pos"], p.get("per_pos", {})
                w.per_pos_counts = [pp[k] - qq.get(k, 0.0) for k in sorted(pp)]
                if w.drafts and w.drafts > 0:
                    w.per_pos = [c / w.drafts for c in w.per_pos_counts]
            if w.drafts and w.drafts > 0 and w.accepted_tokens is not None:
                w.accept_len = 1 + w.accepted_tokens / w.drafts
            if prev_s is not None and any(d.get(k, 0.0) < p.get(k, 0.0) for k in ("drafts", "draft_tokens",
                                                                                   "accepted_tokens")):
                w.extra["counter_reset"] = True
            for k in ("running",):
                if k in d:
                    w.concurrency = d[k]
            if prev_s is not None and s.t is not None and prev_s.t is not None and s.t > prev_s.t \
                    and "generated" in d:
                w.gen_tps = (d["generated"] - p.get("generated", 0.0)) / (s.t - prev_s.t)
            for k in ("committed", "derived_accepted", "derived_committed"):
                if k in d:
                    w.extra[k] = delta(k)
            for k in ("reported", "estimated", "estimated_low", "estimated_high"):
                if k in d:
                    w.extra[k] = d[k]
            if engine == "specaudit" and "reported" in d:
                w.extra["reported_commit_len"] = d["reported"]
            w.text = (f"drafts {w.drafts:g}, drafted {w.draft_tokens if w.draft_tokens is not None else '?'}, "
                      f"accepted {w.accepted_tokens if w.accepted_tokens is not None else '?'}")
            reading.windows.append(w)
    return reading
