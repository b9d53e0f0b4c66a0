"""llama-server response exports as windows for A/B: one request, one window.

    from specaudit.audit.sources.llamacpp_responses import looks_like, read_responses
    if looks_like(path):
        reading = read_responses(path)    # a Reading; ab_evidence.windows_from_reading cuts it

A client that saved each `/completion` response as one JSON line (`responses.jsonl`, the
shape `specaudit check` compares against the server's log) holds, per request, what the
server measured for it in `timings`:

    predicted_n            tokens generated (the first comes from the prefill)
    predicted_per_second   decode tokens/s of this request (predicted_n / predicted_ms)
    draft_n                drafted tokens sent to verification   (speculation on only)
    draft_n_accepted       of those, accepted                    (speculation on only)

Each response is one Window: gen_tps = predicted_per_second (per request, not the
server's aggregate: compare sides run at the same number of requests in flight), and,
when the server speculated, the acceptance rate draft_n_accepted / draft_n. A server with
speculation off writes no draft_n: its windows carry tokens/s only, so an A/B of off
against on has acceptance figures on one side only (ab_evidence says so). The timings
hold no verify-step count, so no accept length is made up here (the server's log line
has it: `specaudit check server.log`). A record may carry "concurrency" (requests in
flight when it ran, written by the client); nothing else is read from it.
"""
from __future__ import annotations

import json
import math

from specaudit.audit.sources.reading import Reading, Window
from specaudit.trace.safe_io import InputError, parse_json_bounded

MAX_BYTES = 256 << 20     # a response export of a few hundred thousand requests
SOURCE = "llamacpp-responses"


def _timings(obj):
    t = obj.get("timings") if isinstance(obj, dict) else None
    return t if isinstance(t, dict) and "predicted_n" in t and "predicted_per_second" in t else None


def looks_like(path) -> bool:
    """True when the file's first non-empty line is a JSON object with llama-server timings."""
    from specaudit.inputs import open_input
    try:
        with open_input(path) as f:
            head = f.read(1 << 20)
    except InputError:
        return False
    for ln in head.splitlines():
        if ln.strip():
            try:   # bounded: a line nested thousands deep is not a response (and no recursion)
                return _timings(parse_json_bounded(ln, path, max_depth=64)) is not None
            except InputError:
                return False
    return False


def _num(x, what, line, path):
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        raise InputError(path, f"line {line}: timings.{what} is {x!r}, not a finite number >= 0")
    return float(x)


def read_responses(path) -> Reading:
    """The export -> a Reading of one interval window per response. InputError (one line)
    for a line that is not JSON, a record without llama-server timings, or no record."""
    from specaudit.inputs import read_input_text
    text = read_input_text(path, MAX_BYTES)
    r = Reading(source=SOURCE, engine="llamacpp", path=str(path))
    r.version = "llama-server /completion timings"
    spec = plain = 0
    for i, ln in enumerate(text.splitlines(), 1):
        if not ln.strip():
            continue
        try:
            obj = parse_json_bounded(ln.encode(), path, max_depth=64)
        except InputError as e:
            raise InputError(path, f"line {i}: {e.reason} (one /completion response JSON per line)") from None
        t = _timings(obj)
        if t is None:
            raise InputError(path, f"line {i}: no llama-server timings (predicted_n, predicted_per_second)")
        w = Window(line=i, engine="llamacpp", kind="interval", version=r.version)
        w.gen_tps = _num(t["predicted_per_second"], "predicted_per_second", i, path)
        w.extra["generated_tokens"] = _num(t["predicted_n"], "predicted_n", i, path)
        c = obj.get("concurrency")
        if isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 0:
            w.concurrency = float(c)
        if "draft_n" in t:
            w.draft_tokens = _num(t["draft_n"], "draft_n", i, path)
            w.accepted_tokens = _num(t.get("draft_n_accepted"), "draft_n_accepted", i, path)
            spec += 1
        else:
            plain += 1
        w.text = json.dumps({k: t.get(k) for k in ("predicted_n", "predicted_per_second", "draft_n",
                                                   "draft_n_accepted") if k in t})
        r.windows.append(w)
    if not r.windows:
        raise InputError(path, "no llama-server response in it (one /completion response JSON per line)")
    r.config["speculation"] = "on" if spec and not plain else ("off" if plain and not spec else "mixed")
    return r
