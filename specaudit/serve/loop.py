"""The engine loop: the one thread that owns the SpecEngine (which is not thread-safe).

Between steps it aborts cancelled jobs, prefills queued ones into free slots
(continuous batching), runs one batched verify step and hands every job the tokens the
step appended. HTTP handlers (asyncio, uvicorn's thread) only validate, submit a Job
and await its events; the tracer's own thread feeds the sinks (Parquet, Prometheus,
OpenTelemetry), so neither HTTP nor metrics touch the step loop.

Words:
    Job      one request on its way through the loop; events go to its asyncio queue:
             ("tokens", [int]) per step, then ("done", finish_reason) or ("error", HTTPError)
    drain    stop taking new jobs and let queued and running ones finish
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from collections import deque

from specaudit.serve.errors import HTTPError

log = logging.getLogger("specaudit.serve")


class Events:
    """A job's event queue: written by the engine thread, read by an asyncio handler."""

    def __init__(self, aio_loop: asyncio.AbstractEventLoop | None = None):
        self._loop = aio_loop
        self._q: asyncio.Queue = asyncio.Queue()

    def put(self, ev) -> None:
        if self._loop is None:
            self._q.put_nowait(ev)
        else:
            try:
                self._loop.call_soon_threadsafe(self._q.put_nowait, ev)
            except RuntimeError:   # the event loop is closed: nobody is waiting any more
                pass

    async def get(self):
        return await self._q.get()


class Job:
    """One completion request on its way through the engine thread. Only the engine
    thread writes `req`."""

    def __init__(self, rid: str, prompt: list[int], max_tokens: int, attributes=None, carrier=None,
                 aio_loop=None):
        from specaudit.runtime.engine import Request
        self.rid = rid
        self.req = Request(request_id=rid, prompt=prompt, max_new_tokens=max_tokens, t_arrive=time.time())
        self.events = Events(aio_loop)
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
        self._admitting = 0           # jobs taken from the queue, not yet in _running
        self._stop = False
        self.closing = False          # draining: new jobs are refused with 503
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
            if self._stop or self.closing:
                raise HTTPError(503, "the server is shutting down", "shutting_down")
            # the waiting room: max_queue, plus the slots free right now (a burst that arrives
            # while the loop is busy prefilling must not lose a free slot to a 429)
            free = len(self.engine.free_slots()) - self._admitting if hasattr(self.engine, "free_slots") else 0
            if len(self._pending) >= self.max_queue + max(0, free):
                raise HTTPError(429, f"the queue is full ({self.max_queue} requests waiting); retry later",
                                "queue_full", etype="rate_limit_error")
            self._pending.append(job)
            self.n_queued = len(self._pending)
            self._cv.notify()

    def cancel(self, job: Job) -> None:
        """The client went away: drop a queued job, or abort a running one between steps."""
        with self._cv:
            if job.cancelled:
                return
            job.cancelled = True
            try:
                self._pending.remove(job)
                self.n_queued = len(self._pending)
                job.events.put(("done", "abort"))    # never prefilled: nothing was traced
            except ValueError:
                self._cancels.append(job)
                self._cv.notify()

    def drain(self, timeout: float) -> bool:
        """Refuse new jobs; wait up to `timeout` s for queued and running ones to finish.
        True when nothing is left."""
        with self._cv:
            self.closing = True
        end = time.monotonic() + max(timeout, 0.0)
        while time.monotonic() < end and self.thread.is_alive():
            with self._cv:
                if not (self._pending or self._running or self._cancels):
                    return True
            time.sleep(0.02)
        with self._cv:
            return not (self._pending or self._running)

    def stop(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self.thread.is_alive():
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
                self._admitting = len(admit)
                self.n_queued = len(self._pending)
            for job in cancels:
                if self._running.pop(job.rid, None) is not None:
                    eng.abort(job.req)
                    job.push_new()
                    job.events.put(("done", "abort"))
            for job in admit:
                self._admit(job)
            with self._cv:
                self._admitting = 0
            if self._running:
                self._step()
            self.n_running = len(self._running)
            if self.prom is not None:
                self.prom.set_load(self.n_running, self.n_queued)
            if self.estimator is not None:
                self.estimator.tick(self.prom)
        # stopping: everything still here ends as abort (traced where prefilled)
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
            job.events.put(("error", HTTPError(422, str(e), "context_length_exceeded")))
            return
        except Exception as e:
            log.error("prefill of %s failed: %s", job.rid, traceback.format_exc())
            self.errors += 1
            job.events.put(("error", HTTPError(500, f"prefill failed: {e!r}", "engine_error")))
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
        except Exception as e:
            log.error("verify step failed; aborting %d requests: %s", rows, traceback.format_exc())
            self.errors += 1
            for job in list(self._running.values()):
                self.engine.abort(job.req)
                job.events.put(("error", HTTPError(500, f"verify step failed: {e!r}", "engine_error")))
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
