"""Triton audit kernels, each beside a torch reference with the same signature.

    chain_accept / chain_accept_ref   accepted depth and bonus of chain drafts
    tree_walk / tree_walk_ref         greedy accepted path, depth, bonus over draft trees
    mask_hash / mask_hash_ref         the contract's mask hash of the mask fed to attention
    audit_step / audit_step_ref       fused per-step audit: flags + device-side counters
    InlineAuditor                     the engine hook: `engine.auditor = InlineAuditor("cuda")`

The Triton versions need CUDA tensors (or TRITON_INTERPRET=1 set before this package is
imported); the references run anywhere. Triton itself is optional (`specaudit[triton]`).
"""
from ._common import AUDIT_MAX_N, CHAIN_MAX_N, HAS_TRITON, MASK_HASH_MAX_N, TREE_MAX_N
from .audit import (
                    COUNTER_NAMES,
                    NUM_COUNTERS,
                    RULES,
                    AuditResult,
                    audit_step,
                    audit_step_ref,
                    decode_flags,
                    new_counters,
)
from .chain_accept import chain_accept, chain_accept_ref
from .inline import AuditCollector, InlineAuditor
from .mask_hash import as_uint64, mask_hash, mask_hash_ref
from .tree_walk import tree_walk, tree_walk_ref

__all__ = [
    "AUDIT_MAX_N", "CHAIN_MAX_N", "COUNTER_NAMES", "HAS_TRITON", "MASK_HASH_MAX_N",
    "NUM_COUNTERS", "RULES", "TREE_MAX_N", "AuditCollector", "AuditResult", "InlineAuditor",
    "as_uint64", "audit_step", "audit_step_ref", "chain_accept", "chain_accept_ref",
    "decode_flags", "mask_hash", "mask_hash_ref", "new_counters", "tree_walk", "tree_walk_ref",
]
