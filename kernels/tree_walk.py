"""Tree acceptance: the greedy walk from the root over a batch of draft trees.

    path, depth, bonus = tree_walk(tokens, parents, target_argmax, n_nodes)      # Triton
    path, depth, bonus = tree_walk_ref(tokens, parents, target_argmax, n_nodes)  # torch

tokens, parents, target_argmax [B, N]; n_nodes [B] optional (clamped to [1, N]).
From the root, repeatedly step to the first child c (lowest index, 0 < c < n,
parents[c] == cur) whose token is the target's argmax at cur; stop when none matches.
This is specaudit.runtime.verifier.accept_greedy on device. Only edges with
0 <= parents[c] < c count (a malformed parent is no edge), so the walk ends in < N steps.
Returns path int32 [B, N] (accepted node indices from 0, then -1), depth int32 [B]
(accepted drafts) and bonus [B] = argmax at the last accepted node.
"""
from __future__ import annotations

import torch

from ._common import (
    INT_DTYPES,
    TREE_MAX_N,
    block_rows,
    check_n,
    check_same_device,
    check_tensor,
    default_n_nodes,
    next_pow2,
    require_triton,
    tl,
    triton,
    warps,
)


def _check(tokens, parents, target_argmax, n_nodes):
    check_tensor("tokens", tokens, INT_DTYPES, (None, None))
    B, N = tokens.shape
    check_n("tokens", N, TREE_MAX_N)
    check_tensor("parents", parents, INT_DTYPES, (B, N))
    check_tensor("target_argmax", target_argmax, INT_DTYPES, (B, N))
    n = default_n_nodes(n_nodes, B, N, tokens.device)
    dev = check_same_device(tokens=tokens, parents=parents, target_argmax=target_argmax, n_nodes=n)
    return B, N, n, dev


def tree_walk_ref(tokens: torch.Tensor, parents: torch.Tensor, target_argmax: torch.Tensor,
                  n_nodes: torch.Tensor | None = None):
    """Torch reference of `tree_walk` (same signature, same results; no host sync)."""
    B, N, n, dev = _check(tokens, parents, target_argmax, n_nodes)
    n = n.long().clamp(1, N)
    idx = torch.arange(N, device=dev)
    child_ok = (idx[None, :] < n[:, None]) & (parents >= 0) & (parents < idx)  # [B, N] real edges
    rows = torch.arange(B, device=dev)
    cur = torch.zeros(B, dtype=torch.long, device=dev)
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    depth = torch.zeros(B, dtype=torch.long, device=dev)
    path = torch.full((B, N), -1, dtype=torch.int32, device=dev)
    path[:, 0] = 0
    for _ in range(N - 1):  # one depth per iteration; fixed count, so no host sync
        want = target_argmax.gather(1, cur[:, None])  # [B, 1]
        match = child_ok & (parents == cur[:, None]) & (tokens == want)
        has = match.any(1) & alive
        nxt = match.int().argmax(1)  # first matching child
        depth = depth + has
        path[rows, depth] = torch.where(has, nxt.int(), path[rows, depth])
        cur = torch.where(has, nxt, cur)
        alive = has
    bonus = target_argmax.gather(1, cur[:, None])[:, 0]
    return path, depth.int(), bonus


if triton is not None:
    @triton.jit
    def _tree_walk_kernel(tok_ptr, par_ptr, am_ptr, n_ptr, path_ptr, depth_ptr, bonus_ptr, B, N,
                          BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
        row_ok = rows < B
        cols = tl.arange(0, BLOCK_N)                                # [BN]
        n = tl.load(n_ptr + rows, mask=row_ok, other=1)
        n = tl.minimum(tl.maximum(n, 1), N).to(tl.int32)  # clamp in the native dtype first
        base = rows.to(tl.int64) * N
        off = base[:, None] + cols[None, :]
        child = row_ok[:, None] & (cols[None, :] > 0) & (cols[None, :] < n[:, None])  # [BB, BN]
        tok = tl.load(tok_ptr + off, mask=child, other=0)
        par = tl.load(par_ptr + off, mask=child, other=-1)
        # good[c]: c's token is the target's argmax at c's parent, i.e. c is accepted
        # once its parent is; one gathered load here keeps the walk below in registers.
        in_rng = child & (par >= 0) & (par < cols[None, :])  # real edges only (native dtype)
        par = tl.where(in_rng, par, -1).to(tl.int32)
        am_par = tl.load(am_ptr + base[:, None] + tl.where(in_rng, par, 0), mask=in_rng, other=0)
        good = in_rng & (tok == am_par)
        cur = tl.zeros([BLOCK_B], dtype=tl.int32)
        depth = tl.zeros([BLOCK_B], dtype=tl.int32)
        alive = row_ok
        # order[b, c]: index of node c in the accepted path, -1 when off the path
        order = tl.where(cols[None, :] == 0, 0, -1) + tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.int32)
        for _ in range(1, N):
            cand = good & (par == cur[:, None])
            nxt = tl.min(tl.where(cand, cols[None, :], BLOCK_N), axis=1)  # first matching child
            has = alive & (nxt < BLOCK_N)
            depth += has.to(tl.int32)
            cur = tl.where(has, nxt, cur)
            order = tl.where(has[:, None] & (cols[None, :] == nxt[:, None]), depth[:, None], order)
            alive = has
        # path[order[c]] = c for nodes on the path, -1 after the last: disjoint addresses
        on = row_ok[:, None] & (order >= 0)
        tl.store(path_ptr + base[:, None] + order, cols[None, :] + tl.zeros_like(order), mask=on)
        tail = row_ok[:, None] & (cols[None, :] < N) & (cols[None, :] > depth[:, None])
        tl.store(path_ptr + off, tl.full([BLOCK_B, BLOCK_N], -1, tl.int32), mask=tail)
        tl.store(depth_ptr + rows, depth, mask=row_ok)
        tl.store(bonus_ptr + rows, tl.load(am_ptr + base + cur, mask=row_ok, other=0), mask=row_ok)
else:  # pragma: no cover
    _tree_walk_kernel = None


def tree_walk(tokens: torch.Tensor, parents: torch.Tensor, target_argmax: torch.Tensor,
              n_nodes: torch.Tensor | None = None):
    """Triton kernel: accepted path int32 [B, N], depth int32 [B], bonus [B]. No host sync."""
    B, N, n, dev = _check(tokens, parents, target_argmax, n_nodes)
    require_triton(_tree_walk_kernel, dev, "tree_walk_ref")
    path = torch.empty((B, N), dtype=torch.int32, device=dev)
    depth = torch.empty(B, dtype=torch.int32, device=dev)
    bonus = torch.empty(B, dtype=target_argmax.dtype, device=dev)
    if B == 0:
        return path, depth, bonus
    BN = max(next_pow2(N), 2)
    BB = block_rows(B, BN, _tree_walk_kernel)
    _tree_walk_kernel[(triton.cdiv(B, BB),)](tokens, parents, target_argmax, n, path, depth, bonus,
                                             B, N, BLOCK_B=BB, BLOCK_N=BN, num_warps=warps(BB * BN))
    return path, depth, bonus
