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

Each reader turns a file into a `Reading` of `Window`s in one vocabulary (the fields and
their meaning: sources/reading.py). The SA7xx rules of the invariant catalog
(invariants/sa7xx_*.py, scope "source") then check the identities that hold without traces.
audit_file_account() adds the reading's account (sources/account.py: what was recognised,
read and skipped, each identity with its numbers, what could not be checked and why);
`specaudit check` prints it for every input.

The package, one idea per module:
    reading.py   Window, Reading, the LineParser base, note(), NoFigures
    lines.py     the chunked line reader (Lines) and unwrap() of a paste's Markdown, CRLF
                 and colour codes
    detection.py SOURCES (the --source names) and which reader recognises an input
    stream.py    a file streamed into Readings of CHUNK_WINDOWS windows (iter_readings)
    rules.py     the SA7xx rules run on one Reading (audit_reading)
    parallel.py  a large log audited in byte ranges by worker processes
    audit.py     audit_file and audit_file_account: sequential or parallel
    sglang.py, vllm*.py, llamacpp*.py, tokenspeed.py, records.py, prom_text.py,
    prom_http.py the readers, one per engine output; account.py the account

This package is a reader: it imports schema.py, findings.py and the rule catalog, never
another reader. Below: the public API (the names other tools import from here).
"""
from __future__ import annotations

from specaudit.audit.sources.audit import audit_file, audit_file_account
from specaudit.audit.sources.detection import SOURCES, detect, list_sources
from specaudit.audit.sources.reading import Reading, Window
from specaudit.audit.sources.stream import iter_readings, read_source

__all__ = ["SOURCES", "Reading", "Window", "audit_file", "audit_file_account", "detect", "iter_readings",
           "list_sources", "read_source"]
