"""What a llama-server client received, against the server's log and /metrics (SA592-SA596).

    ev = evidence("responses.jsonl", "server.log", before="before.prom", after="after.prom")
    findings = audit(ev)
    specaudit check server.log responses.jsonl before.prom after.prom      # the same, from the CLI

responses.jsonl: one llama-server response per line, as the client received it (the
/completion JSON, or any object with llama.cpp's `timings`: predicted_n, draft_n,
draft_n_accepted; `id_slot` names the slot). server.log: the server's output over the same
requests (plain or `-v`). The scrapes: /metrics just before the first request and just
after the last (the counters grow when a request ends); one scrape is read as "after" a
server started fresh (every counter from 0). Without scrapes the counter rules are skipped.

The rules are the catalog's (invariants/sa59_llamacpp.py); this module only reads.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from specaudit.audit.findings import Finding, rule_findings
from specaudit.invariants import get_rule
from specaudit.invariants.sa59_llamacpp import ServerEvidence
from specaudit.trace.safe_io import InputError

CODES = ("SA592", "SA593", "SA594", "SA595", "SA596")
COUNTERS = {"drafts": "llamacpp:spec_decode_num_drafts_total",
            "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
            "accepted_tokens": "llamacpp:spec_decode_num_accepted_tokens_total",
            "tokens_predicted": "llamacpp:tokens_predicted_total"}
PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
# `-v`, one per verify step: ids = the accepted draft tokens + the target's own token
IDS_RE = re.compile(r"add accepted tokens: sampled=-?\d+, ids\.size=(?P<n>\d+), n_draft=(?P<d>\d+)")
SAMPLE_RE = re.compile(r"^(?P<name>llamacpp:[A-Za-z0-9_:]+)(?P<labels>\{[^}]*\})?\s+(?P<val>\S+)")


def is_responses(path) -> bool:
    """A JSONL whose first record is an object carrying llama.cpp's `timings` (predicted_n)."""
    p = Path(path)
    if not p.is_file() or p.suffix != ".jsonl":
        return False
    try:
        with p.open("r", encoding="utf-8") as f:
            obj = json.loads(f.readline(1 << 22))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and isinstance(obj.get("timings"), dict) and "predicted_n" in obj["timings"]


def is_scrape(path) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 20)
    except OSError:
        return False
    return "llamacpp:" in head and not ("draft acceptance" in head or "print_timing" in head)


def read_responses(path) -> list[dict]:
    from specaudit.inputs import iter_jsonl
    p = Path(path)
    out = []
    for i, rec in iter_jsonl(p, "the responses"):
        t = rec.get("timings") if isinstance(rec, dict) else None
        if not isinstance(t, dict):
            raise InputError(p, f"line {i} has no llama.cpp `timings` object")
        out.append({"slot": rec.get("id_slot", 0), "predicted_n": t.get("predicted_n"),
                    "draft_n": t.get("draft_n", 0), "draft_n_accepted": t.get("draft_n_accepted", 0)})
    return out


def read_log(path) -> list[dict]:
    """The per-request lines of a llama-server log, each with its per-round (-v) lines (by task)."""
    from specaudit.audit.sources.llamacpp import MEAN_RE, ROUND_RE, SLOT_ID_RE, SLOT_RE
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise InputError(p, f"cannot read the log: {e}") from None
    lines, rounds, ids = [], {}, {}
    for i, raw in enumerate(text.splitlines(), 1):
        if "accepted" not in raw:
            continue
        sid = SLOT_ID_RE.search(raw)
        task = int(sid.group("task")) if sid else None
        m = SLOT_RE.search(raw)
        if m:
            acc, gen = float(m.group(3)), float(m.group(4))
            mm = MEAN_RE.search(m.group("rest"))
            steps = steps_from_len(acc, float(mm.group(1))) if mm else None
            lines.append({"slot": int(sid.group("id")) if sid else 0, "task": task, "accepted": acc,
                          "generated": gen, "steps": steps, "steps_printed": steps, "line": i})
            continue
        r = IDS_RE.search(raw) if "add accepted tokens" in raw else None
        if r:   # printed for every verify step, before its tokens are processed
            ids.setdefault(task, []).append((int(r.group("n")) - 1, int(r.group("d"))))
            continue
        r = ROUND_RE.search(raw) if "draft tokens" in raw and "new n_tokens" in raw else None
        if r:   # printed after them: missing for a step inside which the request ended
            rounds.setdefault(task, []).append((int(r.group("a")), int(r.group("d"))))
    for ln in lines:
        rs = ids.get(ln["task"])
        ln["rounds_may_miss_last"] = rs is None and ln["task"] in rounds
        rs = rs if rs is not None else rounds.get(ln["task"])
        ln["rounds"] = rs
        if rs:
            ln["steps"] = len(rs) + (1 if ln["rounds_may_miss_last"] and ln["steps_printed"] == len(rs) + 1 else 0)
    return lines


def steps_from_len(accepted: float, mean_len: float) -> int | None:
    """The verify steps n with 1 + accepted / n printed as mean_len (two decimals), when only
    one n does; None when the rounding leaves several (few accepted tokens) or none."""
    if accepted <= 0 or mean_len <= 1.005:
        return None
    lo = max(1, math.ceil(accepted / (mean_len + 0.005 - 1.0) - 1e-9))
    hi = math.floor(accepted / max(mean_len - 0.005 - 1.0, 1e-9) + 1e-9)
    cands = [n for n in range(lo, min(hi, lo + 1000) + 1) if abs(1.0 + accepted / n - mean_len) <= 0.005 + 1e-9]
    return cands[0] if len(cands) == 1 else None


def read_scrape(path) -> tuple[dict, int]:
    """-> ({figure: counter value}, positions in the per-position counter)."""
    vals, pos = {}, set()
    names = {v: k for k, v in COUNTERS.items()}
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise InputError(Path(path), f"cannot read the scrape: {e}") from None
    for ln in text.splitlines():
        m = SAMPLE_RE.match(ln)
        if not m:
            continue
        if m.group("name") in names:
            vals[names[m.group("name")]] = float(m.group("val"))
        elif m.group("name") == PER_POS and m.group("labels"):
            pos.add(m.group("labels"))
    return vals, len(pos)


def evidence(responses, log, before=None, after=None, k: int | None = None) -> ServerEvidence:
    reqs = read_responses(responses)
    lines = read_log(log)
    metrics = None
    if after is not None:
        a, npos = read_scrape(after)
        b = read_scrape(before)[0] if before is not None else {}
        metrics = {f: a[f] - b.get(f, 0.0) for f in COUNTERS if f in a}
        if k is None and npos:
            k = npos
    return ServerEvidence(reqs, lines, metrics, k, str(responses))


def audit(ev: ServerEvidence) -> list[Finding]:
    out: list[Finding] = []
    for code in CODES:
        rule = get_rule(code)
        out += rule_findings(rule, rule.check(ev), file=ev.file)
    return out


def _order_scrapes(scrapes):
    """(before, after) from one or two scrape files: the one with fewer predicted tokens is before."""
    if not scrapes:
        return None, None
    if len(scrapes) == 1:
        return None, scrapes[0]
    got = sorted(scrapes[:2], key=lambda s: read_scrape(s)[0].get("tokens_predicted", 0.0))
    return got[0], got[1]


def split(files) -> tuple[list[Path], list[Path]]:
    """-> (llama.cpp response exports, everything else) among `files`."""
    resp = [Path(f) for f in files if is_responses(f)]
    return resp, [Path(f) for f in files if Path(f) not in resp]


def cross_check(responses, others, select, ignore, result) -> None:
    """`specaudit check`: each responses export against the llama.cpp log(s) and scrapes beside it."""
    from specaudit.audit.sources.llamacpp import looks_like
    keep = lambda code: ((not select or any(code.startswith(s) for s in select))
                         and not any(code.startswith(s) for s in ignore))
    logs, scrapes = [], []
    for p in others:
        if not p.is_file():   # a FIFO or device would block the read; the readers report it
            continue
        try:
            head = p.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if looks_like(head):
            logs.append(p)
        elif is_scrape(p):
            scrapes.append(p)
    for r in responses:
        try:
            if len(logs) != 1:
                raise InputError(r, f"compare llama-server responses with exactly one server log beside them "
                                    f"({len(logs)} llama.cpp logs given)")
            if len(scrapes) > 2:
                raise InputError(r, "give at most two /metrics scrapes (before and after the requests)")
            before, after = _order_scrapes(scrapes)
            found = audit(evidence(r, logs[0], before, after))
        except InputError as err:
            result.bad_input(err.path or r, err.reason)
            continue
        for f in found:
            if keep(f.code):
                result.add(f)
