"""OpenTelemetry sink: one span per request, one child span per verify step.

    sink = OtelSink(ratio=0.1)                   # provider and exporters from OTEL_* variables
    tracer = Tracer([ParquetSink(...), sink], manifest, run_id)

Request spans follow the gen_ai semantic conventions (a server-side inference span):
    name       "text_completion <model>"
    kind       SERVER
    gen_ai.operation.name            text_completion
    gen_ai.provider.name             specaudit
    gen_ai.request.model, gen_ai.response.model
    gen_ai.response.id               the request id
    gen_ai.response.finish_reasons   ["stop"] / ["length"] / ["abort"]
    gen_ai.usage.input_tokens, gen_ai.usage.output_tokens
    gen_ai.request.max_tokens        when the server annotated the request
plus specaudit.run_id, specaudit.request_id, specaudit.verify_steps, specaudit.ttft_s.
Each verify step is a child span "specaudit.verify_step" with the step's timing and
specaudit.step, .accepted_depth, .commit_len, .node_count, .batch_size, .seq_len,
.finished, .draft_s, .verify_s: the numbers a trace viewer needs to see a bad step.

Spans carry the step's own timestamps (t_start, step_s) and are emitted when the
request ends (the tracer hands rows to sinks off the decode path, steps first), so a
span's duration is the engine's, not the exporter's.

Sampling: a request is kept with probability `ratio`, decided from a hash of
(run_id, request_id) at its first step, so an unsampled request costs one dict lookup
per step. The provider's own sampler (OTEL_TRACES_SAMPLER) still applies on top, and
a W3C `traceparent` handed to `annotate()` makes the request span its child.

Export: `provider_from_env()` builds a TracerProvider whose exporters come from the
standard variables: OTEL_TRACES_EXPORTER (otlp, console, none; default otlp),
OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT / _PROTOCOL (http/protobuf or grpc) / _HEADERS,
OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*. OTLP needs
`pip install 'specaudit[otlp]'`; without it the sink logs one line and exports nothing.
Tests pass their own provider with an InMemorySpanExporter.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger("specaudit.otel")

OPERATION = "text_completion"
PROVIDER = "specaudit"
# runtime finish reason -> OpenAI/gen_ai finish reason
FINISH = {"eos": "stop", "length": "length", "abort": "abort"}
STEP_FIELDS = ("step", "t_start", "step_s", "draft_s", "verify_s", "accepted_depth", "commit_len",
               "batch_size", "seq_len", "finished")


def env_requests_otel(environ=os.environ) -> bool:
    """True when the OTEL_* variables ask for trace export (and the SDK is not disabled)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exp = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exp:
        return exp != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _otlp_exporter(environ):
    proto = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
             or "http/protobuf").strip().lower()
    try:
        if proto == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        pkg = "opentelemetry-exporter-otlp-proto-grpc" if proto == "grpc" else "opentelemetry-exporter-otlp-proto-http"
        log.warning("OTLP export asked for (%s) but %s is not installed: "
                    "pip install 'specaudit[otlp]'; spans are not exported", proto, pkg)
        return None
    return OTLPSpanExporter()  # endpoint, headers, timeout, compression: from OTEL_* variables


def provider_from_env(environ=os.environ, service_name: str = "specaudit"):
    """A TracerProvider with batch exporters chosen by OTEL_TRACES_EXPORTER."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    attrs = {} if environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "") \
        else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attrs))
    for name in (environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(","):
        name = name.strip().lower()
        if name in ("", "none"):
            continue
        if name == "otlp":
            exp = _otlp_exporter(environ)
        elif name == "console":
            exp = ConsoleSpanExporter()
        else:
            log.warning("OTEL_TRACES_EXPORTER=%s is not supported here (otlp, console, none)", name)
            exp = None
        if exp is not None:
            provider.add_span_processor(BatchSpanProcessor(exp))
    return provider


def sampled(run_id: str, request_id: str, ratio: float) -> bool:
    """Deterministic keep/drop: the first 8 bytes of blake2b(run_id/request_id) < ratio * 2^64."""
    if ratio >= 1.0:
        return True
    if ratio <= 0.0:
        return False
    h = hashlib.blake2b(f"{run_id}/{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") < int(ratio * 2 ** 64)


class OtelSink:
    """Tracer sink that turns requests and their verify steps into OpenTelemetry spans.

    tracer_provider: a TracerProvider (default: `provider_from_env()`, shut down at
    close_run; a provider you pass is only flushed). ratio: share of requests traced.
    model: gen_ai.request.model (default: the manifest's target model name).
    """

    def __init__(self, tracer_provider=None, ratio: float = 1.0, model: str | None = None):
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"--otel-sample-ratio must be within 0..1 (got {ratio})")
        from opentelemetry import trace

        from specaudit import __version__
        self._own = tracer_provider is None
        self.provider = tracer_provider if tracer_provider is not None else provider_from_env()
        self.tracer = self.provider.get_tracer("specaudit", __version__)
        self._trace = trace
        self.ratio = float(ratio)
        self.model = model
        self.run_id = ""
        self._keep: dict[str, bool] = {}          # request id -> sampled (until it ends)
        self._steps: dict[str, list[tuple]] = {}  # sampled request id -> step tuples
        self._notes: dict[str, tuple[dict, dict | None]] = {}
        self._lock = threading.Lock()

    live = True   # spans are exported while the run goes on: the tracer hands batches over every 0.25 s

    def open_run(self, manifest: dict) -> None:
        self.run_id = str(manifest.get("run_id", ""))
        if self.model is None:
            self.model = ((manifest.get("models") or {}).get("target") or {}).get("name") or "specaudit"

    def annotate(self, request_id: str, attributes: dict | None = None, carrier: dict | None = None) -> None:
        """Extra request-span attributes (e.g. gen_ai.request.max_tokens) and an optional
        W3C trace-context carrier (the HTTP headers) to parent the span. Thread-safe;
        call it before the request's first step."""
        with self._lock:
            self._notes[str(request_id)] = (dict(attributes or {}), dict(carrier) if carrier else None)

    def _is_kept(self, rid: str) -> bool:
        k = self._keep.get(rid)
        if k is None:
            k = self._keep[rid] = sampled(self.run_id, rid, self.ratio)
        return k

    def write_steps(self, batch: pa.RecordBatch) -> None:
        rids = batch.column(batch.schema.get_field_index("request_id")).to_pylist()
        keep = [i for i, r in enumerate(rids) if self._is_kept(r)]
        if not keep:
            return
        sub = batch.take(pa.array(keep, pa.int64())) if len(keep) < len(rids) else batch
        cols = {f: sub.column(sub.schema.get_field_index(f)).to_pylist() for f in STEP_FIELDS}
        n = pc.fill_null(pc.list_value_length(sub.column(sub.schema.get_field_index("node_tokens"))), 0)
        cols["node_count"] = np.asarray(n).tolist()
        for j, i in enumerate(keep):
            self._steps.setdefault(rids[i], []).append(tuple(cols[f][j] for f in STEP_FIELDS + ("node_count",)))

    def write_request(self, row: dict) -> None:
        rid = str(row["request_id"])
        kept = self._keep.pop(rid, None)
        if kept is None:
            kept = sampled(self.run_id, rid, self.ratio)
        steps = self._steps.pop(rid, [])
        with self._lock:
            attrs, carrier = self._notes.pop(rid, ({}, None))
        if not kept:
            return
        trace = self._trace
        t0 = float(row.get("t_arrive") or (steps[0][1] if steps else 0.0))
        t_end = t0 + max(float(row.get("e2e_s") or 0.0), 0.0)
        ctx = None
        if carrier:
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
            ctx = TraceContextTextMapPropagator().extract(carrier)
        out_tokens = len(row.get("output_tokens") or ())
        a = {
            "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": self.model,
            "gen_ai.response.model": self.model,
            "gen_ai.response.id": rid,
            "gen_ai.response.finish_reasons": [FINISH.get(row.get("finish_reason"), str(row.get("finish_reason")))],
            "gen_ai.usage.input_tokens": len(row.get("prompt_tokens") or ()),
            "gen_ai.usage.output_tokens": out_tokens,
            "specaudit.run_id": self.run_id,
            "specaudit.request_id": rid,
            "specaudit.verify_steps": len(steps),
            "specaudit.finish_reason": str(row.get("finish_reason")),
        }
        if row.get("ttft_s") is not None:
            a["specaudit.ttft_s"] = float(row["ttft_s"])
        a.update(attrs)
        span = self.tracer.start_span(f"{OPERATION} {self.model}", context=ctx, kind=trace.SpanKind.SERVER,
                                      attributes=a, start_time=_ns(t0))
        parent = trace.set_span_in_context(span)
        for (step, ts, ss, ds, vs, depth, commit, bs, seq, fin, nn) in steps:
            child = self.tracer.start_span("specaudit.verify_step", context=parent, kind=trace.SpanKind.INTERNAL,
                                           start_time=_ns(ts), attributes={
                                               "specaudit.step": int(step),
                                               "specaudit.accepted_depth": int(depth),
                                               "specaudit.commit_len": int(commit),
                                               "specaudit.node_count": int(nn),
                                               "specaudit.batch_size": int(bs),
                                               "specaudit.seq_len": int(seq),
                                               "specaudit.finished": bool(fin),
                                               "specaudit.draft_s": float(ds),
                                               "specaudit.verify_s": float(vs)})
            child.end(end_time=_ns(ts + ss))
        span.end(end_time=_ns(max(t_end, t0)))

    def close_run(self, manifest: dict) -> None:
        self._steps.clear()
        self._keep.clear()
        if self._own:
            self.provider.shutdown()       # flushes the batch processors
        elif hasattr(self.provider, "force_flush"):
            self.provider.force_flush()


def _ns(t: float) -> int:
    return round(t * 1e9)
