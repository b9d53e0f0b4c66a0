"""What a benchmark client (AIPerf) reported per request, against the same run's trace.

    findings = compare_paths(["artifacts/profile_export.jsonl"], ["traces/"])
    figs = aiperf_records("artifacts/profile_export.jsonl")   # {x_request_id: Figures}
    derived = trace_figures(["traces/"])                       # {request_id: Figures}

AIPerf (profile_export.jsonl, one record per request) carries the per-request
speculative figures the server put in its responses (vLLM's
`metrics.speculative_decoding`): acceptance length, draft acceptance rate (percent),
verify steps, accepted and drafted tokens. `specaudit serve` names each request
`cmpl-<X-Request-ID>` / `chatcmpl-<X-Request-ID>`, so each AIPerf record meets its trace
rows (vLLM's engine ids `cmpl-<X-Request-ID>-0-<8 hex>` / `chatcmpl-<X-Request-ID>-<8 hex>`
are matched too, for a trace whose manifest names vLLM). From the rows specaudit
re-derives the same figures from raw data: verify steps = rows (for a vLLM trace, the
rows that had drafts: vLLM's per-request block counts only those, and the finding says
which count it used), drafted = nodes - 1 per row, accepted = the accepted path's depth (the path the
target really accepted, never the reported accepted_depth). Each pair gets one verdict
from specaudit.audit.compare (AIPerf writes computed floats: full precision, so they
agree within summation order; counts compare exactly).

The findings are the catalog's (invariants/sa59_client.py): SA590 client-vs-trace
(error), a client's per-request figure disagrees with the figure re-derived from the
trace, its message shows both; SA591 (warning), the records without a matching trace
request, said once, never compared with a guessed partner. This module reads both
sides and hands them to those rules; `specaudit check EXPORT TRACE_DIR` runs it.

Words:
    Figures   steps, drafted, accepted (counts) and accept_len, accept_rate (fractions)
"""
from __future__ import annotations

import json
from pathlib import Path

from specaudit.audit.findings import Finding, rule_findings
from specaudit.invariants import get_rule
from specaudit.invariants.sa59_client import ClientComparison, Figures
from specaudit.trace.safe_io import InputError

MAX_EXPORT_BYTES = 1 << 30   # an AIPerf profile_export.jsonl (read whole)

CODES = ("SA590", "SA591")   # the catalog's client-vs-trace rules, in the order they report
__all__ = ["Figures", "aiperf_records", "compare", "compare_paths", "cross_check", "is_aiperf_export",
           "trace_figures"]


def is_aiperf_export(path) -> bool:
    """A profile_export.jsonl of AIPerf: JSONL whose first record has metadata.x_request_id."""
    p = Path(path)
    if not p.is_file() or p.suffix != ".jsonl":
        return False
    from specaudit.inputs import open_input
    try:
        with open_input(p) as f:
            first = f.readline(1 << 20).decode("utf-8")
        obj = json.loads(first)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, InputError):
        return False
    return isinstance(obj, dict) and isinstance(obj.get("metadata"), dict) and "x_request_id" in obj["metadata"]


def _value(metrics: dict, tag: str):
    v = metrics.get(tag)
    return v.get("value") if isinstance(v, dict) else None


def aiperf_records(path) -> dict[str, dict]:
    """{x_request_id: {"steps", "drafted", "accepted", "accept_len", "accept_rate" (fraction)}} for the
    profiling records that carry spec-decode figures. Raises InputError on a file it cannot read."""
    p = Path(path)
    out = {}
    from specaudit.inputs import iter_jsonl
    for _, rec in iter_jsonl(p, "the AIPerf export", MAX_EXPORT_BYTES):
        meta, m = rec.get("metadata") or {}, rec.get("metrics") or {}
        if meta.get("benchmark_phase", "profiling") != "profiling" or _value(m, "spec_decode_steps") is None:
            continue
        rate = _value(m, "spec_decode_draft_acceptance_rate")
        out[str(meta.get("x_request_id"))] = {
            "steps": _value(m, "spec_decode_steps"), "drafted": _value(m, "spec_decode_draft_tokens"),
            "accepted": _value(m, "spec_decode_accepted_draft_tokens"),
            "accept_len": _value(m, "spec_decode_acceptance_length"),
            "accept_rate": rate / 100.0 if isinstance(rate, (int, float)) else None}
    return out


def trace_figures(paths) -> dict[str, Figures]:
    """{request_id: Figures re-derived from the step rows} over every run under paths."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from specaudit.trace.schema import discover
    acc: dict[str, list[int]] = {}
    conv: dict[str, str] = {}
    for run in discover(paths):
        # how the engine that wrote the client's figures counts verify steps
        engine = ((run.manifest or {}).get("engine") or {}).get("name")
        convention = "vllm" if engine == "vllm" else "rows"
        for f in run.step_files:
            t = pq.read_table(f, columns=["request_id", "node_tokens", "accepted_path"])
            rids = t.column("request_id").to_pylist()
            nodes = pc.list_value_length(t.column("node_tokens")).to_pylist()   # [rows] nodes, root included
            depth = pc.list_value_length(t.column("accepted_path")).to_pylist() # [rows] path, root included
            for rid, n, d in zip(rids, nodes, depth):
                a = acc.setdefault(rid, [0, 0, 0])
                conv[rid] = convention
                a[0] += 1 if convention == "rows" or (n or 1) > 1 else 0   # vLLM: a step without drafts is none
                a[1] += (n or 1) - 1
                a[2] += (d or 1) - 1
    return {rid: Figures.of(*v, conv[rid]) for rid, v in acc.items()}


def compare(records: dict[str, dict], derived: dict[str, Figures], file: str | None = None) -> list[Finding]:
    """SA590 for every disagreeing figure of a matched request; SA591 once for unmatched records
    (the catalog's rules, on one ClientComparison)."""
    ctx = ClientComparison(records, derived, file)
    out: list[Finding] = []
    for code in CODES:
        rule = get_rule(code)
        out += rule_findings(rule, rule.check(ctx), file=file)
    return out


def compare_paths(exports, traces) -> list[Finding]:
    """Every AIPerf export against the request figures of every run under `traces`."""
    derived = trace_figures(traces)
    out = []
    for e in exports:
        out += compare(aiperf_records(e), derived, file=str(e))
    return out


def cross_check(traces, files, select, ignore, result) -> None:
    """`specaudit check`: the AIPerf exports among `files` against the runs under `traces`,
    into the checker's result (select / ignore are code prefixes, as everywhere)."""
    exports = [f for f in files if is_aiperf_export(f)]
    if not exports:
        return
    keep = lambda code: ((not select or any(code.startswith(s) for s in select))
                         and not any(code.startswith(s) for s in ignore))
    try:
        derived = trace_figures([t for t in traces if Path(t).exists()])
    except InputError:
        return   # the checker has already named the unreadable trace
    for e in exports:
        try:
            found = compare(aiperf_records(e), derived, file=str(e))
        except InputError as err:   # as the checker records a bad input: SA000, one line
            result.bad_input(err.path or e, err.reason)
            continue
        for f in found:
            if keep(f.code):
                result.add(f)
