"""Producing traces: the contract (schema), the tracer API and its sinks.

    schema.py     the trace contract as code (docs/trace-contract.md in words)
    tracer.py     the public API an engine calls once per verify step
    host_copy.py  a step's tensors to the host (one batched device->host copy per step)
    steps_arrow.py  the tracer's filed steps -> one Arrow RecordBatch of the steps table
    parquet.py    the record: a hive-partitioned Parquet dataset
    prom_sink.py  live: Prometheus counters and histograms
    inline_rules.py  the catalog's cheap per-step rules, live (counted by prom_sink)
    prom_exposition.py  fast /metrics text for the sink's registry
    otel_sink.py  spans: one per request, one child per verify step
    synth.py      contract-valid synthetic rows (tests, benchmarks)

Nothing here imports a reader (specaudit.audit, specaudit.postmortem).
"""
