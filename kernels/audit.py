"""Fused on-device audit of one batched verify step, and the engine's inline auditor.

    res = audit_step(node_tokens, parents, n_nodes, target_argmax, accepted_depth,
                     commit_len, finished, counters, chain=False, eos_id=0,
                     node_mask=mask, positions=pos, seq_len=seq)       # Triton (CUDA)
    res = audit_step_ref(...)                                          # torch, same signature

One kernel launch per step re-derives, for each request b of the batch (N <= 64 nodes):
the greedy accepted path over the tree (depth, bonus), the ancestor-or-self set of every
node (one int64 word each), each node's depth (popcount of that word), the contract
mask hash of the fed mask, and the first EOS in the derived commit. It compares them
with what the engine reported and fed, writes per-request violation flags (bit k =
RULES[k]) and adds to a device-side int64 counter vector with one atomic per program,
so the decode loop never waits on the host.

Rules (per request-step; compare specaudit/runtime/faults.py):
    tree       parents malformed (parents[0] != -1, parent outside [0, i), n outside
               [1, N]); for a chain, parents[i] != i - 1
    depth      accepted_depth != derived depth     (commit-counter, bonus-double-count)
    commit     unfinished: commit_len != depth + 1; finished: outside [1, depth + 1]
                                                    (commit-counter)
    eos        the derived commit holds EOS at index k, yet commit_len > k + 1 or the
               step is not finished                (eos-overcount)
    mask       the fed mask differs from ancestor-or-self of parents on the [n, n]
               block                               (causal-mask-on-tree)
    positions  positions[i] != seq_len + depth(i)  (position-off-by-one)

`InlineAuditor` wraps it for a running engine (see docs/kernels.md):

    from specaudit.kernels import InlineAuditor
    engine.auditor = InlineAuditor("cuda")        # engine.step() calls auditor.audit(...)
    REGISTRY.register(engine.auditor.collector()) # Prometheus reads it without blocking
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ._common import (
    ADDITIVE_VISIBLE_ABOVE,
    AUDIT_MAX_N,
    FNV_OFFSET_I64,
    FNV_PRIME_I64,
    INT_DTYPES,
    MASK_DTYPES,
    block_rows,
    check_n,
    check_same_device,
    check_tensor,
    next_pow2,
    require_triton,
    rows_per_load,
    tl,
    triton,
    warps,
)
from .mask_hash import mask_hash_ref, visible
from .tree_walk import tree_walk_ref

RULES = ("tree", "depth", "commit", "eos", "mask", "positions")
NUM_RULES = len(RULES)


def rule_codes() -> dict:
    """Flag of RULES -> the catalog codes it reports, taken from the catalog (each rule's
    `live = (..., "kernel:<flag>")` in specaudit.invariants): the catalog is the one home
    of a rule's identity; tests/test_one_verdict.py fails when the two drift apart."""
    from specaudit.invariants.registry import kernel_codes
    return kernel_codes()
# counters[k] for k < NUM_RULES: request-steps breaking RULES[k]; then these two
COUNTER_NAMES = RULES + ("violating_steps", "steps")
NUM_COUNTERS = len(COUNTER_NAMES)


class AuditResult(NamedTuple):
    flags: torch.Tensor             # int32 [B], bit k set = RULES[k] broken
    depth: torch.Tensor             # int32 [B], derived accepted depth
    bonus: torch.Tensor             # [B], derived bonus token (dtype of target_argmax)
    mask_hash: torch.Tensor | None  # int64 [B] (uint64 bits) of the fed mask, when given


def decode_flags(flags) -> list[list[str]]:
    """Per-request flag words (tensor/array/list) -> names of the broken rules (host)."""
    if isinstance(flags, torch.Tensor):
        flags = flags.cpu().tolist()
    return [[r for k, r in enumerate(RULES) if int(f) >> k & 1] for f in flags]


def new_counters(device) -> torch.Tensor:
    """A zeroed counter vector int64 [NUM_COUNTERS] (layout: COUNTER_NAMES)."""
    return torch.zeros(NUM_COUNTERS, dtype=torch.int64, device=device)


def _check(node_tokens, parents, n_nodes, target_argmax, accepted_depth, commit_len, finished,
           counters, node_mask, positions, seq_len):
    check_tensor("node_tokens", node_tokens, INT_DTYPES, (None, None))
    B, N = node_tokens.shape
    check_n("node_tokens", N, AUDIT_MAX_N)
    check_tensor("parents", parents, INT_DTYPES, (B, N))
    check_tensor("n_nodes", n_nodes, INT_DTYPES, (B,))
    check_tensor("target_argmax", target_argmax, INT_DTYPES, (B, N))
    check_tensor("accepted_depth", accepted_depth, INT_DTYPES, (B,))
    check_tensor("commit_len", commit_len, INT_DTYPES, (B,))
    check_tensor("finished", finished, (torch.bool,) + INT_DTYPES, (B,))
    check_tensor("counters", counters, (torch.int64,), (NUM_COUNTERS,))
    if node_mask is not None:
        check_tensor("node_mask", node_mask, MASK_DTYPES, (B, N, N))
    if (positions is None) != (seq_len is None):
        raise ValueError("positions and seq_len go together: give both or neither")
    if positions is not None:
        check_tensor("positions", positions, INT_DTYPES, (B, N))
        check_tensor("seq_len", seq_len, INT_DTYPES, (B,))
    dev = check_same_device(node_tokens=node_tokens, parents=parents, n_nodes=n_nodes,
                            target_argmax=target_argmax, accepted_depth=accepted_depth,
                            commit_len=commit_len, finished=finished, counters=counters,
                            node_mask=node_mask, positions=positions, seq_len=seq_len)
    return B, N, dev


def audit_step_ref(node_tokens, parents, n_nodes, target_argmax, accepted_depth, commit_len,
                   finished, counters, *, chain: bool = False, eos_id: int = -1, node_mask=None,
                   positions=None, seq_len=None) -> AuditResult:
    """Torch reference of `audit_step` (same signature, same flags, same counter update)."""
    B, N, dev = _check(node_tokens, parents, n_nodes, target_argmax, accepted_depth, commit_len,
                       finished, counters, node_mask, positions, seq_len)
    idx = torch.arange(N, device=dev)
    n_raw = n_nodes.long()
    n = n_raw.clamp(1, N)
    valid = idx[None, :] < n[:, None]                                  # [B, N]
    par = parents.long()
    bad = valid & torch.where(idx == 0, par != -1, (par < 0) | (par >= idx))
    if chain:
        bad |= valid & (idx > 0) & (par != idx - 1)
    tree_bad = bad.any(1) | (n_raw < 1) | (n_raw > N)
    par = torch.where(valid & (par >= 0) & (par < idx), par, -1)      # a bad parent: no edge
    # ancestor-or-self sets and depths, row i from row parents[i] (parents precede children)
    rows = torch.arange(B, device=dev)
    anc = torch.eye(N, dtype=torch.bool, device=dev).repeat(B, 1, 1)   # [B, N, N]
    dep = torch.zeros((B, N), dtype=torch.long, device=dev)
    for i in range(1, N):
        p = par[:, i]
        has = p >= 0
        ps = p.clamp(min=0)
        anc[:, i] |= anc[rows, ps] & has[:, None]
        dep[:, i] = torch.where(has, dep[rows, ps] + 1, 0)
    path, depth, bonus = tree_walk_ref(node_tokens, par, target_argmax, n)
    depth = depth.long()
    # the derived commit is argmax along the path (accepted drafts, then the bonus)
    t = idx[None, :]
    seq = target_argmax.gather(1, path.long().clamp(min=0))
    hit = (seq == eos_id) & (t <= depth[:, None]) & (eos_id >= 0)
    eos_k = torch.where(hit.any(1), hit.int().argmax(1), -1)
    rd, rc, fin = accepted_depth.long(), commit_len.long(), finished != 0
    depth_bad = rd != depth
    commit_bad = torch.where(fin, (rc < 1) | (rc > depth + 1), rc != depth + 1)
    eos_bad = (eos_k >= 0) & ((rc > eos_k + 1) | ~fin)
    mask_bad = torch.zeros(B, dtype=torch.bool, device=dev)
    h = None
    if node_mask is not None:
        blk = valid[:, :, None] & valid[:, None, :]
        mask_bad = ((visible(node_mask) != anc) & blk).flatten(1).any(1)
        h = mask_hash_ref(node_mask, n)
    pos_bad = torch.zeros(B, dtype=torch.bool, device=dev)
    if positions is not None:
        pos_bad = (valid & (positions.long() != seq_len.long()[:, None] + dep)).any(1)
    rules = torch.stack([tree_bad, depth_bad, commit_bad, eos_bad, mask_bad, pos_bad], 1)  # [B, R]
    flags = (rules.int() << torch.arange(NUM_RULES, device=dev)).sum(1).int()
    counters += torch.cat([rules.long().sum(0), rules.any(1).long().sum()[None],
                           torch.full((1,), B, dtype=torch.long, device=dev)])
    return AuditResult(flags, depth.int(), bonus, h)


if triton is not None:
    @triton.jit
    def _audit_kernel(tok_ptr, par_ptr, n_ptr, am_ptr, rd_ptr, rc_ptr, fin_ptr,
                      mask_ptr, pos_ptr, seq_ptr,
                      flags_ptr, depth_ptr, bonus_ptr, hash_ptr, cnt_ptr,
                      B, N, eos_id,
                      IS_CHAIN: tl.constexpr, HAS_MASK: tl.constexpr, MASK_FLOAT: tl.constexpr,
                      HAS_POS: tl.constexpr, VIS_ABOVE: tl.constexpr, OFFSET: tl.constexpr,
                      PRIME: tl.constexpr, NUM_RULES: tl.constexpr,
                      BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, ROWS_PER_LOAD: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)     # [BB]
        row_ok = rows < B
        cols = tl.arange(0, BLOCK_N)                                   # [BN], BN <= 64
        c2 = cols[None, :]
        n_raw = tl.load(n_ptr + rows, mask=row_ok, other=1)
        n = tl.minimum(tl.maximum(n_raw, 1), N).to(tl.int32)
        base = rows.to(tl.int64) * N
        off = base[:, None] + c2
        valid = row_ok[:, None] & (c2 < n[:, None])                    # [BB, BN] real nodes
        tok = tl.load(tok_ptr + off, mask=valid, other=0)
        par = tl.load(par_ptr + off, mask=valid, other=-1)
        am = tl.load(am_ptr + off, mask=valid, other=0)

        # rule tree: parents[0] = -1, 0 <= parents[i] < i; a chain has parents[i] = i - 1
        par_bad = valid & tl.where(c2 == 0, par != -1, (par < 0) | (par >= c2))
        if IS_CHAIN:
            par_bad = par_bad | (valid & (c2 > 0) & (par != c2 - 1))
        tree_bad = (tl.max(par_bad.to(tl.int32), axis=1) > 0) | (n_raw < 1) | (n_raw > N)
        par = tl.where(valid & (par >= 0) & (par < c2), par, -1).to(tl.int32)  # bad: no edge

        # good[c]: c's token is the target's argmax at its parent (accepted once the parent is)
        child = par >= 0
        am_par = tl.load(am_ptr + base[:, None] + tl.where(child, par, 0), mask=child, other=0)
        good = child & (tok == am_par)

        one = tl.full([1], 1, tl.int64)
        bits = one << cols.to(tl.int64)                                # [BN] 1 << j
        # loads whose results are needed only after the loop: issue them now
        rd = tl.load(rd_ptr + rows, mask=row_ok, other=0)
        rc = tl.load(rc_ptr + rows, mask=row_ok, other=0)
        fin = tl.load(fin_ptr + rows, mask=row_ok, other=0) != 0
        if HAS_POS:
            pos = tl.load(pos_ptr + off, mask=valid, other=0)
            seq = tl.load(seq_ptr + rows, mask=row_ok, other=0)
        # pack the fed mask: words[b, i] bit j = node i sees node j (j < n). Chunks of
        # ROWS_PER_LOAD rows, unrolled, so the loads overlap instead of one per node below.
        words = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.int64)
        if HAS_MASK:
            r3 = tl.arange(0, ROWS_PER_LOAD)
            c3 = cols[None, None, :]                                   # [1, 1, BN]
            for i0 in tl.static_range(0, BLOCK_N, ROWS_PER_LOAD):
                ii = i0 + r3[None, :, None]                            # [1, RC, 1] rows
                ld = valid[:, None, :] & (ii < n[:, None, None])       # [BB, RC, BN]
                m = tl.load(mask_ptr + base[:, None, None] * N + ii * N + c3, mask=ld, other=0)
                if MASK_FLOAT:
                    vis = ld & (m > VIS_ABOVE)
                else:
                    vis = ld & (m != 0)
                w = tl.sum(tl.where(vis, bits[None, None, :], 0), axis=2)  # [BB, RC], OR of bits
                words += tl.sum(tl.where(c3 == ii, w[:, :, None], 0), axis=1)  # to columns i0..

        anc = bits[None, :] + tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.int64)  # self bits
        cur = tl.zeros([BLOCK_B], dtype=tl.int32)
        depth = tl.zeros([BLOCK_B], dtype=tl.int32)
        alive = row_ok
        order = tl.where(c2 == 0, 0, -1) + tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.int32)
        h = tl.full([BLOCK_B], OFFSET, tl.int64)
        h = (h ^ n.to(tl.int64)) * PRIME
        if HAS_MASK:  # FNV-1a step for row 0
            h = (h ^ tl.sum(tl.where(c2 == 0, words, 0), axis=1)) * PRIME

        # one pass over nodes i = 1..N-1, registers only; three independent chains:
        #   ancestors: anc[i] = anc[parents[i]] | 1 << i (a parent precedes its child)
        #   hash:      the FNV-1a step for row i (rows hash in order)
        #   walk:      step from cur to its first good child (one depth per iteration)
        for i in range(1, N):
            is_i = c2 == i
            p_i = tl.sum(tl.where(is_i, par, 0), axis=1)              # [BB], -1: no parent
            anc_i = tl.sum(tl.where(c2 == p_i[:, None], anc, 0), axis=1) | (one << i)  # [BB]
            anc = tl.where(is_i, anc_i[:, None], anc)
            if HAS_MASK:
                word_i = tl.sum(tl.where(is_i, words, 0), axis=1)
                h = tl.where(row_ok & (i < n), (h ^ word_i) * PRIME, h)
            cand = good & (par == cur[:, None])
            nxt = tl.min(tl.where(cand, c2, BLOCK_N), axis=1)         # first matching child
            has = alive & (nxt < BLOCK_N)
            depth += has.to(tl.int32)
            cur = tl.where(has, nxt, cur)
            order = tl.where(has[:, None] & (c2 == nxt[:, None]), depth[:, None], order)
            alive = has

        # rule mask: every fed row equals its ancestor-or-self word
        mask_bad = tl.zeros([BLOCK_B], dtype=tl.int1)
        if HAS_MASK:
            mask_bad = tl.max((valid & (words != anc)).to(tl.int32), axis=1) > 0
        # first EOS in the derived commit (argmax at path[0..depth]), BLOCK_N when none
        eos_k = tl.min(tl.where((order >= 0) & (am == eos_id), order, BLOCK_N), axis=1)
        has_eos = (eos_k < BLOCK_N) & (eos_id >= 0)
        bonus = tl.load(am_ptr + base + cur, mask=row_ok, other=0)
        depth_bad = rd != depth
        commit_bad = tl.where(fin, (rc < 1) | (rc > depth + 1), rc != depth + 1)
        eos_bad = has_eos & ((rc > eos_k + 1) | (fin == 0))
        pos_bad = tl.zeros([BLOCK_B], dtype=tl.int1)
        if HAS_POS:
            # depth(i) = |ancestors(i)| - 1: SWAR popcount of the int64 words (wrapping
            # arithmetic; every mask below clears the bits an arithmetic shift drags in)
            x = anc - ((anc >> 1) & 0x5555555555555555)
            x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
            x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
            dep = ((x * 0x0101010101010101) >> 56) - 1
            pos_bad = tl.max((valid & (pos != seq[:, None] + dep)).to(tl.int32), axis=1) > 0
        flags = (tree_bad.to(tl.int32) | depth_bad.to(tl.int32) << 1 | commit_bad.to(tl.int32) << 2
                 | eos_bad.to(tl.int32) << 3 | mask_bad.to(tl.int32) << 4 | pos_bad.to(tl.int32) << 5)
        flags = tl.where(row_ok, flags, 0)
        tl.store(flags_ptr + rows, flags, mask=row_ok)
        tl.store(depth_ptr + rows, depth, mask=row_ok)
        tl.store(bonus_ptr + rows, bonus, mask=row_ok)
        if HAS_MASK:
            tl.store(hash_ptr + rows, h, mask=row_ok)
        # counters: per rule, then violating steps, then steps; one vector atomic per program
        kk = tl.arange(0, NUM_RULES + 2)
        per = tl.sum((flags[:, None] >> kk[None, :]) & 1, axis=0)
        per = tl.where(kk == NUM_RULES, tl.sum((flags != 0).to(tl.int32), axis=0), per)
        per = tl.where(kk == NUM_RULES + 1, tl.sum(row_ok.to(tl.int32), axis=0), per)
        tl.atomic_add(cnt_ptr + kk, per.to(tl.int64))
else:  # pragma: no cover
    _audit_kernel = None


def audit_step(node_tokens, parents, n_nodes, target_argmax, accepted_depth, commit_len,
               finished, counters, *, chain: bool = False, eos_id: int = -1, node_mask=None,
               positions=None, seq_len=None, block_b: int | None = None,
               num_warps: int | None = None) -> AuditResult:
    """Triton kernel: audit one batched verify step on device; no host sync.

    node_tokens, parents, target_argmax [B, N] int (N <= 64); n_nodes, accepted_depth,
    commit_len [B] int; finished [B] bool or int; counters int64 [NUM_COUNTERS], added to
    in place. Optional: node_mask [B, N, N] (bool or additive float) as fed to attention;
    positions [B, N] with seq_len [B] as fed. eos_id < 0 disables the eos rule.
    block_b, num_warps: launch shape overrides (benchmark sweeps); default: a heuristic.
    """
    B, N, dev = _check(node_tokens, parents, n_nodes, target_argmax, accepted_depth, commit_len,
                       finished, counters, node_mask, positions, seq_len)
    require_triton(_audit_kernel, dev, "audit_step_ref")
    flags = torch.empty(B, dtype=torch.int32, device=dev)
    depth = torch.empty(B, dtype=torch.int32, device=dev)
    bonus = torch.empty(B, dtype=target_argmax.dtype, device=dev)
    h = torch.empty(B, dtype=torch.int64, device=dev) if node_mask is not None else None
    if B == 0:
        return AuditResult(flags, depth, bonus, h)
    if NUM_RULES + 2 != 8:  # the counter vector is one power-of-two arange in the kernel
        raise AssertionError("NUM_COUNTERS must stay 8")
    BN = max(next_pow2(N), 2)
    BB = block_rows(B, BN, _audit_kernel, block_b)
    fin = finished.view(torch.uint8) if finished.dtype == torch.bool else finished
    dummy = flags  # stands in for absent optional tensors (never read: constexpr-guarded)
    _audit_kernel[(triton.cdiv(B, BB),)](
        node_tokens, parents, n_nodes, target_argmax, accepted_depth, commit_len, fin,
        node_mask if node_mask is not None else dummy,
        positions if positions is not None else dummy,
        seq_len if seq_len is not None else dummy,
        flags, depth, bonus, h if h is not None else dummy, counters,
        B, N, int(eos_id),
        IS_CHAIN=bool(chain), HAS_MASK=node_mask is not None,
        MASK_FLOAT=node_mask is not None and node_mask.dtype != torch.bool,
        HAS_POS=positions is not None, VIS_ABOVE=ADDITIVE_VISIBLE_ABOVE,
        OFFSET=FNV_OFFSET_I64, PRIME=FNV_PRIME_I64, NUM_RULES=NUM_RULES,
        BLOCK_B=BB, BLOCK_N=BN, ROWS_PER_LOAD=rows_per_load(BB, BN, _audit_kernel),
        num_warps=warps(BB * BN, num_warps))
    return AuditResult(flags, depth, bonus, h)
