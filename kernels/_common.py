"""What every kernel wrapper shares: the Triton import, input checks, block sizes.

Every public kernel `f(...)` has a torch reference `f_ref(...)` with the same signature.
Both run the same checks here first, so bad input (a shape that disagrees, N above the
kernel's limit, a non-contiguous or wrong-dtype tensor, tensors on two devices) is one
clear ValueError before anything launches, never a silent wrong answer.
"""
from __future__ import annotations

import torch

try:  # Triton is optional: without it the torch references still work (CPU serving, tests)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None

HAS_TRITON = triton is not None

# Largest N (nodes per verify row, root included) each kernel takes. The walk kernels
# hold a row of N nodes in registers; the fused audit packs each node's ancestor set into
# one 64-bit word, so it stops at 64 (EAGLE-2/DDTree trees in serving use <= 64 nodes);
# the mask hash streams 64-column words and takes any N the trace contract allows.
CHAIN_MAX_N = 1024
TREE_MAX_N = 1024
AUDIT_MAX_N = 64
MASK_HASH_MAX_N = 4096  # = specaudit.trace.schema.MAX_NODES

INT_DTYPES = (torch.int32, torch.int64)
MASK_DTYPES = (torch.bool, torch.float16, torch.bfloat16, torch.float32)
# An additive float mask hides a node with a large negative bias (-inf, the dtype's
# lowest value, or -1e4 in every engine convention we know) and shows it with ~0.
ADDITIVE_VISIBLE_ABOVE = -1.0e3

# FNV-1a 64 constants of the contract, as the int64 values with the same bits:
# int64 arithmetic wraps in two's complement, so xor and the low 64 bits of a product
# are exactly those of uint64 (Triton skips its overflow sanitizer at 64 bits).
FNV_OFFSET_I64 = 0xCBF29CE484222325 - (1 << 64)
FNV_PRIME_I64 = 0x100000001B3


def check_tensor(name: str, t, dtypes, shape: tuple) -> torch.Tensor:
    """Raise ValueError unless t is a contiguous torch tensor of one of `dtypes` whose
    shape matches `shape` (None entries match any size)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}, expected {want}")
    if t.dim() != len(shape) or any(s is not None and s != g for s, g in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} has shape {list(t.shape)}, expected {want}")
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous (strides {list(t.stride())}); "
                         f"call .contiguous() first")
    return t


def check_n(name: str, N: int, limit: int) -> None:
    if N < 1:
        raise ValueError(f"{name} has N = {N} nodes; a verify row holds at least the root")
    if N > limit:
        raise ValueError(f"{name} has N = {N} nodes, above this kernel's limit of {limit}")


def check_same_device(**tensors) -> torch.device:
    devs = {k: t.device for k, t in tensors.items() if t is not None}
    if len({str(d) for d in devs.values()}) > 1:
        where = ", ".join(f"{k} on {d}" for k, d in devs.items())
        raise ValueError(f"tensors on different devices: {where}")
    return next(iter(devs.values()))


def default_n_nodes(n_nodes, B: int, N: int, device) -> torch.Tensor:
    """n_nodes [B] or None (every row holds N nodes)."""
    if n_nodes is None:
        return torch.full((B,), N, dtype=torch.int32, device=device)
    return check_tensor("n_nodes", n_nodes, INT_DTYPES, (B,))


def interpreting(kernel) -> bool:
    """True when Triton runs `kernel` in its CPU interpreter (TRITON_INTERPRET=1 when the
    kernel was defined)."""
    return type(kernel).__name__ == "InterpretedFunction"


def require_triton(kernel, device: torch.device, ref_name: str) -> None:
    """Refuse before launch when the kernel cannot run on these tensors."""
    if kernel is None:
        raise ValueError(f"Triton is not installed; call {ref_name} (the torch reference) "
                         f"or pip install 'specaudit[triton]'")
    if device.type != "cuda" and not interpreting(kernel):
        raise ValueError(f"Triton kernels need CUDA tensors (got {device}); call {ref_name} "
                         f"on CPU, or set TRITON_INTERPRET=1 before importing specaudit.kernels")


def next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def block_rows(B: int, block_n: int, kernel, block_b: int | None = None) -> int:
    """Rows per program. The work is latency-bound (per-node loops), so on a GPU each
    program gets a small tile (about 256 elements: one warp or two, reductions along a
    row stay in warp shuffles) and the grid gets wide; the interpreter pays ~1 ms per
    program, so it gets few, large blocks. `block_b` overrides (a power of two)."""
    if block_b is not None:
        if block_b < 1 or block_b & (block_b - 1):
            raise ValueError(f"block_b must be a power of two, not {block_b}")
        return block_b
    budget = 1 << 14 if interpreting(kernel) else 256
    return max(2, min(next_pow2(B), budget // block_n))  # >= 2: no size-1 aranges


def warps(elements: int, num_warps: int | None = None) -> int:
    """Warps per program for a tile of `elements` (8 or more per thread keeps the
    reductions in-warp for small tiles)."""
    if num_warps is not None:
        return num_warps
    return 1 if elements <= 256 else 2 if elements <= 1024 else 4


def rows_per_load(block_b: int, block_n: int, kernel) -> int:
    """Mask rows per [BB, RC, BN] load: about 2048 elements (16K in the interpreter)."""
    budget = 1 << 14 if interpreting(kernel) else 1 << 11
    return max(1, min(block_n, budget // (block_b * block_n)))
