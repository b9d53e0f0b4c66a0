"""A cost profile for `specaudit estimate`, measured on a running llama-server by its own clock.

    from specaudit.audit.llamacpp_cost import forwards, profile_from_streams
    prof = profile_from_streams(spec_streams, plain_streams, k=6)   # a CostProfile
    prof.save("cost.json")            # specaudit estimate ... --profile cost.json --n-nodes 7

r is a speculative step's cost in plain decode steps. Asking llama-server for a streamed
completion with "timings_per_token": true returns, with every token, the request's
timings so far; its predicted_ms is the server's clock at the end of the target forward
that produced the token (slot stats t_gen_last - t_prompt_last), so the tokens one verify
step commits share one predicted_ms and each new value is one more target forward. Per
request, then, with no spec counter read:

    forwards     distinct predicted_ms values after the first token (which the prefill gives)
    t_forward    the last predicted_ms / forwards        (draft + verify + accept, per step)
    t_plain      the same on a server with speculation off (one token per forward)
    r            (sum of speculative ms / sum of forwards) / (sum of plain ms / sum of forwards)

r_std is the standard error of the per-request ratios. The steps are counted by the clock,
never by spec_decode_num_drafts_total, so the estimate that uses this profile judges the
counters instead of repeating them. Both servers should run the same prompts at the same
concurrency, alternating, so that a busy machine slows both alike.
"""
from __future__ import annotations

import math
import platform
import time

from specaudit.audit.estimate import CostEntry, CostProfile


def forwards(chunks) -> tuple[int, float, int]:
    """One streamed request's chunks, each (predicted_n, predicted_ms) in arrival order ->
    (target forwards after the first token, their total ms, tokens after the first).
    ValueError when the stream holds no timed forward."""
    ms = [float(m) for n, m in chunks if n is not None and n >= 2 and m is not None]
    n_tok = max((int(n) for n, _m in chunks if n is not None), default=0)
    steps = len(set(ms))
    if steps == 0 or not ms or not math.isfinite(ms[-1]) or ms[-1] <= 0:
        raise ValueError("a streamed response with no timed token after the first (ask for \"timings_per_token\": "
                         "true and more than one token)")
    return steps, max(ms), n_tok - 1


def _sums(streams):
    per = [forwards(s) for s in streams]
    return per, sum(p[0] for p in per), sum(p[1] for p in per)


def profile_from_streams(spec_streams, plain_streams, k: int, concurrency: int = 1, meta: dict | None = None
                         ) -> CostProfile:
    """Streamed requests of a speculative server (draft length k) and of the same server
    with speculation off -> a measured CostProfile at N = k + 1 nodes, c = concurrency."""
    if not spec_streams or not plain_streams:
        raise ValueError("need streamed requests from both servers (speculation on and off)")
    sp, s_steps, s_ms = _sums(spec_streams)
    pl, p_steps, p_ms = _sums(plain_streams)
    t_step, t_ar = s_ms / s_steps, p_ms / p_steps
    r = t_step / t_ar
    ratios = [(ms / st) / t_ar for st, ms, _n in sp]
    sd = (sum((x - r) ** 2 for x in ratios) / (len(ratios) - 1)) ** 0.5 / len(ratios) ** 0.5 if len(ratios) > 1 else 0.0
    info = {"method": "llama-server streamed timings_per_token: target forwards counted by the server's clock",
            "spec_requests": len(sp), "plain_requests": len(pl), "spec_forwards": s_steps,
            "spec_tokens_after_first": sum(p[2] for p in sp), "plain_forwards": p_steps,
            "t_step_ms": t_step, "t_plain_ms": t_ar, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": platform.machine(), **(meta or {})}
    try:
        import os
        info["load_1m"] = os.getloadavg()[0]
    except (AttributeError, OSError):
        pass
    e = CostEntry(r=r, r_std=sd, n_nodes=k + 1, concurrency=concurrency, t_ar_s=t_ar / 1000,
                  samples=len(sp))
    return CostProfile([e], source="measured", meta=info)
