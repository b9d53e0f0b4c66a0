"""The HTTP layer: a FastAPI app with the OpenAI routes, SSE streaming and JSON errors.

Routes (errors.py lists the error statuses):
    POST /v1/completions        OpenAI completions, streaming (SSE) or not, with usage
    POST /v1/chat/completions   chat completions; chat.py's template makes the prompt
    GET  /v1/models             the served model
    GET  /health                {"status": "ok" | "degraded" | "draining" | "stopped", ...};
                                503 unless ok
    GET  /metrics               Prometheus text (PromSink families + the HTTP metrics)

Every response of a completion (the body; when streaming, the chunk that carries usage)
has `metrics.speculative_decoding` in vLLM's shape unless --per-request-spec-metrics
none (spec.py).

Disconnects: a client that resets its connection, or whose socket fails a write, is
gone: its job is cancelled and the engine aborts it between steps (finish_reason abort
in the trace). A client that only half-closes (shuts down its sending side after the
request) still gets its whole response (server.HalfCloseH11).

HTTP metrics follow the names vLLM's server exposes (prometheus-fastapi-instrumentator):
`http_requests_total{handler, method, status}` with status grouped as 2xx/4xx/5xx and
`http_request_duration_seconds{handler, method}` (a histogram); handler is the route, or
"none" for unknown paths, so a client cannot grow the label set. Beside them,
`specaudit_http_errors_total{code}` counts error responses by exact status.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specaudit.serve.errors import HTTPError
from specaudit.serve.loop import Job
from specaudit.serve.models import (
    ChatChoice,
    ChatChunk,
    ChatChunkChoice,
    ChatMessageOut,
    ChatResponse,
    CompletionChoice,
    CompletionResponse,
    Delta,
    Parsed,
    Usage,
    parse_request,
)

log = logging.getLogger("specaudit.serve")

MAX_BODY = 1 << 20          # bytes of request body accepted
DRAIN_MAX = 8 * MAX_BODY    # an oversized body up to this is read and dropped, so the client sees the 413
POLL_S = 0.1                # how often a waiting non-streaming handler checks its client
BODY_READ_S = 10.0          # the whole request body must arrive within this (a slow body is cut: 408)
BODY_POLL_S = 0.25          # how often a body read looks at its deadline and at a shutdown
ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
METHODS = ("GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS")


def _reason(r: str | None) -> str:
    return {"eos": "stop", "length": "length"}.get(r or "", r or "abort")


class HTTPMetrics:
    """Pure ASGI middleware (streaming passes through untouched) counting requests and
    timing them under the ecosystem's names; see the module docstring."""

    def __init__(self, app, requests_total, duration, metrics=None):
        self.app, self.requests_total, self.duration = app, requests_total, duration
        self.metrics = metrics   # () -> exposition bytes: GET /metrics answered here, see _scrape

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = [500]
        if self.metrics is not None and scope.get("path") == "/metrics" and scope.get("method") in ("GET", "HEAD"):
            if await self._scrape(scope, send):
                status[0] = 200
                self._count("/metrics", scope["method"], status[0], t0)
                return

        async def send_wrapped(msg):
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)
        try:
            await self.app(scope, receive, send_wrapped)
        finally:
            self._count(scope.get("path", ""), scope.get("method", ""), status[0], t0)

    def _count(self, path: str, method: str, status: int, t0: float) -> None:
        handler = path if path in ROUTES else "none"
        method = method if method in METHODS else "other"
        self.requests_total.labels(handler=handler, method=method, status=f"{status // 100}xx").inc()
        self.duration.labels(handler=handler, method=method).observe(time.perf_counter() - t0)

    async def _scrape(self, scope, send) -> bool:
        """GET/HEAD /metrics straight from the ASGI scope: a 10 Hz scraper should not pay
        for routing, dependency solving and a Response object on a thread that shares
        the GIL with the decode loop. False (nothing sent) when rendering fails: the
        app's own /metrics route then answers, or its error handler does."""
        from prometheus_client import CONTENT_TYPE_LATEST
        try:
            data = self.metrics()
        except Exception:
            return False
        headers = [(b"content-type", CONTENT_TYPE_LATEST.encode()), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else data})
        return True


def build_app(srv) -> FastAPI:
    """The app over a SpecServer `srv` (its loop, tracer, registry and settings)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    def render_metrics() -> bytes:
        t0 = time.thread_time()
        data = srv.exposition.render()
        srv.scrape_cpu.inc(time.thread_time() - t0)   # what scraping costs the server, in CPU seconds
        return data

    app.add_middleware(HTTPMetrics, requests_total=srv.http_requests, duration=srv.http_duration,
                       metrics=render_metrics)

    def error(e: HTTPError, headers=None) -> JSONResponse:
        srv.count_error(e.status)
        return JSONResponse(e.body(), status_code=e.status, headers=headers)

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, e: HTTPError):
        return error(e)

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(request: Request, e: StarletteHTTPException):
        path = request.url.path
        if e.status_code == 404:
            err = HTTPError(404, f"no route {path[:200]}; try POST /v1/completions, POST /v1/chat/completions, "
                                 "GET /v1/models, /health, /metrics", "not_found")
        elif e.status_code == 405:
            allow = (e.headers or {}).get("Allow", "")
            err = HTTPError(405, f"{request.method[:20]} is not allowed on {path}; use {allow or 'another method'}",
                            "method_not_allowed")
        else:
            err = HTTPError(e.status_code, str(e.detail)[:200], "http_error")
        return error(err, headers=e.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception):   # ours, not the client's: log it whole
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error(HTTPError(500, f"internal error: {type(e).__name__}", "internal_error"))

    async def body_chunks(request: Request):
        """The body's pieces, read with a deadline for the whole body (BODY_READ_S: a client
        sending a byte a second is answered 408 and its connection closed) and given up
        at once when the server shuts down (503), so neither holds a connection open.
        A client that leaves mid-body raises ClientDisconnect (answered by nobody)."""
        from starlette.requests import ClientDisconnect
        end = time.monotonic() + BODY_READ_S
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise HTTPError(408, f"the request body did not arrive within {BODY_READ_S:g} s", "body_timeout")
            if srv.loop.closing:
                raise HTTPError(503, "the server is shutting down", "shutting_down")
            try:   # receive() waits on an event: cancelling the wait loses no bytes
                msg = await asyncio.wait_for(request.receive(), min(left, BODY_POLL_S))
            except asyncio.TimeoutError:
                continue
            if msg["type"] == "http.disconnect":
                raise ClientDisconnect()
            yield msg.get("body", b"")
            if not msg.get("more_body", False):
                return

    async def read_body(request: Request) -> bytes:
        cl = request.headers.get("content-length")
        declared = int(cl) if cl is not None and cl.isdigit() else None
        if declared is not None and declared > DRAIN_MAX:
            raise HTTPError(413, f"body of {declared} bytes exceeds the limit of {MAX_BODY}", "body_too_large")
        chunks, n = [], 0
        async for c in body_chunks(request):
            n += len(c)
            if n <= MAX_BODY:
                chunks.append(c)
            elif n > DRAIN_MAX:
                break
        if n > MAX_BODY:
            raise HTTPError(413, f"body of {declared or n}{'' if declared else '+'} bytes exceeds the limit of "
                                 f"{MAX_BODY}", "body_too_large")
        return b"".join(chunks)

    def spec_block(job: Job) -> dict | None:
        rs = srv.spec_tap.pop(job.rid)
        if srv.spec_mode == "none":
            return None
        return {"speculative_decoding": rs.block(srv.budget, detailed=srv.spec_mode == "detailed")}

    def usage(job: Job, n_out: int) -> Usage:
        p = len(job.req.prompt)
        return Usage(prompt_tokens=p, completion_tokens=n_out, total_tokens=p + n_out)

    async def completion(request: Request, chat: bool):
        from starlette.requests import ClientDisconnect
        try:
            body = await read_body(request)
        except ClientDisconnect:   # the client left mid-body: nobody to answer, nothing to log
            return Response(status_code=499)
        p = parse_request(body, chat=chat, model=srv.model, max_tokens_limit=srv.max_tokens_limit,
                          context=srv.context, codec=srv.codec)
        rid = srv.request_id("chatcmpl" if chat else "cmpl", request.headers.get("x-request-id"))
        carrier = {k: v for k, v in request.headers.items() if k in ("traceparent", "tracestate")}
        job = Job(rid, p.prompt, p.max_tokens,
                  attributes={"gen_ai.request.max_tokens": p.max_tokens, "specaudit.stream": p.stream},
                  carrier=carrier or None, aio_loop=asyncio.get_running_loop())
        srv.loop.submit(job)
        if p.stream:
            return StreamingResponse(stream(job, p), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Request-ID": rid})
        resp = await whole(request, job, p)
        resp.headers["X-Request-ID"] = rid
        return resp

    async def whole(request: Request, job: Job, p: Parsed):
        decode = srv.codec.decode
        out: list[int] = []
        try:
            while True:
                try:
                    kind, data = await asyncio.wait_for(job.events.get(), POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        srv.loop.cancel(job)
                        srv.spec_tap.pop(job.rid)
                        return Response(status_code=499)   # nobody reads it
                    continue
                if kind == "tokens":
                    out.extend(data)
                    continue
                if kind == "error":
                    srv.spec_tap.pop(job.rid)
                    raise data
                if data == "abort":
                    srv.spec_tap.pop(job.rid)
                    raise HTTPError(503, "the request was aborted (server shutting down)", "aborted")
                break
        except asyncio.CancelledError:
            srv.loop.cancel(job)
            raise
        common = dict(id=job.rid, created=int(job.req.t_arrive), model=srv.model, system_fingerprint=srv.run_id,
                      usage=usage(job, len(out)), metrics=spec_block(job))
        if p.chat:
            r = ChatResponse(choices=[ChatChoice(message=ChatMessageOut(content=decode(out)),
                                                 finish_reason=_reason(data))], **common)
        else:
            r = CompletionResponse(choices=[CompletionChoice(text=decode(out), finish_reason=_reason(data))],
                                   **common)
        return Response(r.model_dump_json(exclude_none=True), media_type="application/json")

    async def stream(job: Job, p: Parsed):
        created = int(job.req.t_arrive)
        dec = srv.codec.stream_decoder()   # text deltas across steps (serve/codec.py)
        n_out = 0
        finished = False

        def sse(obj) -> str:
            return "data: " + (obj.model_dump_json(exclude_none=True) if hasattr(obj, "model_dump_json")
                               else json.dumps(obj)) + "\n\n"

        def text_chunk(text: str | None, reason: str | None = None, role: str | None = None, u=None, m=None):
            if p.chat:
                delta = Delta(role=role, content=text)
                ch = [] if u is not None and reason is None and text is None else [
                    ChatChunkChoice(delta=delta, finish_reason=reason)]
                return ChatChunk(id=job.rid, created=created, model=srv.model, system_fingerprint=srv.run_id,
                                 choices=ch, usage=u, metrics=m)
            ch = [] if u is not None and reason is None and text is None else [
                {"text": text or "", "index": 0, "logprobs": None, "finish_reason": reason}]
            obj = {"id": job.rid, "object": "text_completion", "created": created, "model": srv.model,
                   "system_fingerprint": srv.run_id, "choices": ch}
            if u is not None:
                obj["usage"] = u.model_dump()
            if m is not None:
                obj["metrics"] = m
            return obj
        try:
            if p.chat:
                yield sse(text_chunk("", role="assistant"))
            while True:
                kind, data = await job.events.get()
                if kind == "tokens":
                    n_out += len(data)
                    text = dec.push(data)
                    if text:
                        yield sse(text_chunk(text))
                    continue
                finished = True
                if kind == "error":
                    srv.count_error(data.status)
                    srv.spec_tap.pop(job.rid)
                    yield "data: " + json.dumps(data.body()) + "\n\n"
                    yield "data: [DONE]\n\n"
                    return
                tail = dec.flush()
                u, m = usage(job, n_out), spec_block(job)
                if p.include_usage:
                    yield sse(text_chunk(tail, reason=_reason(data)))
                    yield sse(text_chunk(None, u=u, m=m))
                else:   # usage and the spec block ride on the last choice chunk
                    yield sse(text_chunk(tail, reason=_reason(data), u=u, m=m))
                yield "data: [DONE]\n\n"
                return
        finally:
            if not finished:          # the client went away (or the stream was cancelled)
                srv.loop.cancel(job)
                srv.spec_tap.pop(job.rid)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await completion(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await completion(request, chat=True)

    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    async def models():
        return {"object": "list", "data": [{"id": srv.model, "object": "model", "created": int(srv.started_at),
                                            "owned_by": "specaudit", "max_model_len": srv.context}]}

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        h = srv.health()
        return JSONResponse(h, status_code=200 if h["status"] == "ok" else 503)

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST  # HTTPMetrics answers first; this is its fallback
        return Response(render_metrics(), media_type=CONTENT_TYPE_LATEST)

    return app
