"""The contract's mask hash (FNV-1a 64 over bit-packed rows) of the mask fed to attention.

    h = mask_hash(mask, n_nodes)      # Triton (CUDA), int64 [B]
    h = mask_hash_ref(mask, n_nodes)  # torch, any device, int64 [B]
    as_uint64(h)                      # -> numpy uint64 [B], what the trace stores

mask [B, N, N]: bool (True = node i may attend to node j) or an additive float bias
(visible where the bias is above -1e3: masked entries are -inf, the dtype's lowest or -1e4).
n_nodes [B] optional: row b hashes its [n_b, n_b] block with N = n_b, exactly as the
tracer does for a padded batch (specaudit.trace.steps_arrow.node_mask_hashes). The result is the
uint64 hash of docs/trace-contract.md carried in an int64 tensor (same bits);
bit-exact with specaudit.trace.schema.mask_hash and the contract's test vectors.
"""
from __future__ import annotations

import numpy as np
import torch

from ._common import (
    ADDITIVE_VISIBLE_ABOVE,
    FNV_OFFSET_I64,
    FNV_PRIME_I64,
    MASK_DTYPES,
    MASK_HASH_MAX_N,
    block_rows,
    check_n,
    check_same_device,
    check_tensor,
    default_n_nodes,
    next_pow2,
    require_triton,
    rows_per_load,
    tl,
    triton,
    warps,
)


def as_uint64(h) -> np.ndarray:
    """int64 hashes (tensor or array) -> numpy uint64 with the same bits (copies to host)."""
    if isinstance(h, torch.Tensor):
        h = h.detach().cpu().numpy()
    return np.asarray(h, dtype=np.int64).view(np.uint64)


def visible(mask: torch.Tensor) -> torch.Tensor:
    """[..] bool or additive float mask -> bool visibility."""
    if mask.dtype == torch.bool:
        return mask
    return mask > ADDITIVE_VISIBLE_ABOVE


def _check(mask, n_nodes):
    check_tensor("mask", mask, MASK_DTYPES, (None, None, None))
    B, N, N2 = mask.shape
    if N != N2:
        raise ValueError(f"mask has shape {list(mask.shape)}, expected [B, N, N] (square per row)")
    check_n("mask", N, MASK_HASH_MAX_N)
    n = default_n_nodes(n_nodes, B, N, mask.device)
    dev = check_same_device(mask=mask, n_nodes=n)
    return B, N, n, dev


def mask_hash_ref(mask: torch.Tensor, n_nodes: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference of `mask_hash` (same signature, same bits)."""
    B, N, n, dev = _check(mask, n_nodes)
    n = n.long().clamp(1, N)
    W = (N + 63) // 64
    j = torch.arange(W * 64, device=dev)
    vis = torch.zeros((B, N, W * 64), dtype=torch.bool, device=dev)
    vis[:, :, :N] = visible(mask)
    vis &= j[None, None, :] < n[:, None, None]               # columns beyond a row's n
    bit = torch.ones((), dtype=torch.int64, device=dev) << (j % 64)  # 1 << 63 is the sign bit
    # disjoint bits: the int64 sum of a word's bits is their OR
    words = (vis.long() * bit).view(B, N, W, 64).sum(-1)     # [B, N, W]
    nw = (n + 63) // 64                                      # words per row of this mask
    h = torch.full((B,), FNV_OFFSET_I64, dtype=torch.int64, device=dev)
    h = (h ^ n) * FNV_PRIME_I64
    for i in range(N):
        for w in range(W):
            live = (i < n) & (w < nw)
            h = torch.where(live, (h ^ words[:, i, w]) * FNV_PRIME_I64, h)
    return h


if triton is not None:
    @triton.jit
    def _mask_hash_kernel(mask_ptr, n_ptr, out_ptr, B, N, W, BLOCK_B: tl.constexpr,
                          IS_FLOAT: tl.constexpr, VIS_ABOVE: tl.constexpr,
                          OFFSET: tl.constexpr, PRIME: tl.constexpr,
                          ONE_WORD: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
        row_ok = rows < B
        n = tl.load(n_ptr + rows, mask=row_ok, other=1)
        n = tl.minimum(tl.maximum(n, 1), N).to(tl.int32)  # clamp in the native dtype first
        base = rows.to(tl.int64) * N * N
        h = tl.full([BLOCK_B], OFFSET, tl.int64)
        h = (h ^ n.to(tl.int64)) * PRIME
        if ONE_WORD:
            # N <= 64: one word per row. ROWS rows per [BB, ROWS, BN] load, unrolled so
            # the loads overlap; the FNV steps then run on registers, in row order.
            j = tl.arange(0, BLOCK_N)
            bit = tl.full([BLOCK_N], 1, tl.int64) << j.to(tl.int64)     # [BN] 1 << j
            j3 = j[None, None, :]
            r2 = tl.arange(0, ROWS)[None, :]                            # [1, ROWS]
            for i0 in tl.static_range(0, BLOCK_N, ROWS):
                ii = i0 + r2[:, :, None]                                # [1, ROWS, 1]
                ld = row_ok[:, None, None] & (ii < n[:, None, None]) & (j3 < n[:, None, None])
                m = tl.load(mask_ptr + base[:, None, None] + ii * N + j3, mask=ld, other=0)
                if IS_FLOAT:
                    vis = ld & (m > VIS_ABOVE)
                else:
                    vis = ld & (m != 0)
                w = tl.sum(tl.where(vis, bit[None, None, :], 0), axis=2)  # [BB, ROWS], OR of bits
                for r in tl.static_range(ROWS):
                    w_r = tl.sum(tl.where(r2 == r, w, 0), axis=1)
                    h = tl.where(row_ok & (i0 + r < n), (h ^ w_r) * PRIME, h)
        else:
            # any N: row by row, word by word (W = ceil(N / 64) words of 64 columns)
            nw = (n + 63) // 64                                         # [BB] words per row
            bit = tl.full([64], 1, tl.int64) << tl.arange(0, 64).to(tl.int64)
            for i in range(N):
                row_live = row_ok & (i < n)
                for w in range(W):
                    j = w * 64 + tl.arange(0, 64)                       # [64] columns of word w
                    ld = row_live[:, None] & (j[None, :] < n[:, None])
                    m = tl.load(mask_ptr + base[:, None] + i * N + j[None, :], mask=ld, other=0)
                    if IS_FLOAT:
                        vis = ld & (m > VIS_ABOVE)
                    else:
                        vis = ld & (m != 0)
                    word = tl.sum(tl.where(vis, bit[None, :], 0), axis=1)  # [BB] int64
                    h = tl.where(row_live & (w < nw), (h ^ word) * PRIME, h)
        tl.store(out_ptr + rows, h, mask=row_ok)
else:  # pragma: no cover
    _mask_hash_kernel = None


def mask_hash(mask: torch.Tensor, n_nodes: torch.Tensor | None = None) -> torch.Tensor:
    """Triton kernel: contract mask hash of each row's mask, int64 [B] (uint64 bits)."""
    B, N, n, dev = _check(mask, n_nodes)
    require_triton(_mask_hash_kernel, dev, "mask_hash_ref")
    out = torch.empty(B, dtype=torch.int64, device=dev)
    if B == 0:
        return out
    one_word = N <= 64
    BN = max(next_pow2(N), 2) if one_word else 64
    BB = block_rows(B, BN, _mask_hash_kernel)
    _mask_hash_kernel[(triton.cdiv(B, BB),)](
        mask, n, out, B, N, (N + 63) // 64, BLOCK_B=BB, IS_FLOAT=mask.dtype != torch.bool,
        VIS_ABOVE=ADDITIVE_VISIBLE_ABOVE, OFFSET=FNV_OFFSET_I64, PRIME=FNV_PRIME_I64,
        ONE_WORD=one_word, BLOCK_N=BN, ROWS=rows_per_load(BB, BN, _mask_hash_kernel),
        num_warps=warps(BB * BN))
    return out
