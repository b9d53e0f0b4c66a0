"""An OpenAI-compatible HTTP server over the reference runtime, traced and metered.

    srv = SpecServer(trace_dir="traces/", algo="chain", budget=7, concurrency=8).start()
    # POST {srv.url}/v1/completions        {"model": ..., "prompt": "def f(", "max_tokens": 64}
    # POST {srv.url}/v1/chat/completions   {"messages": [{"role": "user", "content": "hi"}]}
    srv.close(drain_s=30)   # refuses new requests, lets running ones finish (30 s at most),
                            # aborts the rest, writes requests.parquet + reported

This module wires the parts together; each lives in its own module:
    http.py    the FastAPI app: routes, SSE streaming, JSON errors, HTTP metrics
    models.py  request/response bodies (pydantic) and request validation
    chat.py    the chat template       errors.py  the error shape and statuses
    loop.py    the engine thread        live.py    the live commit-length estimate
    spec.py    per-request speculative-decoding figures (vLLM's response block)

Threads: uvicorn's (asyncio: every HTTP connection), the engine loop's (owns the
SpecEngine), the tracer's (feeds the Parquet, Prometheus and OTel sinks). Bound to
127.0.0.1 unless told otherwise.
"""
from __future__ import annotations

import logging
import math
import re
import secrets
import socket
import threading
import time
from pathlib import Path

from uvicorn.protocols.http.h11_impl import H11Protocol

from specaudit.serve.codec import ByteCodec, HFCodec
from specaudit.serve.live import LiveEstimator
from specaudit.serve.spec import MODES

log = logging.getLogger("specaudit.serve")
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class HalfCloseH11(H11Protocol):
    """uvicorn's h11 protocol, except that a client which shuts down its sending side
    after a complete request keeps its connection open for the response (asyncio closes
    it by default, and the client gets nothing). EOF while idle or mid-body still closes."""

    def eof_received(self):
        c = self.cycle
        if c is not None and not c.more_body and not c.response_complete:
            return True
        return None


class SpecServer:
    """The reference runtime behind HTTP, traced into `trace_dir` and metered.

    models: (target, drafter, info) to skip loading the embedded pair (tests).
    target_spec, drafter_spec: 'hf:PATH_OR_ID' and 'hf:PATH_OR_ID' | 'skip:N' load a
    Hugging Face pair (runtime/hf.py) instead; its tokenizer serves the text endpoints
    (codec.py) and run.json's `models` names both checkpoints with their sha256.
    otel: an OtelSink, or True to build one from the OTEL_* variables, or None.
    spec_metrics: none | summary | detailed: the per-request block (spec.py).
    estimator options: baseline_tps, cost_factor[, cost_factor_std] or a calibration
    profile path (specaudit.audit.cost_profile.CostProfile); without them the estimate gauge is 0.
    """

    def __init__(self, *, trace_dir, algo="chain", budget=7, topk=1, concurrency=8, max_new_tokens=256,
                 inject=None, seed=0, device="cpu", dtype="float32", eos_id=None, run_id=None,
                 host="127.0.0.1", port=8000, models=None, otel=None, otel_ratio=1.0,
                 baseline_tps=None, cost_factor=None, cost_factor_std=None, calibration=None,
                 estimate_window_s=30.0, max_queue=256, log_requests=False, flush_s=5.0,
                 spec_metrics="summary", target_spec=None, drafter_spec=None, trust_remote_code=False):
        import torch
        from prometheus_client import CollectorRegistry, Counter, Histogram

        from specaudit.model import EOS_ID, default_models
        from specaudit.runtime.engine import SpecConfig, SpecEngine
        from specaudit.runtime.faults import get_fault
        from specaudit.serve.errors import STATUSES
        from specaudit.serve.loop import EngineLoop
        from specaudit.serve.spec import SpecTap
        from specaudit.trace.parquet import ParquetSink, prepare_run_dir
        from specaudit.trace.prom_exposition import FastExposition
        from specaudit.trace.prom_sink import PromSink
        from specaudit.trace.tracer import Tracer
        from specaudit.traced_run import check_device, new_run_id, reference_manifest

        check_device(device, dtype)
        if not 0 <= port <= 65535:
            raise ValueError(f"--port must be within 0..65535 (got {port})")
        if max_queue < 1:
            raise ValueError(f"--max-queue must be at least 1 (got {max_queue})")
        if spec_metrics not in MODES:
            raise ValueError(f"--per-request-spec-metrics must be one of {', '.join(MODES)} (got {spec_metrics!r})")
        get_fault(inject)
        profile = None
        if calibration is not None:
            from specaudit.audit.cost_profile import CostProfile
            profile = CostProfile.load(calibration)
        if baseline_tps is not None and not (baseline_tps > 0 and math.isfinite(baseline_tps)):
            raise ValueError(f"--baseline-tps must be a positive number (got {baseline_tps})")
        if cost_factor is not None and not (cost_factor > 0 and math.isfinite(cost_factor)):
            raise ValueError(f"--cost-factor must be a positive number (got {cost_factor})")
        if target_spec is not None:
            SpecConfig(algo=algo, budget=budget, topk=topk, max_new_tokens=max_new_tokens,
                       concurrency=concurrency, eos_id=0, fault=inject).validate(budget)  # before loading
            if models is None:
                from specaudit.runtime.hf import load_models
                models = load_models(target_spec, drafter_spec, device=device, dtype=dtype, budget=budget,
                                     algo=algo, trust_remote_code=trust_remote_code)
        elif drafter_spec:
            raise ValueError("--drafter needs --target hf:PATH_OR_ID (the embedded target has its own drafter)")
        target, drafter, info = models if models is not None else default_models(device, getattr(torch, dtype))
        model_eos = getattr(target, "eos_id", EOS_ID)
        cfg = SpecConfig(algo=algo, budget=budget, topk=topk, max_new_tokens=max_new_tokens,
                         concurrency=concurrency, eos_id=model_eos if eos_id is None else eos_id, fault=inject)
        cfg.validate(drafter.depth)
        tok = getattr(target, "tokenizer", None)
        self.codec = HFCodec(tok, target.vocab_size) if tok is not None else ByteCodec()
        self.context = target.max_seq_len
        if max_new_tokens >= self.context:
            raise ValueError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the context of "
                             f"{self.context} tokens")
        self.run_id = run_id or ("serve-" + new_run_id(algo, budget, topk, concurrency, inject))
        prepare_run_dir(Path(trace_dir), self.run_id)   # refuse early: nothing half-written
        self.model = (info.get("target") or {}).get("name") or "specaudit"
        self.max_tokens_limit = max_new_tokens
        self.budget = budget
        self.spec_mode = spec_metrics
        self.log_requests = log_requests
        self.host, self.port = host, port
        # each request brings its own max_tokens: no single token limit (the checker's
        # finish-cause rule needs one, so it stays off)
        manifest = reference_manifest(self.run_id, info, cfg, dtype=dtype, device=device, seed=seed,
                                      engine_extra={"mode": "serve", "per_request_spec_metrics": spec_metrics},
                                      max_new_tokens=None, max_tokens_limit=max_new_tokens, num_prompts=None,
                                      oracle=False)
        try:  # no `_created` twin of every counter: half the scrape, no information here
            from prometheus_client import disable_created_metrics
            disable_created_metrics()
        except ImportError:
            pass
        self.registry = CollectorRegistry()
        self.prom = PromSink(self.registry, max_depth=budget + 1)
        self._http_errors = Counter("specaudit_http_errors", "HTTP error responses by status code", ["code"],
                                    registry=self.registry)
        self.http_requests = Counter("http_requests", "HTTP requests by route (none: unknown path), method and "
                                     "status class", ["handler", "method", "status"], registry=self.registry)
        self.http_duration = Histogram("http_request_duration_seconds", "HTTP request latency by route and method",
                                       ["handler", "method"], registry=self.registry,
                                       buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.scrape_cpu = Counter("specaudit_metrics_scrape_cpu_seconds",
                                  "CPU time spent answering GET /metrics (render and write)", registry=self.registry)
        self._err_children = {c: self._http_errors.labels(code=str(c)) for c in STATUSES}
        self.exposition = FastExposition(self.registry)   # /metrics: cheap enough for a 10 Hz scrape
        if otel is True:
            from specaudit.trace.otel_sink import OtelSink
            otel = OtelSink(ratio=otel_ratio, model=self.model)
        self.otel = otel or None
        self.parquet = ParquetSink(trace_dir, self.run_id, flush_s=flush_s)
        self.run_dir = self.parquet.run_dir
        sinks = [self.parquet, self.prom] + ([self.otel] if self.otel is not None else [])
        self.tracer = Tracer(sinks, manifest, self.run_id, copy_inputs=False)  # fresh tensors per step
        self.spec_tap = SpecTap(self.tracer)   # per-request counters on their way to the tracer
        self.engine = SpecEngine(target, drafter, cfg, tracer=self.spec_tap, device=device)
        self.estimator = LiveEstimator(self.engine.metrics, n_nodes=budget + 1, baseline_tps=baseline_tps,
                                       cost_factor=cost_factor, cost_factor_std=cost_factor_std, profile=profile,
                                       window_s=estimate_window_s)
        if not self.estimator.enabled:
            log.info("no --baseline-tps with --cost-factor or --profile: "
                     "specaudit_estimated_commit_length stays 0")
        self.loop = EngineLoop(self.engine, self.prom, self.otel, self.estimator, max_queue=max_queue)
        self.started_at = time.time()
        self._uv = None
        self._http_thread = None
        self._closed = False
        self.manifest = None
        self._ids: set[str] = set()      # request ids handed out (12 hex digits or the client's)
        self._ids_lock = threading.Lock()

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    def request_id(self, prefix: str, client_id: str | None = None) -> str:
        """`prefix-<X-Request-ID>` when the client sent a usable one (letters, digits, . _ : -,
        at most 128) not used before in this run, as vLLM names requests; else
        `prefix-<random>`. A trace never holds one request id twice."""
        with self._ids_lock:
            if client_id and _CLIENT_ID.fullmatch(client_id):
                rid = f"{prefix}-{client_id}"
                if rid not in self._ids:
                    self._ids.add(rid)
                    return rid
            while True:
                rid = f"{prefix}-{secrets.token_hex(12)}"
                if rid not in self._ids:
                    self._ids.add(rid)
                    return rid

    def count_error(self, status: int) -> None:
        c = self._err_children.get(status)
        if c is not None:
            c.inc()

    def sink_problem(self) -> str | None:
        """A sink's failure as one line (Tracer.health()), or None while every sink works."""
        h = getattr(self.tracer, "health", None)
        if callable(h):
            st = h()
            if st.get("ok", True):
                return None
            return f"trace sink failing: {st.get('last_error') or 'see the server log'}"
        errs = getattr(self.tracer, "_errors", None) or []   # a tracer without health()
        return f"trace sink failed: {errs[0]!r}" if errs else None

    def health(self) -> dict:
        lp = self.loop
        problem = self.sink_problem()
        status = ("stopped" if not lp.thread.is_alive() else "draining" if lp.closing
                  else "degraded" if problem else "ok")
        out = {"status": status, "model": self.model, "run_id": self.run_id,
               "running": lp.n_running, "queued": lp.n_queued, "slots": self.engine.cfg.concurrency,
               "verify_forwards": lp.steps, "engine_errors": lp.errors,
               "uptime_s": round(time.time() - self.started_at, 3)}
        if problem:
            out["problem"] = problem
        v = self.estimator.verdict()
        if v is not None:
            out["estimate_verdict"] = v
        return out

    def start(self) -> SpecServer:
        import uvicorn

        from specaudit.serve.http import build_app
        fam = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(fam, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError as e:
            sock.close()
            self.tracer.close(reported=self.engine.metrics.reported(0.0), wall_s=0.0)
            raise ValueError(f"cannot listen on {self.host}:{self.port}: {e.strerror or e}") from None
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(build_app(self), http=HalfCloseH11, lifespan="off", log_config=None,
                                log_level="warning", access_log=self.log_requests, backlog=256,
                                timeout_graceful_shutdown=10, ws="none")
        self._uv = uvicorn.Server(config)
        self.loop.start()
        self._http_thread = threading.Thread(target=self._uv.run, kwargs={"sockets": [sock]},
                                             name="specaudit-http", daemon=True)
        self._http_thread.start()
        end = time.monotonic() + 30
        while not self._uv.started and self._http_thread.is_alive() and time.monotonic() < end:
            time.sleep(0.01)
        if not self._uv.started:
            self.close()
            raise ValueError(f"the HTTP server did not start on {self.host}:{self.port}")
        self.started_at = time.time()
        return self

    def close(self, drain_s: float = 0.0) -> dict:
        """Stop serving: refuse new requests, let queued and running ones finish for up to
        `drain_s` seconds, abort the rest, stop HTTP, close the trace with `reported`."""
        if self._closed:
            return self.manifest
        self._closed = True
        end = time.monotonic() + max(drain_s, 0.0)
        if drain_s > 0 and self.loop.thread.is_alive():
            if not self.loop.drain(drain_s):
                log.warning("drain: requests still running after %.0f s are aborted", drain_s)
        self.loop.closing = True   # body reads in progress answer 503 within http.BODY_POLL_S
        self.loop.stop()
        if self._uv is not None:
            # HTTP's own grace: what is left of drain_s (at least 1 s to send the aborts),
            # so --drain-seconds bounds the whole shutdown, not drain_s + uvicorn's 10 s
            self._uv.config.timeout_graceful_shutdown = max(1.0, end - time.monotonic())
            self._uv.should_exit = True
            self._http_thread.join(30)
        wall = time.time() - self.started_at
        reported = self.engine.metrics.reported(wall)
        self.manifest = self.tracer.close(reported=reported, wall_s=wall)
        return self.manifest

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
