"""Live estimation: the throughput-derived commit length next to the reported one.

Two gauges (PromSink.set_commit_lengths) updated from the engine thread: the mean
commit length the runtime's own counters report over a sliding window, and the
estimate specaudit.audit.estimate derives from the tokens really handed to clients.
Both come from `estimate.live_judgement`, the pipeline `specaudit estimate` runs (its
comparison is specaudit.audit.compare's); the verdict is kept for /health.
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque

log = logging.getLogger("specaudit.serve")


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
            from specaudit.audit.cost_profile import CostProfile
            self.profile = CostProfile.manual(cost_factor, cost_factor_std)
        self.enabled = self.profile is not None and (baseline_tps is not None or self._profile_has_t_ar())
        self.window_s, self.every_s = window_s, every_s
        self._acc = [0, 0.0, 0, 0]       # tokens, request-seconds, rows, forwards since the last tick
        self._samples: deque = deque()   # (t, tokens, req_s, rows, forwards, verify_steps, sum_commit)
        self._last = time.monotonic()
        self._warned = False
        self.last = None                 # the last Estimate (tests and /health read it)
        self.last_verdict = None         # live_judgement's verdict on the reported figure

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
        from specaudit.audit.cost_profile import profile_t_ar
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
                from types import SimpleNamespace

                from specaudit.audit.estimate import live_judgement
                from specaudit.stats import mean_se
                rates = [s[1] / s[2] for s in body if s[2] > 0]
                _, se, _ = mean_se(rates)
                tps = tokens / reqsec
                c = max(1, round(sum(s[3] for s in body) / max(sum(s[4] for s in body), 1)))  # mean batch
                # the same pipeline (and verdict) as `specaudit estimate`
                res = live_judgement(tps, se if math.isfinite(se) else 0.0, concurrency=c, n_nodes=self.n_nodes,
                                     profile=self.profile, baseline_tps=self._base_at(c),
                                     reported_commit_len=reported)
                est = SimpleNamespace(**res["estimate"])
                self.last, self.last_verdict = est, res["verdict"]
            except ImportError:
                if not self._warned:
                    log.warning("specaudit.estimate is not available: the estimated commit length gauge stays 0")
                    self._warned = True
            except Exception as e:
                if not self._warned:
                    log.warning("commit length estimate skipped: %s", e)
                    self._warned = True
        if prom is not None:
            prom.set_commit_lengths(reported, est)

    def verdict(self) -> str | None:
        """The last window's verdict (estimate.live_judgement: consistent, mismatch, ...), or
        None while there is no estimate."""
        return self.last_verdict
