"""Which reader an input is for: the table of sources (SOURCES, the `--source` names) and
detection by the file's own lines.

detect_lines looks at the first HEAD_BYTES of a file (then on until a first hit) and asks
every reader's looks_like_line (json-records: looks_like_first on the first non-blank
line); two engines' lines in one file are "mixed engines" (an error, or with majority=True
the engine with most lines). resolve() is the one entry: a forced --source checked against
SOURCES, else detection, else a one-line InputError saying what the file is not.
"""
from __future__ import annotations

from pathlib import Path

from specaudit.audit.sources.lines import Lines, check_path
from specaudit.trace.safe_io import InputError

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
HEAD_BYTES = 8 * 1024 * 1024    # detection reads this much of the file first


def reader_modules() -> dict:
    """--source name -> its reader module (imported on first use)."""
    import importlib
    return {name: importlib.import_module(f"specaudit.audit.sources.{mod}") for name, (mod, *_r) in SOURCES.items()}


def log_markers(mods):
    """Every log reader's MARKERS (for Lines): a line without any of them is no
    reader's line and no other engine's (the mixed-engine check needs those too)."""
    return tuple(sorted({m for name, mod in mods.items() if SOURCES[name][1] == "log" for m in mod.MARKERS}))


def detect_lines(lines, majority: bool = False) -> str | None:
    """Which source an iterable of text lines is (looking at the first HEAD_BYTES, then on
    until a first hit), or None. Mixed engines raise ValueError, or with `majority` give
    the engine with the most lines there (ties: the first seen)."""
    mods = reader_modules()
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
    return resolve(path, None)[1]


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


def resolve(path, source):
    """(the checked path, its source): `source` when given and known, else the detected one."""
    if source is not None and source not in SOURCES:
        raise InputError(path, f"unknown --source {source!r}; one of {', '.join(SOURCES)}")
    p = check_path(path)
    if source is None:
        try:
            source = detect_lines(Lines(p, progress=False))
        except ValueError as e:
            raise InputError(path, str(e)) from None
        if source is None:
            raise InputError(path, _unrecognised(p))
    return p, source

