"""GET /metrics answered by the HTTP metrics middleware, before the app's routing."""
from __future__ import annotations

import asyncio

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram

from specaudit.serve.http import HTTPMetrics


def _call(mw, method, path):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg):
        sent.append(msg)
    asyncio.run(mw({"type": "http", "method": method, "path": path, "headers": []}, receive, send))
    return sent


def _mw(render, app_calls):
    reg = CollectorRegistry()
    req = Counter("http_requests", "r", ["handler", "method", "status"], registry=reg)
    dur = Histogram("http_request_duration_seconds", "d", ["handler", "method"], registry=reg)

    async def app(scope, receive, send):   # the routed app: only reached when the fast path declines
        app_calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"routed"})
    return HTTPMetrics(app, req, dur, metrics=render), req


def test_get_and_head_metrics_skip_the_router_and_are_counted():
    calls = []
    mw, req = _mw(lambda: b"x_total 1.0\n", calls)
    get = _call(mw, "GET", "/metrics")
    assert get[0]["status"] == 200 and get[1]["body"] == b"x_total 1.0\n"
    headers = dict(get[0]["headers"])
    assert headers[b"content-type"] == CONTENT_TYPE_LATEST.encode() and headers[b"content-length"] == b"12"
    head = _call(mw, "HEAD", "/metrics")
    assert head[0]["status"] == 200 and head[1]["body"] == b"" and dict(head[0]["headers"])[b"content-length"] == b"12"
    assert calls == []
    assert req.labels(handler="/metrics", method="GET", status="2xx")._value.get() == 1
    assert req.labels(handler="/metrics", method="HEAD", status="2xx")._value.get() == 1
    # other routes and methods still go through the app
    assert _call(mw, "POST", "/metrics")[1]["body"] == b"routed"
    assert _call(mw, "GET", "/health")[1]["body"] == b"routed"
    assert calls == ["/metrics", "/health"]


def test_a_failing_render_falls_back_to_the_app():
    calls = []

    def boom():
        raise RuntimeError("collector bug")
    mw, _ = _mw(boom, calls)
    assert _call(mw, "GET", "/metrics")[1]["body"] == b"routed" and calls == ["/metrics"]
