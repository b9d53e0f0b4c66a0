"""Proposers: turn the drafter's per-position log-probabilities into a draft.

A draft is a tree of nodes: node 0 is the root (the last committed token), nodes
1..N-1 are draft tokens, parents[i] < i. A chain is the tree whose every parent is the
node before. Both proposers return plain numpy arrays per request; the verifier pads
them into one batch.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass
class Draft:
    """One request's proposal: N nodes, root first."""

    tokens: np.ndarray     # [N] int64, tokens[0] = root
    parents: np.ndarray    # [N] int64, parents[0] = -1
    logprob: np.ndarray    # [N] float32, drafter log-prob of each node's token (root 0)

    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])


def propose_chain(roots: np.ndarray, logprobs: np.ndarray, budget: int) -> list[Draft]:
    """DFlash-style block [root, d1..d_budget]: the argmax at each future position.

    roots [R]; logprobs [R, K, V] from one drafter forward (K >= budget).
    """
    lp = logprobs[:, :budget]  # [R, budget, V]
    tok = lp.argmax(-1)  # [R, budget]
    tlp = np.take_along_axis(lp, tok[..., None], -1)[..., 0]
    parents = np.arange(-1, budget, dtype=np.int64)
    out = []
    for r in range(len(roots)):
        out.append(Draft(np.concatenate(([roots[r]], tok[r])).astype(np.int64), parents,
                         np.concatenate(([0.0], tlp[r])).astype(np.float32)))
    return out


def propose_tree(roots: np.ndarray, logprobs: np.ndarray, budget: int, topk: int) -> list[Draft]:
    """DDTree-style best-first tree under a node budget.

    The drafter's positions are independent given the root, so a node at depth d
    may take any of the top-k tokens of position d+1; its score is the sum of the
    log-probs along its path. Best-first expansion (a max-heap on score) adds the
    `budget` highest-scoring nodes, each parent before its children, at most `topk`
    children per node, depth at most K. With topk = 1 this is exactly the chain.
    """
    R, K, V = logprobs.shape
    k = min(topk, V)
    top = np.argpartition(-logprobs, k - 1, axis=-1)[..., :k]  # [R, K, k]
    toplp = np.take_along_axis(logprobs, top, -1)
    order = np.argsort(-toplp, axis=-1, kind="stable")
    top = np.take_along_axis(top, order, -1)
    toplp = np.take_along_axis(toplp, order, -1)
    out = []
    for r in range(R):
        tokens, parents, lps = [int(roots[r])], [-1], [0.0]
        # heap of (-score, tiebreak, parent node, depth of child, rank among top-k)
        heap = [(-float(toplp[r, 0, j]), j, 0, 0, j) for j in range(k)]
        heapq.heapify(heap)
        seq = k
        while heap and len(tokens) <= budget:
            neg, _, par, d, j = heapq.heappop(heap)
            node = len(tokens)
            tokens.append(int(top[r, d, j]))
            parents.append(par)
            lps.append(float(toplp[r, d, j]))
            if d + 1 < K:
                for jj in range(k):
                    seq += 1
                    heapq.heappush(heap, (neg - float(toplp[r, d + 1, jj]), seq, node, d + 1, jj))
        out.append(Draft(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64),
                         np.asarray(lps, dtype=np.float32)))
    return out
