"""Chain acceptance: accepted depth and bonus token of a linear draft block.

    depth, bonus = chain_accept(tokens, target_argmax, n_nodes)      # Triton (CUDA)
    depth, bonus = chain_accept_ref(tokens, target_argmax, n_nodes)  # torch, any device

tokens [B, N]: node 0 is the root, node i (1 <= i < n) the i-th draft token.
target_argmax [B, N]: the target's greedy next token at each node.
n_nodes [B] (optional): real nodes per row (padding beyond is ignored); clamped to [1, N].
Returns depth int32 [B] = number of leading drafts i with tokens[i] == argmax[i - 1],
and bonus [B] = argmax[depth] (dtype of target_argmax): greedy verification of a chain.
"""
from __future__ import annotations

import torch

from ._common import (
    CHAIN_MAX_N,
    INT_DTYPES,
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


def _check(tokens, target_argmax, n_nodes):
    check_tensor("tokens", tokens, INT_DTYPES, (None, None))
    B, N = tokens.shape
    check_n("tokens", N, CHAIN_MAX_N)
    check_tensor("target_argmax", target_argmax, INT_DTYPES, (B, N))
    n = default_n_nodes(n_nodes, B, N, tokens.device)
    dev = check_same_device(tokens=tokens, target_argmax=target_argmax, n_nodes=n)
    return B, N, n, dev


def chain_accept_ref(tokens: torch.Tensor, target_argmax: torch.Tensor,
                     n_nodes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of `chain_accept` (same signature, same results)."""
    _, N, n, _ = _check(tokens, target_argmax, n_nodes)
    n = n.long().clamp(1, N)
    idx = torch.arange(1, N, device=tokens.device)
    # match[b, i - 1]: draft i equals the target's argmax at node i - 1, and i is real
    match = (tokens[:, 1:] == target_argmax[:, :-1]) & (idx[None, :] < n[:, None])
    depth = match.int().cumprod(1).sum(1)  # leading run of matches
    bonus = target_argmax.gather(1, depth.long()[:, None])[:, 0]
    return depth.int(), bonus


if triton is not None:
    @triton.jit
    def _chain_accept_kernel(tok_ptr, am_ptr, n_ptr, depth_ptr, bonus_ptr, B, N,
                             BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
        row_ok = rows < B
        cols = tl.arange(0, BLOCK_N)                                # [BN]
        n = tl.load(n_ptr + rows, mask=row_ok, other=1)
        n = tl.minimum(tl.maximum(n, 1), N).to(tl.int32)  # clamp in the native dtype first
        base = rows.to(tl.int64) * N                                # [BB] row offsets
        draft = row_ok[:, None] & (cols[None, :] >= 1) & (cols[None, :] < n[:, None])
        off = base[:, None] + cols[None, :]
        tok = tl.load(tok_ptr + off, mask=draft, other=0)
        prev = tl.load(am_ptr + off - 1, mask=draft, other=0)       # argmax at node i - 1
        # depth = (first rejected draft) - 1, or n - 1 when every draft matched
        miss = draft & (tok != prev)
        first = tl.min(tl.where(miss, cols[None, :], n[:, None]), axis=1)
        depth = first - 1
        bonus = tl.load(am_ptr + base + depth, mask=row_ok, other=0)
        tl.store(depth_ptr + rows, depth, mask=row_ok)
        tl.store(bonus_ptr + rows, bonus, mask=row_ok)
else:  # pragma: no cover
    _chain_accept_kernel = None


def chain_accept(tokens: torch.Tensor, target_argmax: torch.Tensor,
                 n_nodes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton kernel: accepted depth int32 [B] and bonus [B] of chain drafts. No host sync."""
    B, N, n, dev = _check(tokens, target_argmax, n_nodes)
    require_triton(_chain_accept_kernel, dev, "chain_accept_ref")
    depth = torch.empty(B, dtype=torch.int32, device=dev)
    bonus = torch.empty(B, dtype=target_argmax.dtype, device=dev)
    if B == 0:
        return depth, bonus
    BN = max(next_pow2(N), 2)
    BB = block_rows(B, BN, _chain_accept_kernel)
    _chain_accept_kernel[(triton.cdiv(B, BB),)](tokens, target_argmax, n, depth, bonus, B, N,
                                                 BLOCK_B=BB, BLOCK_N=BN, num_warps=warps(BB * BN))
    return depth, bonus
