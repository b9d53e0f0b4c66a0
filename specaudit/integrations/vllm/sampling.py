"""Contract v2 values of a sampled vLLM step (temperature > 0), from vLLM's own tensors.

hooks.py captures, inside the rejection sampler's `rejection_sample` call:
    p   softmax of the target logits it tests against, after vLLM's own processors and
        apply_sampling_constraints (temperature, top-k, top-p): [num_tokens, V], the
        distribution at each draft's parent (row j tests draft token j)
    q   draft_probs [num_tokens, V] when the method has them; None otherwise, and vLLM's
        test then takes q(x) = 1 for the draft token (one-hot): recorded so
    u   the uniforms from generate_uniform_probs [num_tokens]: accepted iff p/q >= u
and the rejection sampler's output row (the accepted drafts, then one token).

Per request with k drafts (rows j0 .. j0+k-1), n accepted, drawn token t:
    draft_prob  [1, q_0(x_1), ..., q_{k-1}(x_k)]
    target_prob [1, p_0(x_1), ..., p_{k-1}(x_k)]
    accept_u    [NaN, u_0, ..., u_n, NaN...]  (nodes 1..n+1 tested; all k when none rejected)
    sampled_*   n < k: t was drawn from the residual norm(max(0, p_n - q_n)): its mass
                there, p_n(t) and q_n(t). n = k: the bonus, drawn by vLLM's sampler from the
                bonus row; its p is re-derived as softmax(raw logits / T) when top-k and
                top-p are off, else unknown (NaN, sampled_token -1, declared in run.json)
    sampled_rank  t's rank among the raw verify logits at node n
"""
from __future__ import annotations

import math

NAN = float("nan")


def sampled_fields(p, q, u, j0: int, drafts: list[int], out_tokens: list[int], raw_rows, temperature: float,
                   plain_temperature: bool) -> dict:
    """The v2 fields of one request's step (see the module doc). p, q: [num_tokens, V]
    tensors (q may be None), u: [num_tokens] or None, raw_rows: [k+1, V] raw logits."""
    import torch
    k = len(drafts)
    n = len(out_tokens) - 1
    t = out_tokens[-1]
    rows = torch.arange(j0, j0 + k)
    d = torch.tensor(drafts, dtype=torch.long)
    pk = p[rows]                                                     # [k, V]
    qk = q[rows] if q is not None else torch.nn.functional.one_hot(d, pk.shape[-1]).to(pk.dtype)
    tp = [1.0] + pk[torch.arange(k), d].tolist()
    dp = [1.0] + qk[torch.arange(k), d].tolist()
    au = [NAN] * (k + 1)
    if u is not None:
        for i in range(min(n + 1, k)):                               # the tested nodes
            au[i + 1] = float(u[j0 + i])
    if n < k:                                                        # drawn from the residual at node n
        res = (pk[n] - qk[n]).clamp(min=0)
        tot = float(res.sum())
        sp = float(res[t]) / tot if tot > 0 else NAN
        stp, sdp = float(pk[n, t]), float(qk[n, t])
    elif plain_temperature:                                          # the bonus, from p at the last node
        pb = torch.softmax(raw_rows[n].float() / max(temperature, 1e-6), -1)
        sp = stp = float(pb[t])
        sdp = NAN
    else:
        return dict(draft_prob=dp, target_prob=tp, accept_u=au, sampled_token=-1, sampled_prob=NAN,
                    sampled_target_prob=NAN, sampled_draft_prob=NAN, sampled_rank=-1)
    raw = raw_rows[n].float()
    rank = int((raw > raw[t]).sum())
    return dict(draft_prob=dp, target_prob=tp, accept_u=au, sampled_token=int(t), sampled_prob=sp,
                sampled_target_prob=stp, sampled_draft_prob=sdp, sampled_rank=rank)


def manifest_sampling(temperature: float, top_p, top_k, unknown: list[str]) -> dict:
    """run.json config.sampling for a traced vLLM run with sampled requests."""
    return {"temperature": temperature, "top_p": 1.0 if top_p is None or math.isnan(top_p) else top_p,
            "top_k": top_k or None, "seed": None,
            "transform": "vLLM's (logits processors, then apply_sampling_constraints: logits / T, top-k, top-p)",
            "chain_scheme": "Leviathan et al. 2023 (vLLM rejection_sample)", "tree_scheme": None,
            "accept": "p(x) / q(x) >= u, u ~ U[0, 1); q(x) = 1 for a method without draft probabilities",
            "unknown": unknown}
