"""Producing traces: the contract (schema), the tracer API and its sinks.

    schema.py     the trace contract as code (docs/trace-contract.md in words)
    tracer.py     the public API an engine calls once per verify step
    parquet.py    the record: a hive-partitioned Parquet dataset
    prom_sink.py  live: Prometheus counters, histograms and inline rules
    otel_sink.py  spans: one per request, one child per verify step
    synth.py      contract-valid synthetic rows (tests, benchmarks)

Nothing here imports a reader (specaudit.audit, specaudit.postmortem).
"""
