"""Verifier: pad drafts into one batched verify input, run the target, accept greedily.

The verify input of request r is its N_r nodes; the batch pads to N = max N_r. A
padding node has parent -1, sees only itself and is never accepted. Positions are
seq_len + depth (a node's position is where its token would sit in the output), and
each node sees the cached prefix plus its ancestors and itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specaudit.runtime.proposer import Draft


@dataclass
class VerifyBatch:
    """The tensors actually fed to the target's verify forward."""

    tokens: torch.Tensor     # [R, N] int64, on the device
    tokens_np: np.ndarray    # [R, N] int64, the same on the host (acceptance runs there)
    parents: np.ndarray      # [R, N] int64, -1 on padding
    n_nodes: np.ndarray      # [R] real nodes per row
    positions: torch.Tensor  # [R, N] int64
    node_mask: torch.Tensor  # [R, N, N] bool
    logprob: np.ndarray      # [R, N] float32


def build_batch(drafts: list[Draft], seq_lens: np.ndarray, device, *, causal: bool = False,
                position_shift: int = 0) -> VerifyBatch:
    """Pad drafts into [R, N] tensors. `causal` and `position_shift` exist for faults.

    Depths and the ancestor mask are built here rather than with schema.tree_depths /
    ancestor_mask on purpose: the checker re-derives both with the schema's code, so a
    bug in either implementation shows up as a disagreement instead of hiding in both.
    """
    R = len(drafts)
    n = np.array([d.n for d in drafts], dtype=np.int64)
    N = int(n.max())
    tokens = np.zeros((R, N), dtype=np.int64)
    parents = np.full((R, N), -1, dtype=np.int64)
    lp = np.zeros((R, N), dtype=np.float32)
    for r, d in enumerate(drafts):
        tokens[r, : d.n] = d.tokens
        parents[r, : d.n] = d.parents
        lp[r, : d.n] = d.logprob
    depth = np.zeros((R, N), dtype=np.int64)
    chain = bool((parents[:, 1:] == np.arange(N - 1)[None]).all()) if N > 1 else True
    if chain:
        depth[:] = np.arange(N)
        mask = np.tril(np.ones((N, N), dtype=bool))[None].repeat(R, 0)
    else:
        rows = np.arange(R)
        mask = np.zeros((R, N, N), dtype=bool)
        for i in range(N):
            p = parents[:, i]
            has = p >= 0
            if i and has.any():
                depth[has, i] = depth[rows[has], p[has]] + 1
                mask[has, i] = mask[rows[has], p[has]]
            mask[:, i, i] = True
        if causal:  # fault: a plain causal mask over node index
            mask = np.tril(np.ones((N, N), dtype=bool))[None].repeat(R, 0)
    positions = seq_lens[:, None] + depth + position_shift
    return VerifyBatch(
        tokens=torch.from_numpy(tokens).to(device),
        tokens_np=tokens,
        parents=parents,
        n_nodes=n,
        positions=torch.from_numpy(positions).to(device),
        node_mask=torch.from_numpy(mask).to(device),
        logprob=lp,
    )


def accept_greedy(tokens: np.ndarray, parents: np.ndarray, n_nodes: np.ndarray,
                  argmax: np.ndarray) -> list[np.ndarray]:
    """Greedy acceptance: from the root, follow the child whose token is the target's
    argmax at the current node, until no child matches. Returns each row's accepted
    path (node indices, starting with 0).

    tokens, parents, argmax: [R, N]; the walk is vectorised over rows, one iteration
    per depth.
    """
    R, N = tokens.shape
    valid = np.arange(N)[None, :] < n_nodes[:, None]
    cur = np.zeros(R, dtype=np.int64)
    alive = np.ones(R, dtype=bool)
    rows = np.arange(R)
    paths = [[0] for _ in range(R)]
    while alive.any():
        want = argmax[rows, cur]  # [R]
        match = valid & (parents == cur[:, None]) & (tokens == want[:, None])
        has = match.any(1) & alive
        if not has.any():
            break
        nxt = match.argmax(1)  # first matching child (tokens of siblings are distinct)
        for r in np.flatnonzero(has):
            paths[r].append(int(nxt[r]))
        cur = np.where(has, nxt, cur)
        alive = has
    return [np.asarray(p, dtype=np.int64) for p in paths]
