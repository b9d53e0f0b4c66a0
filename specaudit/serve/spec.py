"""Per-request speculative-decoding figures, in the shapes engines put in their responses.

The figures come from the runtime's own per-step counters (accepted_depth as the
runtime's metrics code reported it, drafted nodes), captured on the engine thread as
they are handed to the tracer: a counter fault injected into the runtime shows here
exactly as it shows in the trace's reported columns and in /metrics. Nothing here is
re-derived from the accepted path; that is the checker's job.

Words:
    spec step      one verify step of this request (the prefill's first token is not one)
    draft tokens   drafted nodes verified, the root excluded (n_nodes - 1 per step)
    accepted       accepted draft tokens as the runtime counted them (bonus excluded)

vLLM's block (`--per-request-spec-decode-metrics summary|detailed`), response field
`metrics.speculative_decoding`:
    mean_acceptance_length    1 + accepted / spec steps (the bonus token included)
    draft_acceptance_rate     accepted / draft tokens
    acceptance_histogram      [k+1] steps that accepted exactly j drafts, j = 0..k
    num_spec_steps, num_accepted_draft_tokens, num_draft_tokens
    detailed adds per-step arrays: per_step_accepted, per_step_drafted
(names as in vLLM PR 48915, which AIPerf 0.13's vLLM adapter reads; num_spec_tokens is
left out: AIPerf then demands exactly k+1 buckets, and a faulty counter needs k+2)

"""
from __future__ import annotations

import threading

import numpy as np

MODES = ("none", "summary", "detailed")


class RequestSpec:
    """One request's per-step counters, appended on the engine thread."""

    __slots__ = ("accepted", "drafted")

    def __init__(self):
        self.drafted: list[int] = []    # [steps] draft tokens verified per step
        self.accepted: list[int] = []   # [steps] accepted drafts per step, as the runtime counted them

    def block(self, k: int, detailed: bool = False) -> dict:
        """vLLM's `speculative_decoding` object for this request; k = draft budget."""
        steps, acc, dr = len(self.accepted), sum(self.accepted), sum(self.drafted)
        hist = [0] * (k + 1)
        for a in self.accepted:
            # a faulty counter can exceed k (the bonus counted as a draft): widen, never drop
            if a >= len(hist):
                hist.extend([0] * (a + 1 - len(hist)))
            hist[max(a, 0)] += 1
        out = {
            "mean_acceptance_length": 1.0 + acc / steps if steps else 1.0,
            "draft_acceptance_rate": acc / dr if dr else 0.0,
            "acceptance_histogram": hist,
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": acc,
            "num_draft_tokens": dr,
        }
        if detailed:
            out["per_step_accepted"] = list(self.accepted)
            out["per_step_drafted"] = list(self.drafted)
        return out


class SpecTap:
    """Stands between the engine and its tracer: records each request's step counters,
    then hands the call on unchanged. Everything else goes straight to the tracer."""

    def __init__(self, tracer):
        self._tracer = tracer
        self._lock = threading.Lock()
        self._reqs: dict[str, RequestSpec] = {}

    def __getattr__(self, name):
        return getattr(self._tracer, name)

    def record_step(self, *, request_ids, n_nodes, accepted_depth, **kw):
        nn = np.asarray(n_nodes).reshape(-1)             # [R] nodes per request, root included
        with self._lock:
            for i, rid in enumerate(request_ids):
                r = self._reqs.get(rid)
                if r is None:
                    r = self._reqs[rid] = RequestSpec()
                r.drafted.append(int(nn[i]) - 1)
                r.accepted.append(int(accepted_depth[i]))
        return self._tracer.record_step(request_ids=request_ids, n_nodes=n_nodes,
                                        accepted_depth=accepted_depth, **kw)

    def pop(self, rid: str) -> RequestSpec:
        """The request's counters (empty when it never reached a verify step); forgets them."""
        with self._lock:
            return self._reqs.pop(rid, None) or RequestSpec()
