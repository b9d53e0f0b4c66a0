"""OtelSink: gen_ai request spans with a child span per verify step, sampling, context
propagation and OTLP export configured by the standard OTEL_* variables."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from specaudit.trace.otel_sink import OtelSink, env_requests_otel, provider_from_env, sampled
from specaudit.trace.synth import synth_run_rows


def memory_provider():
    exp = InMemorySpanExporter()
    prov = TracerProvider()
    prov.add_span_processor(SimpleSpanProcessor(exp))
    return prov, exp


def feed(sink, n_requests=6, seed=0, algo="tree", annotate=None):
    steps, reqs, manifest = synth_run_rows(n_requests=n_requests, algo=algo, seed=seed)
    sink.open_run(manifest)
    rows = reqs.to_pylist()
    if annotate:
        for r in rows:
            annotate(r["request_id"])
    for b in steps.to_batches(max_chunksize=5):
        sink.write_steps(b)
    for i, r in enumerate(rows):
        r["t_arrive"] = 1_700_000_000.0 + i
        sink.write_request(r)
    sink.close_run(manifest)
    return steps, rows, manifest


def test_request_span_follows_gen_ai_conventions_with_a_child_per_step():
    prov, exp = memory_provider()
    sink = OtelSink(prov, ratio=1.0, model="bytegpt")
    steps, rows, manifest = feed(sink)
    spans = exp.get_finished_spans()
    parents = [s for s in spans if s.parent is None]
    children = [s for s in spans if s.parent is not None]
    assert len(parents) == len(rows) and len(children) == steps.num_rows
    by_rid = {s.attributes["gen_ai.response.id"]: s for s in parents}
    st = steps.to_pydict()
    for r in rows:
        sp = by_rid[r["request_id"]]
        assert sp.name == "text_completion bytegpt" and sp.kind == SpanKind.SERVER
        a = sp.attributes
        assert a["gen_ai.operation.name"] == "text_completion"
        assert a["gen_ai.request.model"] == "bytegpt" and a["gen_ai.provider.name"] == "specaudit"
        assert a["gen_ai.usage.input_tokens"] == len(r["prompt_tokens"])
        assert a["gen_ai.usage.output_tokens"] == len(r["output_tokens"])
        assert list(a["gen_ai.response.finish_reasons"]) == [{"eos": "stop", "length": "length"}[r["finish_reason"]]]
        assert a["specaudit.run_id"] == manifest["run_id"]
        assert sp.start_time == round(r["t_arrive"] * 1e9)
        assert sp.end_time == round((r["t_arrive"] + r["e2e_s"]) * 1e9)
        kids = sorted((c for c in children if c.parent.span_id == sp.context.span_id),
                      key=lambda c: c.attributes["specaudit.step"])
        mine = [i for i, rid in enumerate(st["request_id"]) if rid == r["request_id"]]
        assert [c.attributes["specaudit.step"] for c in kids] == [st["step"][i] for i in mine]
        assert a["specaudit.verify_steps"] == len(mine)
        for c, i in zip(kids, mine):
            assert c.name == "specaudit.verify_step" and c.context.trace_id == sp.context.trace_id
            ca = c.attributes
            assert ca["specaudit.accepted_depth"] == st["accepted_depth"][i]
            assert ca["specaudit.commit_len"] == st["commit_len"][i]
            assert ca["specaudit.node_count"] == len(st["node_tokens"][i])
            assert ca["specaudit.finished"] == st["finished"][i]
            assert c.start_time == round(st["t_start"][i] * 1e9)
            assert c.end_time == round((st["t_start"][i] + st["step_s"][i]) * 1e9)


def test_sampling_ratio_is_deterministic_and_skips_unsampled_work():
    ids = [str(i) for i in range(2000)]
    kept = [i for i in ids if sampled("run-a", i, 0.25)]
    assert 0.21 < len(kept) / len(ids) < 0.29
    assert kept == [i for i in ids if sampled("run-a", i, 0.25)]          # same decision every time
    assert set(kept) != {i for i in ids if sampled("run-b", i, 0.25)}     # ... per run
    assert all(sampled("r", i, 1.0) for i in ids[:50]) and not any(sampled("r", i, 0.0) for i in ids[:50])

    prov, exp = memory_provider()
    sink = OtelSink(prov, ratio=0.3)
    steps, reqs, manifest = synth_run_rows(n_requests=40, algo="chain", seed=2)
    sink.open_run(manifest)
    for b in steps.to_batches(max_chunksize=8):
        sink.write_steps(b)
    want = {r for r in set(steps.column("request_id").to_pylist()) if sampled(manifest["run_id"], r, 0.3)}
    assert set(sink._steps) == want          # unsampled requests buffer nothing
    for r in reqs.to_pylist():
        sink.write_request(r)
    got = {s.attributes["gen_ai.response.id"] for s in exp.get_finished_spans() if s.parent is None}
    # every sampled request gets a span, also one that ended at prefill (no steps)
    assert got == {r for r in reqs.column("request_id").to_pylist() if sampled(manifest["run_id"], r, 0.3)}
    assert want <= got and 0 < len(got) < 40
    assert not sink._steps and not sink._keep

    with pytest.raises(ValueError, match="within 0..1"):
        OtelSink(prov, ratio=1.5)


def test_traceparent_makes_the_request_span_a_child_of_the_callers_span():
    prov, exp = memory_provider()
    sink = OtelSink(prov)
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    feed(sink, n_requests=2, annotate=lambda rid: sink.annotate(
        rid, {"gen_ai.request.max_tokens": 33}, {"traceparent": f"00-{trace_id}-{span_id}-01"}))
    roots = [s for s in exp.get_finished_spans() if s.name.startswith("text_completion")]
    assert len(roots) == 2
    for s in roots:
        assert format(s.context.trace_id, "032x") == trace_id
        assert format(s.parent.span_id, "016x") == span_id
        assert s.attributes["gen_ai.request.max_tokens"] == 33
    assert not sink._notes


def test_env_decides_whether_to_export():
    assert not env_requests_otel({})
    assert env_requests_otel({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"})
    assert env_requests_otel({"OTEL_TRACES_EXPORTER": "console"})
    assert not env_requests_otel({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    assert not env_requests_otel({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"})


class _Collector(BaseHTTPRequestHandler):
    """A minimal OTLP/HTTP receiver: keeps every POST body by path."""
    got: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).got.append((self.path, self.headers.get("Content-Type"), self.headers.get("x-team"), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def test_otlp_export_is_configured_by_the_standard_variables(monkeypatch):
    from ci import import_or_fail
    import_or_fail("opentelemetry.exporter.otlp.proto.http")   # the otlp extra, in the test extra too
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    _Collector.got = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        env = {"OTEL_TRACES_EXPORTER": "otlp",
               "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{httpd.server_address[1]}/v1/traces",
               "OTEL_EXPORTER_OTLP_HEADERS": "x-team=spec", "OTEL_SERVICE_NAME": "spec-test",
               "OTEL_BSP_SCHEDULE_DELAY": "50"}
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert env_requests_otel()
        sink = OtelSink(ratio=1.0)           # provider from the environment, shut down at close_run
        steps, rows, _ = feed(sink, n_requests=3)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert _Collector.got, "nothing reached the OTLP endpoint"
    names, services = [], set()
    for path, ctype, team, body in _Collector.got:
        assert path == "/v1/traces" and ctype == "application/x-protobuf" and team == "spec"
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            services |= {a.value.string_value for a in rs.resource.attributes if a.key == "service.name"}
            for ss in rs.scope_spans:
                names += [s.name for s in ss.spans]
    assert services == {"spec-test"}
    assert names.count("specaudit.verify_step") == steps.num_rows
    assert sum(n.startswith("text_completion ") for n in names) == len(rows)


def test_unknown_or_missing_exporters_do_not_break_the_sink(caplog):
    prov = provider_from_env({"OTEL_TRACES_EXPORTER": "zipkin-nope,none"})
    sink = OtelSink(prov)
    feed(sink, n_requests=1)
    assert "not supported" in caplog.text
