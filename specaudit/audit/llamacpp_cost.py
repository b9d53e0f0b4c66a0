"""A cost profile for `specaudit estimate`, measured on a running llama-server by its own clock.

    from specaudit.audit.llamacpp_cost import forwards, profile_from_runs
    prof = profile_from_runs(spec_runs, plain_responses, k=6)      # a CostProfile
    prof.save("cost.json")            # specaudit estimate ... --profile cost.json --n-nodes 7

r is a speculative step's cost in plain decode steps. Asking llama-server for a streamed
completion with "timings_per_token": true returns, with every token, the request's
timings so far; its predicted_ms is the server's clock at the end of the target forward
that produced the token (slot stats t_gen_last - t_prompt_last), so the tokens one verify
step commits share one predicted_ms and each new value is one more target forward. Per
request, then, with no spec counter read:

    forwards     distinct predicted_ms values after the first token (which the prefill gives)
    t_forward    predicted_ms / forwards of the same prompt asked again without streaming
                 (greedy, uncached: it decodes alike; sending every token as it comes
                 measurably slows a plain step, so streams are not timed)
    t_plain      predicted_ms / (predicted_n - 1) on the server with speculation off
    r            (sum of speculative ms / sum of forwards) / (sum of plain ms / plain tokens)

r_std is the standard error of the per-request ratios. The steps are counted by the clock,
never by spec_decode_num_drafts_total, so the estimate that uses this profile judges the
counters instead of repeating them. Both servers should run the same prompts at the same
concurrency, alternating, so that a busy machine slows both alike.
"""
from __future__ import annotations

import math
import platform
import time

from specaudit.audit.cost_profile import CostEntry, CostProfile


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


def profile_from_runs(spec_runs, plain_responses, k: int, concurrency: int = 1, meta: dict | None = None
                      ) -> CostProfile:
    """A measured CostProfile at N = k + 1 nodes, c = concurrency, from

    spec_runs        per request of the speculative server: (streamed chunks, streamed text,
                     the same prompt's plain response); the stream counts the forwards, the
                     plain response gives their time (streaming slows every token: timed
                     streams would misprice r). Greedy and uncached, the two decode alike;
                     a pair whose texts differ is refused.
    plain_responses  responses of the server with speculation off (one token per forward:
                     predicted_ms / (predicted_n - 1) is a plain step)."""
    if not spec_runs or not plain_responses:
        raise ValueError("need requests from both servers (speculation on and off)")
    steps, ms, per = 0, 0.0, []
    for chunks, text, resp in spec_runs:
        f, _ms_streamed, _n = forwards(chunks)
        if resp.get("content") != text:
            raise ValueError("a streamed request and its plain twin decoded different text (not greedy, or the "
                             "prompt cache on): their forwards cannot be paired")
        t = float(resp["timings"]["predicted_ms"])
        steps, ms = steps + f, ms + t
        per.append(t / f)
    p_ms = sum(float(r["timings"]["predicted_ms"]) for r in plain_responses)
    p_steps = sum(int(r["timings"]["predicted_n"]) - 1 for r in plain_responses)
    if p_steps <= 0 or p_ms <= 0:
        raise ValueError("the plain server's responses hold no timed token after the first")
    t_step, t_ar = ms / steps, p_ms / p_steps
    r = t_step / t_ar
    ratios = [x / t_ar for x in per]
    n = len(ratios)
    sd = (sum((x - r) ** 2 for x in ratios) / (n - 1)) ** 0.5 / n ** 0.5 if n > 1 else 0.0
    info = {"method": "llama-server: forwards counted in a timings_per_token stream by the server's clock, timed "
                      "on the same prompt not streamed",
            "spec_requests": n, "plain_requests": len(plain_responses), "spec_forwards": steps,
            "plain_forwards": p_steps, "t_step_ms": t_step, "t_plain_ms": t_ar,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.machine(), **(meta or {})}
    try:
        import os
        info["load_1m"] = os.getloadavg()[0]
    except (AttributeError, OSError):
        pass
    e = CostEntry(r=r, r_std=sd, n_nodes=k + 1, concurrency=concurrency, t_ar_s=t_ar / 1000, samples=n)
    return CostProfile([e], source="measured", meta=info)
