"""Speculative sampling: the sampling transform and the acceptance rules beyond greedy.

Greedy decoding (temperature 0) never comes here: the engine's greedy path is the
one that was there before, bit for bit. Everything in this module runs on the host
in numpy (float64) over distributions of V = 256 entries.

Words:
    transform  what turns logits into the distribution a token is drawn from, applied
               to the target and the drafter alike, in the order vLLM and SGLang use:
               logits / T, then top-k (keep the k largest logits; ties at the k-th
               are kept), then softmax, then top-p (keep the smallest set of most
               likely tokens whose mass reaches P; the most likely is always kept),
               then renormalise.
    p          the target's transformed distribution at a node: the distribution of
               the token that follows that node.
    q          the drafter's transformed distribution for a draft position. The
               DFlash-style block drafter proposes all K positions in one forward at
               the root, so q for a node at depth d is the drafter's distribution at
               offset d: conditioned on the root token and the target's hidden state
               only, not on the drafts before it. Speculative sampling allows any
               proposal, provided each draft token was drawn from the very q that its
               acceptance test divides by; that is what the runtime does and records.
    test       drafted token x at a node whose target side is p': draw u ~ U[0, 1)
               and accept when u < p'(x) / q(x) (written u * q(x) < p'(x)).
    residual   after a rejection: norm(max(0, p' - q)), the distribution the next
               test (or the replacement token) uses.

Chain (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling"): test the drafts in order; at the first rejection draw the
replacement from the residual; when every draft is accepted draw the bonus from p at
the last node.

Tree: multi-step speculative sampling (MSS) of SpecInfer (Miao et al. 2023, "SpecInfer:
Accelerating Generative LLM Serving with Tree-based Speculative Inference and
Verification", Algorithm 2 / Theorem 4.2). The children of a node are i.i.d. draws
from q (duplicates allowed); they are tested in node order, each against the running
residual p' (p' = p for the first child, then p' <- norm(max(0, p' - q)) after each
rejection); the first accepted child is descended into; when every child is rejected
the replacement is drawn from the final residual, and at a leaf the bonus from p.
The tree's shape (which nodes exist and their parents) is the greedy runtime's
DDTree best-first shape over the drafter's raw top-k, a function of q alone and not
of the drawn tokens, so conditioning on the shape keeps every child an i.i.d. draw.
A chain is the tree with one child per node: one implementation serves both.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

TREE_SCHEME = "SpecInfer multi-step speculative sampling (Miao et al. 2023)"
CHAIN_SCHEME = "speculative sampling (Leviathan et al. 2023; Chen et al. 2023)"
TRANSFORM = "logits / temperature, then top-k, then softmax, then top-p, then renormalise (vLLM order)"

# Faults that live in the sampled path (see runtime/faults.py).
SAMPLING_FAULTS = ("greedy-accept", "ratio-inverted", "residual-from-p", "temperature-one-side",
                   "bonus-from-q")


@dataclass(frozen=True)
class SamplingParams:
    """temperature > 0 samples; 0 is greedy (the engine's greedy path). top_k None: off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int = 0

    def validate(self) -> None:
        t, p, k = self.temperature, self.top_p, self.top_k
        if not (isinstance(t, (int, float)) and np.isfinite(t) and t >= 0):
            raise ValueError(f"--temperature must be a number >= 0 (got {t})")
        if not (isinstance(p, (int, float)) and 0 < p <= 1):
            raise ValueError(f"--top-p must be in (0, 1] (got {p})")
        if k is not None and k < 1:
            raise ValueError(f"--top-k must be at least 1 (got {k})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def manifest(self) -> dict:
        """run.json config.sampling (contract v2)."""
        return {**asdict(self), "transform": TRANSFORM, "chain_scheme": CHAIN_SCHEME,
                "tree_scheme": TREE_SCHEME, "accept": "u < p'(x) / q(x), u ~ U[0, 1)"}


def transform(logits: np.ndarray, sp: SamplingParams, temperature: float | None = None) -> np.ndarray:
    """Logits (or log-probs) [..., V] -> transformed probabilities [..., V] float64."""
    t = sp.temperature if temperature is None else temperature
    x = np.asarray(logits, dtype=np.float64) / t
    V = x.shape[-1]
    if sp.top_k is not None and sp.top_k < V:
        kth = np.partition(x, V - sp.top_k, axis=-1)[..., V - sp.top_k: V - sp.top_k + 1]
        x = np.where(x >= kth, x, -np.inf)
    x = x - x.max(-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(-1, keepdims=True)
    if sp.top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        ps = np.take_along_axis(p, order, -1)
        above = np.cumsum(ps, -1) - ps           # mass of the tokens ranked before
        keep = np.empty(p.shape, dtype=bool)
        np.put_along_axis(keep, order, above < sp.top_p, -1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(-1, keepdims=True)
    return p


def categorical(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One draw per row of probs [..., V] (inverse CDF; a zero-probability entry is
    never drawn). Returns int64 [...]."""
    cdf = np.cumsum(probs, -1)
    u = rng.random(cdf.shape[:-1]) * cdf[..., -1]
    return np.minimum((cdf <= u[..., None]).sum(-1), probs.shape[-1] - 1)


def residual(pr: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p' - q)); p' itself when nothing is left (then p' = q, and no
    test against it can fail, so this is never drawn from)."""
    r = np.maximum(pr - q, 0.0)
    s = r.sum()
    return r / s if s > 0 else pr


def sample_drafts(rng, q: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """Draft tokens for a proposal shape: node i (depth d >= 1) ~ q[d - 1], i.i.d.

    q [K, V] one request's transformed drafter distributions; parents [N].
    Returns tokens [N] with tokens[0] = -1 (the caller puts the root there)."""
    N = len(parents)
    depth = np.zeros(N, dtype=np.int64)
    for i in range(1, N):
        depth[i] = depth[parents[i]] + 1
    toks = np.full(N, -1, dtype=np.int64)
    if N > 1:
        toks[1:] = categorical(rng, q[depth[1:] - 1])
    return toks


@dataclass
class SampledStep:
    """One request's verify outcome, with the contract v2 record.

    path [k+1] accepted node indices; token: the token drawn after the last accepted
    node (the replacement from the residual, or the bonus from p); the per-node lists
    are [N] (root entries 1, 1, NaN; accept_u NaN on nodes never tested)."""

    path: np.ndarray
    token: int
    from_residual: bool
    token_prob: float          # under the distribution it was drawn from
    token_target_prob: float   # p' at the last node before the last rejection (bonus: p)
    token_draft_prob: float    # q of the token at the rejected children's offset (bonus: NaN)
    token_rank: int            # rank of the token among the target's logits at that node
    draft_prob: np.ndarray     # [N] q(x_i)
    target_prob: np.ndarray    # [N] the target side the test used (p, or the running residual)
    accept_u: np.ndarray       # [N]


def verify_sampled(rng, tokens: np.ndarray, parents: np.ndarray, p: np.ndarray, q: np.ndarray,
                   logits: np.ndarray, fault: str | None = None) -> SampledStep:
    """Chain speculative sampling / SpecInfer MSS over one request's verify output.

    tokens, parents [N]; p [N, V] the target's transformed distribution at each node;
    q [K, V] the drafter's per-offset transformed distributions; logits [N, V] the raw
    target logits (for the rank of the drawn token only). `fault` is one of
    SAMPLING_FAULTS or None."""
    N = len(tokens)
    K = q.shape[0]
    children: list[list[int]] = [[] for _ in range(N)]
    depth = np.zeros(N, dtype=np.int64)
    for i in range(1, N):
        children[parents[i]].append(i)
        depth[i] = depth[parents[i]] + 1
    dp = np.ones(N)
    tp = np.ones(N)
    uu = np.full(N, np.nan)
    if N > 1:
        dp[1:] = q[depth[1:] - 1, tokens[1:]]
        tp[1:] = p[parents[1:], tokens[1:]]
    cur, path = 0, [0]
    while True:
        kids = children[cur]
        if not kids:                                  # leaf: the bonus from p
            dist = p[cur]
            if fault == "bonus-from-q" and depth[cur] < K:
                dist = q[depth[cur]]
            resid, pr_last, qd = False, p[cur], None
            break
        qd = q[depth[cur]]                            # children sit at depth[cur] + 1
        pr = p[cur]
        acc = None
        for c in kids:
            x = int(tokens[c])
            u = float(rng.random())
            tp[c], uu[c] = pr[x], u
            if fault == "greedy-accept":
                ok = x == int(np.argmax(p[cur]))
            elif fault == "ratio-inverted":
                ok = u * pr[x] < qd[x]
            else:
                ok = u * qd[x] < pr[x]
            if ok:
                acc = c
                break
            pr_last = pr
            pr = pr if fault == "residual-from-p" else residual(pr, qd)
        if acc is None:
            dist, resid = pr, True
            break
        path.append(acc)
        cur = acc
    x = int(categorical(rng, dist))
    rank = int((logits[cur] > logits[cur, x]).sum())
    return SampledStep(
        path=np.asarray(path, dtype=np.int64), token=x, from_residual=resid,
        token_prob=float(dist[x]), token_target_prob=float(pr_last[x]),
        token_draft_prob=float(qd[x]) if resid else float("nan"), token_rank=rank,
        draft_prob=dp, target_prob=tp, accept_u=uu)


def sampling_record(steps: list[SampledStep], N: int) -> dict:
    """The tracer's `sampling=` argument for a batch: per-node [B, N], per-row [B]."""
    B = len(steps)
    out = {k: np.full((B, N), np.nan, dtype=np.float32) for k in ("draft_prob", "target_prob", "accept_u")}
    for b, s in enumerate(steps):
        n = len(s.draft_prob)
        out["draft_prob"][b, :n] = s.draft_prob
        out["target_prob"][b, :n] = s.target_prob
        out["accept_u"][b, :n] = s.accept_u
    out["sampled_token"] = np.array([s.token for s in steps], dtype=np.int32)
    out["sampled_prob"] = np.array([s.token_prob for s in steps], dtype=np.float32)
    out["sampled_target_prob"] = np.array([s.token_target_prob for s in steps], dtype=np.float32)
    out["sampled_draft_prob"] = np.array([s.token_draft_prob for s in steps], dtype=np.float32)
    out["sampled_rank"] = np.array([s.token_rank for s in steps], dtype=np.int32)
    return out
