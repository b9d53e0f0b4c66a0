"""An OpenAI-compatible HTTP server over the reference runtime, traced and metered.

    srv = SpecServer(trace_dir="traces/", algo="chain", budget=7, concurrency=8).start()
    # POST {srv.url}/v1/completions   {"model": ..., "prompt": "def f(", "max_tokens": 64}
    srv.close()                       # aborts what runs, writes requests.parquet + reported

Endpoints (one port, bound to 127.0.0.1 unless told otherwise):
    POST /v1/completions   OpenAI completions, streaming (SSE) or not, with `usage`
    GET  /v1/models        the served model
    GET  /health           {"status": "ok", running, queued, ...}
    GET  /metrics          Prometheus text (specaudit.prom.PromSink families)

Threads. The stdlib ThreadingHTTPServer gives each connection a thread; those threads
only parse, validate, enqueue a Job and wait on its event queue. One engine thread
owns the SpecEngine (not thread-safe): between steps it aborts cancelled jobs, prefills
queued ones into free slots (continuous batching), runs one batched verify step and
hands every job the tokens the step appended. The tracer's own thread feeds the sinks
(Parquet, Prometheus, OpenTelemetry), so neither HTTP nor metrics touch the step loop.

Disconnects. A waiting handler peeks at its socket every 100 ms; a streaming handler
also fails its next write. Either way the job is cancelled, the engine aborts the
request between steps and its trace row is closed with finish_reason `abort`.

Errors are OpenAI-shaped JSON, `{"error": {"message", "type", "param", "code"}}`:
    400  malformed JSON, a body that is not an object, prompt + max_tokens past the context
    404  unknown path or model        405  wrong method        411  no Content-Length
    413  body over the size limit, or a prompt that alone fills the context
    422  unknown fields, wrong types, max_tokens <= 0 or above the limit, sampling options
         this greedy (lossless) server does not implement
    503  the queue is full, or the server is shutting down
"""
from __future__ import annotations

import codecs
import json
import logging
import math
import queue
import secrets
import select
import socket
import threading
import time
import traceback
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

log = logging.getLogger("specaudit.serve")

MAX_BODY = 1 << 20          # bytes of request body accepted
DEFAULT_MAX_TOKENS = 16     # OpenAI's default when max_tokens is omitted
POLL_S = 0.1                # how often a waiting handler checks its client


class HTTPError(Exception):
    """An error answered as OpenAI-shaped JSON."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 etype: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.etype = status, message, code, param, etype

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.etype, "param": self.param, "code": self.code}}


# ------------------------------------------------------------------- validation

def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _only(value_ok, msg):
    """A validator: accept `value_ok(v)` (None always ok), else 422 with msg."""
    def check(name, v):
        if v is not None and not value_ok(v):
            raise HTTPError(422, f"{name}: {msg} (got {json.dumps(v)[:80]})", "unsupported_value", name)
    return check


# Fields the completions endpoint accepts besides model, prompt, max_tokens, stream and
# stream_options. Decoding is greedy (it is what makes speculative decoding lossless):
# sampling options are accepted only at their greedy values, never silently ignored.
OPTIONAL_FIELDS = {
    "temperature": _only(lambda v: _num(v) and v == 0, "this server decodes greedily; use 0 or omit it"),
    "top_p": _only(lambda v: _num(v) and v == 1, "this server decodes greedily; use 1 or omit it"),
    "n": _only(lambda v: _is_int(v) and v == 1, "one choice per request"),
    "best_of": _only(lambda v: _is_int(v) and v == 1, "one choice per request"),
    "echo": _only(lambda v: v is False, "echo is not supported"),
    "logprobs": _only(lambda v: False, "logprobs are not supported"),
    "stop": _only(lambda v: v == [] or v == "", "stop sequences are not supported (the model stops at EOS)"),
    "suffix": _only(lambda v: False, "suffix is not supported"),
    "presence_penalty": _only(lambda v: _num(v) and v == 0, "penalties are not supported"),
    "frequency_penalty": _only(lambda v: _num(v) and v == 0, "penalties are not supported"),
    "logit_bias": _only(lambda v: v == {}, "logit_bias is not supported"),
    "seed": _only(_is_int, "must be an integer (greedy decoding is deterministic anyway)"),
    "user": _only(lambda v: isinstance(v, str), "must be a string"),
}
KNOWN_FIELDS = ("model", "prompt", "max_tokens", "stream", "stream_options") + tuple(OPTIONAL_FIELDS)


def parse_completion_request(body: bytes, *, model: str, max_tokens_limit: int, context: int) -> dict:
    """Validate a /v1/completions body. Returns {prompt (byte tokens), max_tokens, stream,
    include_usage}; raises HTTPError with the status the module docstring lists."""
    from specaudit.tokenizer import encode
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HTTPError(400, f"malformed JSON body: {getattr(e, 'msg', e)}"
                             + (f" at line {e.lineno} column {e.colno}" if hasattr(e, "lineno") else ""),
                        "invalid_json") from None
    if not isinstance(obj, dict):
        raise HTTPError(400, "the body must be a JSON object", "invalid_json")
    unknown = sorted(set(obj) - set(KNOWN_FIELDS))
    if unknown:
        raise HTTPError(422, f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                             f"accepted: {', '.join(KNOWN_FIELDS)}", "unknown_field", unknown[0])
    m = obj.get("model")
    if m is not None and not isinstance(m, str):
        raise HTTPError(422, "model: must be a string", "invalid_type", "model")
    if m is not None and m != model:
        raise HTTPError(404, f"model {m!r} is not served here; GET /v1/models lists {model!r}",
                        "model_not_found", "model")
    p = obj.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]                                  # ["text"]: one prompt in a list
    if isinstance(p, str):
        tokens = encode(p)
    elif isinstance(p, list) and p and all(_is_int(t) for t in p):
        if not all(0 <= t < 256 for t in p):
            raise HTTPError(422, "prompt: token ids are bytes, 0..255", "invalid_value", "prompt")
        tokens = list(p)
    elif p is None:
        raise HTTPError(422, "prompt: required", "missing_field", "prompt")
    else:
        raise HTTPError(422, "prompt: a string, a list with one string, or a list of token ids "
                             "(several prompts per request are not supported)", "invalid_type", "prompt")
    if not tokens:
        raise HTTPError(422, "prompt: empty", "invalid_value", "prompt")
    mt = obj.get("max_tokens")
    if mt is None:
        mt = min(DEFAULT_MAX_TOKENS, max_tokens_limit)
    elif not _is_int(mt):
        raise HTTPError(422, "max_tokens: must be an integer", "invalid_type", "max_tokens")
    elif not 1 <= mt <= max_tokens_limit:
        raise HTTPError(422, f"max_tokens: must be within 1..{max_tokens_limit} (got {mt})", "invalid_value",
                        "max_tokens")
    if len(tokens) >= context:
        raise HTTPError(413, f"prompt of {len(tokens)} tokens does not fit the context of {context} tokens",
                        "prompt_too_long", "prompt")
    if len(tokens) + mt > context:
        raise HTTPError(400, f"prompt of {len(tokens)} tokens + max_tokens {mt} exceeds the context of "
                             f"{context} tokens; lower max_tokens to {context - len(tokens)} or less",
                        "context_length_exceeded", "max_tokens")
    stream = obj.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise HTTPError(422, "stream: must be true or false", "invalid_type", "stream")
    so = obj.get("stream_options")
    include_usage = False
    if so is not None:
        if not isinstance(so, dict) or set(so) - {"include_usage"}:
            raise HTTPError(422, "stream_options: only {\"include_usage\": bool} is supported", "invalid_value",
                            "stream_options")
        if not stream:
            raise HTTPError(422, "stream_options: only allowed with stream: true", "invalid_value", "stream_options")
        include_usage = bool(so.get("include_usage"))
    for name, check in OPTIONAL_FIELDS.items():
        if name in obj:
            check(name, obj[name])
    return {"prompt": tokens, "max_tokens": mt, "stream": stream, "include_usage": include_usage}


# ------------------------------------------------------------------------ jobs

class Job:
    """One completion request on its way through the engine thread.

    events: ("tokens", [int]) for each step's newly appended tokens, then ("done",
    finish_reason) or ("error", HTTPError). Only the engine thread writes `req`.
    """

    def __init__(self, rid: str, prompt: list[int], max_tokens: int, attributes=None, carrier=None):
        from specaudit.runtime.engine import Request
        self.rid = rid
        self.req = Request(request_id=rid, prompt=prompt, max_new_tokens=max_tokens, t_arrive=time.time())
        self.events: queue.Queue = queue.Queue()
        self.sent = 0
        self.cancelled = False
        self.attributes, self.carrier = attributes or {}, carrier

    def push_new(self) -> int:
        out = self.req.output
        if len(out) > self.sent:
            new = out[self.sent:]
            self.sent = len(out)
            self.events.put(("tokens", new))
            return len(new)
        return 0


class Busy(Exception):
    pass


class EngineLoop:
    """The one thread that touches the SpecEngine. See the module docstring."""

    def __init__(self, engine, prom=None, otel=None, estimator=None, max_queue: int = 256):
        self.engine = engine
        self.prom, self.otel, self.estimator = prom, otel, estimator
        self.max_queue = max_queue
        self._cv = threading.Condition()
        self._pending: deque[Job] = deque()
        self._cancels: list[Job] = []
        self._running: dict[str, Job] = {}
        self._stop = False
        self.n_running = 0
        self.n_queued = 0
        self.steps = 0
        self.errors = 0
        self.thread = threading.Thread(target=self._run, name="specaudit-engine", daemon=True)

    def start(self) -> EngineLoop:
        self.thread.start()
        return self

    def submit(self, job: Job) -> None:
        with self._cv:
            if self._stop:
                raise HTTPError(503, "the server is shutting down", "shutting_down", etype="server_error")
            if len(self._pending) >= self.max_queue:
                raise HTTPError(503, f"the queue is full ({self.max_queue} requests waiting); retry later",
                                "queue_full", etype="server_error")
            self._pending.append(job)
            self.n_queued = len(self._pending)
            self._cv.notify()

    def cancel(self, job: Job) -> None:
        """The client went away: drop a queued job, or abort a running one between steps."""
        with self._cv:
            job.cancelled = True
            try:
                self._pending.remove(job)
                self.n_queued = len(self._pending)
                job.events.put(("done", "abort"))    # never prefilled: nothing was traced
            except ValueError:
                self._cancels.append(job)
                self._cv.notify()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self.thread.join(timeout)

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        eng = self.engine
        while True:
            with self._cv:
                while not (self._pending or self._cancels or self._running or self._stop):
                    self._cv.wait(1.0)
                    if self.estimator is not None:
                        self.estimator.tick(self.prom)
                if self._stop:
                    break
                cancels, self._cancels = self._cancels, []
                admit = []
                free = len(eng.free_slots())
                while self._pending and len(admit) < free:
                    admit.append(self._pending.popleft())
                self.n_queued = len(self._pending)
            for job in cancels:
                if self._running.pop(job.rid, None) is not None:
                    eng.abort(job.req)
                    job.push_new()
                    job.events.put(("done", "abort"))
            for job in admit:
                self._admit(job)
            if self._running:
                self._step()
            self.n_running = len(self._running)
            if self.prom is not None:
                self.prom.set_load(self.n_running, self.n_queued)
            if self.estimator is not None:
                self.estimator.tick(self.prom)
        # shutting down: everything still here ends as abort (traced where prefilled)
        with self._cv:
            pending, self._pending = list(self._pending), deque()
        for job in pending:
            job.events.put(("done", "abort"))
        for job in list(self._running.values()):
            eng.abort(job.req)
            job.push_new()
            job.events.put(("done", "abort"))
        self._running.clear()
        self.n_running = self.n_queued = 0
        if self.prom is not None:
            self.prom.set_load(0, 0)

    def _admit(self, job: Job) -> None:
        if self.otel is not None and (job.attributes or job.carrier):
            self.otel.annotate(job.rid, job.attributes, job.carrier)
        try:
            self.engine.add(job.req)
        except ValueError as e:  # the engine's own fit check (validated before, kept as a guard)
            job.events.put(("error", HTTPError(400, str(e), "context_length_exceeded")))
            return
        except Exception as e:  # noqa: BLE001  a failed prefill must not kill the loop
            log.error("prefill of %s failed: %s", job.rid, traceback.format_exc())
            self.errors += 1
            job.events.put(("error", HTTPError(500, f"prefill failed: {e!r}", "engine_error", etype="server_error")))
            return
        job.push_new()   # the prefill's first token (not decode throughput: the estimator skips it)
        if job.req.finished:
            job.events.put(("done", job.req.finish_reason))
        else:
            self._running[job.rid] = job

    def _step(self) -> None:
        rows = len(self._running)
        t0 = time.perf_counter()
        try:
            finished = self.engine.step()
        except Exception as e:  # noqa: BLE001  abort the batch, keep serving
            log.error("verify step failed; aborting %d requests: %s", rows, traceback.format_exc())
            self.errors += 1
            for job in list(self._running.values()):
                self.engine.abort(job.req)
                job.events.put(("error", HTTPError(500, f"verify step failed: {e!r}", "engine_error",
                                                   etype="server_error")))
            self._running.clear()
            return
        dt = time.perf_counter() - t0
        self.steps += 1
        tokens = 0
        for job in self._running.values():
            tokens += job.push_new()
        for r in finished:
            job = self._running.pop(r.request_id, None)
            if job is not None:
                job.events.put(("done", r.finish_reason))
        if self.estimator is not None:
            self.estimator.on_step(dt, rows, tokens)


# ------------------------------------------------------------------- estimator

class LiveEstimator:
    """The throughput-derived commit length over a sliding window, for two gauges.

    Observed: tokens really appended per request-second of decoding (the tokens handed
    to clients, not the engine's counter), i.e. per-request tokens/s at the running
    concurrency. With the plain-greedy per-request rate `baseline_tps` (from the option
    or from the profile's t_ar at that concurrency) and the cost factor r(N, c) of a
    calibration profile (or --cost-factor), specaudit.estimate gives C = tps / base * r.
    Beside it: the mean commit length the engine's own counters report over the same
    window. Both go to PromSink.set_commit_lengths every `every_s` seconds.
    """

    def __init__(self, metrics, n_nodes: int, baseline_tps: float | None = None, cost_factor: float | None = None,
                 cost_factor_std: float | None = None, profile=None, window_s: float = 30.0, every_s: float = 1.0):
        self.metrics = metrics          # the engine's SpecMetrics (the counters under audit)
        self.n_nodes = n_nodes
        self.baseline_tps, self.profile = baseline_tps, profile
        if profile is None and cost_factor is not None:
            from specaudit.audit.estimate import CostProfile
            self.profile = CostProfile.manual(cost_factor, cost_factor_std)
        self.enabled = self.profile is not None and (baseline_tps is not None or self._profile_has_t_ar())
        self.window_s, self.every_s = window_s, every_s
        self._acc = [0, 0.0, 0, 0]       # tokens, request-seconds, rows, forwards since the last tick
        self._samples: deque = deque()   # (t, tokens, req_s, rows, forwards, verify_steps, sum_commit)
        self._last = time.monotonic()
        self._warned = False
        self.last = None                 # the last Estimate (tests and /health read it)

    def _profile_has_t_ar(self) -> bool:
        return self.profile is not None and any(e.t_ar_s and e.concurrency is not None
                                                for e in self.profile.entries)

    def on_step(self, dt: float, rows: int, tokens: int) -> None:
        self._acc[0] += tokens
        self._acc[1] += dt * rows
        self._acc[2] += rows
        self._acc[3] += 1

    def _base_at(self, c: int) -> float:
        """Plain per-request tokens/s at concurrency c: the option, else the profile's t_ar
        as `specaudit estimate` reads it (profile_t_ar), c clamped into the profile's grid."""
        if self.baseline_tps is not None:
            return self.baseline_tps
        from specaudit.audit.estimate import profile_t_ar
        cs = [e.concurrency for e in self.profile.entries if e.t_ar_s and e.concurrency is not None]
        return 1.0 / profile_t_ar(self.profile, min(max(c, min(cs)), max(cs)))

    def tick(self, prom) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        m = self.metrics
        tok, req_s, rows, fwd = self._acc
        self._acc = [0, 0.0, 0, 0]
        self._samples.append((now, tok, req_s, rows, fwd, m.verify_steps, m.sum_commit))
        while self._samples and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()
        if len(self._samples) < 2:
            return
        first, last = self._samples[0], self._samples[-1]
        d_steps = last[5] - first[5]
        reported = (last[6] - first[6]) / d_steps if d_steps > 0 else None
        est = None
        body = list(self._samples)[1:]
        tokens = sum(s[1] for s in body)
        reqsec = sum(s[2] for s in body)
        if self.enabled and tokens > 0 and reqsec > 0:
            try:
                from specaudit.audit.estimate import estimate_commit_length, mean_and_se
                rates = [s[1] / s[2] for s in body if s[2] > 0]
                _, se, _ = mean_and_se(rates)
                tps = tokens / reqsec
                c = max(1, round(sum(s[3] for s in body) / max(sum(s[4] for s in body), 1)))  # mean batch
                r, r_std = self.profile.lookup(self.n_nodes, c)
                est = estimate_commit_length(tps, self._base_at(c), r, cost_factor_std=r_std,
                                             tps_std=se if math.isfinite(se) else 0.0)
                self.last = est
            except ImportError:
                if not self._warned:
                    log.warning("specaudit.estimate is not available: the estimated commit length gauge stays 0")
                    self._warned = True
            except Exception as e:  # noqa: BLE001  an estimate is advisory: log once, keep serving
                if not self._warned:
                    log.warning("commit length estimate skipped: %s", e)
                    self._warned = True
        if prom is not None:
            prom.set_commit_lengths(reported, est)


# ---------------------------------------------------------------------- HTTP

def _reason(r: str | None) -> str:
    return {"eos": "stop", "length": "length"}.get(r or "", r or "abort")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "specaudit"
    sys_version = ""
    srv: SpecServer  # set on the subclass made per server
    _next_peer_check = 0.0

    def log_message(self, fmt, *args):  # quiet by default; --log-requests turns it on
        if self.srv.log_requests:
            log.info("%s %s", self.address_string(), fmt % args)

    # ------------------------------------------------------------- plumbing
    def _send_json(self, status: int, obj, close: bool = False) -> None:
        data = (json.dumps(obj) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _error(self, e: HTTPError, close: bool = False) -> None:
        self.srv.count_error(e.status)
        try:
            self._send_json(e.status, e.body(), close=close)
        except OSError:
            self.close_connection = True

    def _peer_gone(self) -> bool:
        """True when the client closed its end (EOF readable) or reset the connection."""
        try:
            if hasattr(select, "poll"):  # poll, not select: descriptors above 1023 are fine
                p = select.poll()
                p.register(self.connection, select.POLLIN | select.POLLHUP | select.POLLERR)
                if not p.poll(0):
                    return False
            elif not select.select([self.connection], [], [], 0)[0]:
                return False
            return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except (OSError, ValueError):
            return True

    # --------------------------------------------------------------- routes
    def do_GET(self):
        path = self.path.split("?", 1)[0]
        s = self.srv
        if path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST
            t0 = time.thread_time()
            data = s.exposition.render()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            s.scrape_cpu.inc(time.thread_time() - t0)   # what scraping costs the server, in CPU seconds
        elif path == "/health":
            self._send_json(200, s.health())
        elif path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [
                {"id": s.model, "object": "model", "created": int(s.started_at), "owned_by": "specaudit"}]})
        elif path in ("/v1/completions",):
            self._error(HTTPError(405, "use POST for /v1/completions", "method_not_allowed"))
        else:
            self._error(HTTPError(404, f"no route {path}; try POST /v1/completions, GET /v1/models, /health, "
                                       "/metrics", "not_found"))

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        length = self.headers.get("Content-Length")
        if path != "/v1/completions":
            status = 405 if path in ("/metrics", "/health", "/v1/models") else 404
            self._error(HTTPError(status, f"{'use GET for' if status == 405 else 'no route'} {path}",
                                  "method_not_allowed" if status == 405 else "not_found"), close=True)
            return
        if length is None:
            self._error(HTTPError(411, "Content-Length is required", "length_required"), close=True)
            return
        try:
            n = int(length)
            if n < 0:
                raise ValueError
        except ValueError:
            self._error(HTTPError(400, f"bad Content-Length {length!r}", "bad_request"), close=True)
            return
        if n > MAX_BODY:
            self._error(HTTPError(413, f"body of {n} bytes exceeds the limit of {MAX_BODY}", "body_too_large"),
                        close=True)
            return
        body = self.rfile.read(n)
        s = self.srv
        try:
            req = parse_completion_request(body, model=s.model, max_tokens_limit=s.max_tokens_limit,
                                           context=s.context)
        except HTTPError as e:
            self._error(e)
            return
        rid = f"cmpl-{secrets.token_hex(12)}"
        carrier = {k.lower(): v for k, v in self.headers.items() if k.lower() in ("traceparent", "tracestate")}
        job = Job(rid, req["prompt"], req["max_tokens"],
                  attributes={"gen_ai.request.max_tokens": req["max_tokens"],
                              "specaudit.stream": req["stream"]}, carrier=carrier or None)
        try:
            s.loop.submit(job)
        except HTTPError as e:
            self._error(e)
            return
        if req["stream"]:
            self._stream(job, req)
        else:
            self._complete(job, req)

    def _wait(self, job: Job):
        """Next event of the job; cancels it and returns None when the client left."""
        # Check the client every POLL_S whether or not events keep coming: a non-streaming
        # handler receives tokens every step and would otherwise never look.
        while True:
            now = time.monotonic()
            if now >= self._next_peer_check:
                self._next_peer_check = now + POLL_S
                if self._peer_gone():
                    self.srv.loop.cancel(job)
                    self.close_connection = True
                    return None
            try:
                return job.events.get(timeout=max(0.0, self._next_peer_check - now))
            except queue.Empty:
                continue

    def _usage(self, job: Job, n_out: int) -> dict:
        p = len(job.req.prompt)
        return {"prompt_tokens": p, "completion_tokens": n_out, "total_tokens": p + n_out}

    def _complete(self, job: Job, req: dict) -> None:
        from specaudit.tokenizer import decode
        out: list[int] = []
        while True:
            ev = self._wait(job)
            if ev is None:
                return
            kind, data = ev
            if kind == "tokens":
                out.extend(data)
            elif kind == "error":
                self._error(data)
                return
            else:
                if data == "abort":
                    self._error(HTTPError(503, "the request was aborted (server shutting down)", "aborted",
                                          etype="server_error"))
                    return
                s = self.srv
                self._send_json(200, {
                    "id": job.rid, "object": "text_completion", "created": int(job.req.t_arrive),
                    "model": s.model, "system_fingerprint": s.run_id,
                    "choices": [{"text": decode(out), "index": 0, "logprobs": None,
                                 "finish_reason": _reason(data)}],
                    "usage": self._usage(job, len(out))})
                return

    def _chunk(self, payload: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))

    def _stream(self, job: Job, req: dict) -> None:
        s = self.srv
        created = int(job.req.t_arrive)
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        n_out = 0

        def event(choices, usage=None) -> bytes:
            obj = {"id": job.rid, "object": "text_completion", "created": created, "model": s.model,
                   "system_fingerprint": s.run_id, "choices": choices}
            if usage is not None:
                obj["usage"] = usage
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        started = False
        try:
            while True:
                ev = self._wait(job)
                if ev is None:
                    return
                kind, data = ev
                if kind == "error" and not started:
                    self._error(data)
                    return
                if not started:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    started = True
                if kind == "tokens":
                    n_out += len(data)
                    # bytes -> text across step boundaries: a UTF-8 character may span two steps
                    text = dec.decode(bytes(t for t in data if 0 < t < 256))
                    if text:
                        self._chunk(event([{"text": text, "index": 0, "logprobs": None, "finish_reason": None}]))
                    continue
                if kind == "error":
                    err = json.dumps(data.body()).encode()
                    self._chunk(b"data: " + err + b"\n\n")
                    self._chunk(b"data: [DONE]\n\n")
                    self.wfile.write(b"0\r\n\r\n")
                    return
                tail = dec.decode(b"", final=True)
                usage = self._usage(job, n_out)
                self._chunk(event([{"text": tail, "index": 0, "logprobs": None, "finish_reason": _reason(data)}],
                                  usage=None if req["include_usage"] else usage))
                if req["include_usage"]:
                    self._chunk(event([], usage=usage))
                self._chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                return
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError):
            self.srv.loop.cancel(job)
            self.close_connection = True


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256     # listen backlog: bursts of many clients must not be refused
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        import sys
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return  # a client that went away between requests: not an error of ours
        log.error("error serving %s: %s", client_address, traceback.format_exc())


# ---------------------------------------------------------------------- server

class SpecServer:
    """The reference runtime behind HTTP, traced into `trace_dir` and metered.

    models: (target, drafter, info) to skip loading the embedded pair (tests).
    otel: an OtelSink, or True to build one from the OTEL_* variables, or None.
    estimator options: baseline_tps, cost_factor[, cost_factor_std] or a calibration
    profile path (specaudit.estimate.CostProfile); without them the estimate gauge is 0.
    """

    def __init__(self, *, trace_dir, algo="chain", budget=7, topk=1, concurrency=8, max_new_tokens=256,
                 inject=None, seed=0, device="cpu", dtype="float32", eos_id=None, run_id=None,
                 host="127.0.0.1", port=8000, models=None, otel=None, otel_ratio=1.0,
                 baseline_tps=None, cost_factor=None, cost_factor_std=None, calibration=None,
                 estimate_window_s=30.0, max_queue=256, log_requests=False, flush_s=5.0):
        import torch
        from prometheus_client import CollectorRegistry, Counter

        from specaudit.model import EOS_ID, default_models
        from specaudit.trace.prom_sink import FastExposition, PromSink
        from specaudit.run import check_device, new_run_id, reference_manifest
        from specaudit.runtime.engine import SpecConfig, SpecEngine
        from specaudit.runtime.faults import get_fault
        from specaudit.trace.parquet import ParquetSink, prepare_run_dir
        from specaudit.trace.tracer import Tracer

        check_device(device, dtype)
        if not 0 <= port <= 65535:
            raise ValueError(f"--port must be within 0..65535 (got {port})")
        if max_queue < 1:
            raise ValueError(f"--max-queue must be at least 1 (got {max_queue})")
        get_fault(inject)
        profile = None
        if calibration is not None:
            from specaudit.audit.estimate import CostProfile
            profile = CostProfile.load(calibration)
        if baseline_tps is not None and not (baseline_tps > 0 and math.isfinite(baseline_tps)):
            raise ValueError(f"--baseline-tps must be a positive number (got {baseline_tps})")
        if cost_factor is not None and not (cost_factor > 0 and math.isfinite(cost_factor)):
            raise ValueError(f"--cost-factor must be a positive number (got {cost_factor})")
        cfg = SpecConfig(algo=algo, budget=budget, topk=topk, max_new_tokens=max_new_tokens,
                         concurrency=concurrency, eos_id=EOS_ID if eos_id is None else eos_id, fault=inject)
        target, drafter, info = models if models is not None else default_models(device, getattr(torch, dtype))
        cfg.validate(drafter.depth)
        self.context = target.max_seq_len
        if max_new_tokens >= self.context:
            raise ValueError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the context of "
                             f"{self.context} tokens")
        self.run_id = run_id or ("serve-" + new_run_id(algo, budget, topk, concurrency, inject))
        prepare_run_dir(Path(trace_dir), self.run_id)   # refuse early: nothing half-written
        self.model = (info.get("target") or {}).get("name") or "specaudit"
        self.max_tokens_limit = max_new_tokens
        self.log_requests = log_requests
        self.host, self.port = host, port
        # each request brings its own max_tokens: no single token limit (the checker's
        # finish-cause rule needs one, so it stays off)
        manifest = reference_manifest(self.run_id, info, cfg, dtype=dtype, device=device, seed=seed,
                                      engine_extra={"mode": "serve"}, max_new_tokens=None,
                                      max_tokens_limit=max_new_tokens, num_prompts=None, oracle=False)
        try:  # no `_created` twin of every counter: half the scrape, no information here
            from prometheus_client import disable_created_metrics
            disable_created_metrics()
        except ImportError:
            pass
        self.registry = CollectorRegistry()
        self.prom = PromSink(self.registry, max_depth=budget + 1)
        self.exposition = FastExposition(self.registry)   # /metrics: cheap enough for a 10 Hz scrape
        self._http_errors = Counter("specaudit_http_errors", "HTTP error responses by status code", ["code"],
                                    registry=self.registry)
        self.scrape_cpu = Counter("specaudit_metrics_scrape_cpu_seconds",
                                  "CPU time spent answering GET /metrics (render and write)", registry=self.registry)
        self._err_children = {c: self._http_errors.labels(code=str(c))
                              for c in (400, 404, 405, 411, 413, 422, 500, 503)}
        if otel is True:
            from specaudit.trace.otel_sink import OtelSink
            otel = OtelSink(ratio=otel_ratio, model=self.model)
        self.otel = otel or None
        self.parquet = ParquetSink(trace_dir, self.run_id, flush_s=flush_s)
        self.run_dir = self.parquet.run_dir
        sinks = [self.parquet, self.prom] + ([self.otel] if self.otel is not None else [])
        self.tracer = Tracer(sinks, manifest, self.run_id, copy_inputs=False)  # fresh tensors per step
        self.engine = SpecEngine(target, drafter, cfg, tracer=self.tracer, device=device)
        self.estimator = LiveEstimator(self.engine.metrics, n_nodes=budget + 1, baseline_tps=baseline_tps,
                                       cost_factor=cost_factor, cost_factor_std=cost_factor_std, profile=profile,
                                       window_s=estimate_window_s)
        if not self.estimator.enabled:
            log.info("no --baseline-tps with --cost-factor or --calibration: "
                     "specaudit_estimated_commit_length stays 0")
        self.loop = EngineLoop(self.engine, self.prom, self.otel, self.estimator, max_queue=max_queue)
        self.started_at = time.time()
        self._httpd = None
        self._http_thread = None
        self._closed = False
        self.manifest = None

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    def count_error(self, status: int) -> None:
        c = self._err_children.get(status)
        if c is not None:
            c.inc()

    def health(self) -> dict:
        lp = self.loop
        return {"status": "ok" if lp.thread.is_alive() else "stopped", "model": self.model, "run_id": self.run_id,
                "running": lp.n_running, "queued": lp.n_queued, "slots": self.engine.cfg.concurrency,
                "verify_forwards": lp.steps, "engine_errors": lp.errors,
                "uptime_s": round(time.time() - self.started_at, 3)}

    def start(self) -> SpecServer:
        handler = type("BoundHandler", (Handler,), {"srv": self})
        try:
            self._httpd = _HTTPServer((self.host, self.port), handler)
        except OSError as e:
            self.tracer.close(reported=self.engine.metrics.reported(0.0), wall_s=0.0)
            raise ValueError(f"cannot listen on {self.host}:{self.port}: {e.strerror or e}") from None
        self.port = self._httpd.server_address[1]
        self.loop.start()
        self._http_thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                             name="specaudit-http", daemon=True)
        self._http_thread.start()
        self.started_at = time.time()
        return self

    def close(self) -> dict:
        """Stop serving: abort running requests, close the trace with `reported`."""
        if self._closed:
            return self.manifest
        self._closed = True
        if self._httpd is not None:
            self._httpd.shutdown()
        self.loop.stop()
        if self._httpd is not None:
            self._httpd.server_close()
        wall = time.time() - self.started_at
        reported = self.engine.metrics.reported(wall)
        self.manifest = self.tracer.close(reported=reported, wall_s=wall)
        return self.manifest

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
