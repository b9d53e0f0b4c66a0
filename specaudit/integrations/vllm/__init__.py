"""Per-step traces from vLLM itself: a `vllm.general_plugins` plugin (docs/tracing-vllm.md).

Off unless SPECAUDIT_VLLM_TRACE names a dataset folder. When on, every verify step of
every request that vLLM's engine core runs becomes one step row of the trace contract
(docs/trace-contract.md), written through specaudit's Tracer and Parquet sink.

One idea per file:
    versions.py   the vLLM versions whose internals the hooks were written against
    plugin.py     the entry point: reads the environment, refuses unknown versions
    hooks.py      the three places wrapped inside vLLM and what each one captures
    rows.py       a captured step (worker side + scheduler side) -> one contract row
    sampling.py   a sampled step's contract v2 values from vLLM's own test tensors
    sink.py       the run: Tracer + ParquetSink opened lazily, manifest, close, incomplete
The trace is compared with vLLM's log line, /metrics and per-request blocks by
specaudit.audit.sources.vllm_crosscheck (a reader: the runtime layer imports none).
"""
