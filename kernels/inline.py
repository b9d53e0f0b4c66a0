"""The engine's inline auditor: the fused audit every step, a counter nobody waits for.

    from specaudit.kernels import InlineAuditor
    engine.auditor = InlineAuditor("cuda")          # SpecEngine.step() calls .audit(...)
    prometheus_client.REGISTRY.register(engine.auditor.collector())
    engine.auditor.read()    # {"steps": .., "violating_steps": .., "rules": {...}}, never blocks

On CUDA `audit` launches the fused Triton kernel (kernels/audit.py) on the current
stream; host-side inputs (numpy arrays, lists) travel in one pinned, non-blocking copy;
nothing synchronises. After the kernel it enqueues an async copy of the int64 counter
vector into a pinned ring slot and records an event; `read()` (any thread, e.g. a
Prometheus scrape) returns the newest slot whose event has completed, so it lags the
device by at most a step or two and never stalls the decode loop. On CPU it runs the
torch reference and `read()` returns the counters themselves.

Not captured in CUDA graphs: call `audit` outside a captured region (the ring's event
bookkeeping is host code).
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from ._common import HAS_TRITON
from .audit import (
    COUNTER_NAMES,
    NUM_COUNTERS,
    NUM_RULES,
    RULES,
    AuditResult,
    audit_step,
    audit_step_ref,
    new_counters,
    rule_codes,
)

RULE_HELP = {
    "tree": "parents malformed, or a chain whose parents are not i - 1",
    "depth": "reported accepted depth differs from the greedy walk's depth",
    "commit": "reported commit length is not depth + 1 (or above it on a finished step)",
    "eos": "the commit runs past an EOS in the accepted tokens",
    "mask": "the attention mask fed differs from ancestor-or-self of parents",
    "positions": "positions fed differ from seq_len + depth",
}


class InlineAuditor:
    """On-device audit of every verify step with a device-side violation counter.

    device: where the engine's tensors live. backend: "auto" (Triton on CUDA when
    installed, else the torch reference), "triton" or "torch". eos_id: the engine's EOS
    (-1: no eos rule); the engine hook also passes its own per call. publish_every:
    enqueue the counter copy for `read()` every k-th step (1: every step).
    """

    def __init__(self, device="cuda", *, eos_id: int = -1, backend: str = "auto",
                 publish_every: int = 1, ring: int = 3):
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"InlineAuditor({str(device)!r}): CUDA is not available here; "
                             f"use InlineAuditor('cpu') (the torch reference)")
        if backend == "auto":
            backend = "triton" if (self.device.type == "cuda" and HAS_TRITON) else "torch"
        if backend not in ("triton", "torch"):
            raise ValueError(f"backend must be auto, triton or torch, not {backend!r}")
        self.backend = backend
        self.eos_id = int(eos_id)
        self.publish_every = max(1, int(publish_every))
        self.counters = new_counters(self.device)   # int64 [NUM_COUNTERS], COUNTER_NAMES
        self.last: AuditResult | None = None         # the last step's per-request results
        self._lock = threading.Lock()
        self._calls = 0
        self._cuda = self.device.type == "cuda"
        if self._cuda:
            self._slots = [torch.zeros(NUM_COUNTERS, dtype=torch.int64, pin_memory=True)
                           for _ in range(max(2, ring))]
            self._events = [torch.cuda.Event() for _ in self._slots]
            self._seq = [0] * len(self._slots)        # 0: never written
            self._pending = [False] * len(self._slots)

    # ------------------------------------------------------------------ inputs
    def _stage(self, values: dict) -> dict:
        """Host arrays -> device tensors: one pinned buffer, one non-blocking copy.
        Device tensors pass through (made contiguous, on self.device)."""
        out, host = {}, {}
        for k, v in values.items():
            if v is None:
                out[k] = None
            elif isinstance(v, torch.Tensor):
                v = v.detach()
                if v.device != self.device:
                    v = v.to(self.device, non_blocking=True)
                out[k] = v if v.is_contiguous() else v.contiguous()
            else:
                a = np.asarray(v)
                if k == "node_mask" or a.dtype.kind == "f":  # keeps its dtype: its own copy
                    m = torch.from_numpy(np.ascontiguousarray(a))
                    out[k] = m.pin_memory().to(self.device, non_blocking=True) if self._cuda else m
                else:
                    host[k] = a
        if host:
            flat = np.concatenate([a.astype(np.int64, copy=False).ravel() for a in host.values()])
            buf = torch.from_numpy(flat)
            if self._cuda:
                # pinned + non_blocking: the copy never waits; torch's caching host
                # allocator keeps the pinned block alive until the copy has run
                buf = buf.pin_memory().to(self.device, non_blocking=True)
            lo = 0
            for k, a in host.items():
                out[k] = buf[lo: lo + a.size].view(a.shape)
                lo += a.size
        return out

    # ------------------------------------------------------------------- audit
    def audit(self, *, algo: str, node_tokens, parents, n_nodes, target_argmax, accepted_depth,
              commit_len, finished, node_mask=None, positions=None, seq_len=None,
              eos_id: int | None = None) -> AuditResult:
        """Audit one batched verify step. Returns device tensors; never synchronises.

        node_tokens, parents, target_argmax [B, N]; n_nodes, accepted_depth, commit_len,
        finished [B]; node_mask [B, N, N] and positions [B, N] + seq_len [B] as fed, when
        given. Tensors, numpy arrays or lists.
        """
        t = self._stage(dict(node_tokens=node_tokens, parents=parents, n_nodes=n_nodes,
                             target_argmax=target_argmax, accepted_depth=accepted_depth,
                             commit_len=commit_len, finished=finished, node_mask=node_mask,
                             positions=positions, seq_len=seq_len))
        eos = self.eos_id if eos_id is None else int(eos_id)
        args = (t["node_tokens"], t["parents"], t["n_nodes"], t["target_argmax"],
                t["accepted_depth"], t["commit_len"], t["finished"], self.counters)
        kw = dict(chain=algo == "chain", eos_id=eos, node_mask=t["node_mask"],
                  positions=t["positions"], seq_len=t["seq_len"])
        if self.backend == "triton":
            res = audit_step(*args, **kw)
        else:
            with self._lock:  # CPU: read() takes the counters themselves
                res = audit_step_ref(*args, **kw)
        self.last = res
        self._calls += 1
        if self._cuda and self._calls % self.publish_every == 0:
            self._publish()
        return res

    # ---------------------------------------------------------------- counters
    def _newest_done(self) -> int:
        """Index of the newest ring slot whose copy has completed, -1 if none (lock held)."""
        best = -1
        for s, ev in enumerate(self._events):
            if self._pending[s] and ev.query():   # query() never blocks
                self._pending[s] = False
            if not self._pending[s] and self._seq[s] and (best < 0 or self._seq[s] > self._seq[best]):
                best = s
        return best

    def _publish(self) -> None:
        """Enqueue counters -> a free pinned slot (not in flight, not the newest done)."""
        with self._lock:
            keep = self._newest_done()
            for s in range(len(self._slots)):
                if s != keep and not self._pending[s]:
                    break
            else:
                return  # every slot busy: skip; the counters are cumulative, next step catches up
            self._slots[s].copy_(self.counters, non_blocking=True)
            self._events[s].record()
            self._pending[s] = True
            self._seq[s] = max(self._seq) + 1

    def read(self) -> dict:
        """The last completed counter values, without blocking the device or the engine:
        {"steps": .., "violating_steps": .., "rules": {rule: count}}."""
        with self._lock:
            if not self._cuda:
                vals = self.counters.tolist()
            else:
                s = self._newest_done()
                vals = self._slots[s].tolist() if s >= 0 else [0] * NUM_COUNTERS
        return _as_dict(vals)

    def read_sync(self) -> dict:
        """Exact counters now (synchronises the device: tests and end-of-run reports only)."""
        return _as_dict(self.counters.tolist())

    def collector(self):
        """A prometheus_client collector over `read()`: register it with a registry."""
        return AuditCollector(self)


def _as_dict(vals: list) -> dict:
    return {"steps": int(vals[NUM_RULES + 1]), "violating_steps": int(vals[NUM_RULES]),
            "rules": {r: int(vals[k]) for k, r in enumerate(RULES)}}


class AuditCollector:
    """Exposes an InlineAuditor's counters as Prometheus counters (read without blocking):

    specaudit_inline_audit_steps_total             verify step rows audited on device
    specaudit_inline_audit_violating_steps_total   of those, rows breaking any rule
    specaudit_inline_audit_violations_total{rule,code}  rows breaking each rule; code =
                                                   the catalog codes the flag reports
    """

    def __init__(self, auditor: InlineAuditor):
        self.auditor = auditor

    def _families(self, snap: dict | None):
        from prometheus_client.core import CounterMetricFamily
        steps = CounterMetricFamily("specaudit_inline_audit_steps",
                                    "Verify step rows (request-steps) audited on device")
        bad = CounterMetricFamily("specaudit_inline_audit_violating_steps",
                                  "Audited step rows breaking at least one rule")
        per = CounterMetricFamily("specaudit_inline_audit_violations",
                                  "Audited step rows breaking each rule (code: the catalog's codes it reports)",
                                  labels=["rule", "code"])
        if snap is not None:
            steps.add_metric([], snap["steps"])
            bad.add_metric([], snap["violating_steps"])
            codes = rule_codes()
            for r in RULES:
                per.add_metric([r, ",".join(codes.get(r, ()))], snap["rules"][r])
        return [steps, bad, per]

    def describe(self):
        return self._families(None)

    def collect(self):
        return self._families(self.auditor.read())


__all__ = ["COUNTER_NAMES", "RULE_HELP", "AuditCollector", "InlineAuditor"]
