"""Compiled "is anything bad in this batch?" tests of the hottest step rules (numba).

    kern = compiled.kernels("specaudit.invariants.rule_kernels", rows=f.R)   # or None

Each kernel answers, in one pass over the frame's own arrays, whether the rule's numpy
mask has any hit (True) or none (False); when it says True the rule runs its numpy
code unchanged, which finds the rows and builds every message. The numpy code is the
definition: tests/test_compiled_rules.py holds each answer equal to numpy's mask.any()
and the findings equal with and without kernels. Imported only through
invariants/compiled.py (it imports numba).

Shapes, as in StepFrame (invariants/frame.py): R rows, "sorted rows" r (by request,
step) or "batch rows" b (the file's order; inv [R] maps b -> r); T flat nodes in batch
order, sorted row r's at start[r] .. start[r] + n[r] - 1, a uniform-N batch's viewed as
[R, N0] blocks (block b is batch row b); P flat path entries in batch order, row r's at
path_start[r] .. path_start[r] + path_len[r] - 1, path_row [P] the sorted row of each.
Node indices in path and parent_in_row are local to their row. Inner loops over a row
run to their end (no early exit: they vectorise), the batch stops at a bad block.

  positions_bad_uniform / positions_bad_parents   SA201 (positions = seq_len + depth)
  path_argmax_bad_chain / path_argmax_bad         SA304 (path follows the argmax)
  path_not_maximal_chain / _table / path_not_maximal   SA305 (no child carries the bonus)
  hash_differs                                    SA202 (mask_hash, a batch of chains)
  node_count_bad                                  SA102 (N within the budget)
  root_parent_bad                                 SA103 (the root's parent is -1)
  root_continuity_bad                             SA403 (the root continues the last commit)
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def positions_bad_uniform(pos, seq_len, inv, ids, depth):
    """SA201 on a uniform-N batch of known shapes: any pos[b, i] != seq_len[inv[b]] +
    depth[ids[b], i]. pos [R, N0] (int32 or int64), seq_len [R] (sorted rows), inv [R],
    ids [R] (batch row -> shape; empty: every row is shape 0), depth [U, N0] -> bool."""
    R, N0 = pos.shape
    one = len(ids) == 0
    for b in range(R):
        want = seq_len[inv[b]]
        u = 0 if one else ids[b]
        bad = False
        for i in range(N0):
            bad |= pos[b, i] != want + depth[u, i]
        if bad:
            return True
    return False


@njit(cache=True, nogil=True)
def positions_bad_parents(pos, seq_len, start, n, parent_in_row, inv):
    """SA201 on any batch: each node's depth from the safe parents (parent_in_row [T], an
    earlier node of the row, -1 at a root), then any pos[start[r] + i] != seq_len[r] +
    depth. pos [T], seq_len, start, n [R] (sorted rows), inv [R] (rows visited in batch
    order: the nodes in memory order) -> bool."""
    dep = np.zeros(max(n.max(), 1) if len(n) else 1, dtype=np.int64)   # [max N]: one row's depths
    for b in range(len(inv)):
        r = inv[b]
        s, want = start[r], seq_len[r]
        bad = False
        for i in range(n[r]):
            p = parent_in_row[s + i]
            d = dep[p] + 1 if p >= 0 else 0
            dep[i] = d
            bad |= pos[s + i] != want + d
        if bad:
            return True
    return False


@njit(cache=True, nogil=True)
def path_argmax_bad(ok, path, path_start, path_len, start, argmax, tokens, inv):
    """SA304: any ok row with a path entry k >= 1 whose node's token differs from the
    target's argmax at entry k - 1's node. ok [R] bool (sorted rows: a valid walk, every
    entry inside the row), path [P], path_start, path_len, start [R], argmax, tokens [T],
    inv [R] (rows visited in batch order: the entries in memory order) -> bool."""
    for b in range(len(inv)):
        r = inv[b]
        if not ok[r]:
            continue
        s, ps = start[r], path_start[r]
        bad = False
        for k in range(ps + 1, ps + path_len[r]):
            bad |= argmax[s + path[k - 1]] != tokens[s + path[k]]
        if bad:
            return True
    return False


@njit(cache=True, nogil=True)
def path_argmax_bad_chain(ok, path_len, inv, tok, arg):
    """SA304 on a uniform-N batch of chains: an ok row's path is 0, 1, .., L - 1 (each
    entry the child of the one before: the next node), so no path entry is read: any
    node 1 <= i < L with tok[b, i] != arg[b, i - 1]. ok, path_len, inv [R], tok, arg
    [R, N0] -> bool."""
    R, N0 = tok.shape
    for b in range(R):
        r = inv[b]
        L = path_len[r] if ok[r] else 0
        bad = False
        for i in range(1, N0):
            bad |= (i < L) & (arg[b, i - 1] != tok[b, i])
        if bad:
            return True
    return False


@njit(cache=True, nogil=True)
def path_not_maximal_chain(ok, path_len, inv, tok, arg):
    """SA305 on a uniform-N batch of chains: an ok row's path ends at node L - 1 (see
    path_argmax_bad_chain), whose only child is node L: any ok row with L < N0 and
    tok[b, L] == arg[b, L - 1]. ok, path_len, inv [R], tok, arg [R, N0] -> bool."""
    R, N0 = tok.shape
    bad = False
    for b in range(R):
        r = inv[b]
        L = path_len[r]
        c = min(max(L, 1), N0 - 1)                      # (clamped where the row is not used)
        bad |= ok[r] & (L < N0) & (tok[b, c] == arg[b, c - 1])
    return bad


@njit(cache=True, nogil=True)
def path_not_maximal_table(ok, path, path_start, path_len, inv, ids, children, tok, arg):
    """SA305 on a uniform-N batch of known shapes: any ok row whose path's last node L
    has a child c with tok[b, c] == arg[b, L] (the bonus). ok [R] bool (sorted rows: a
    valid walk of at least one entry, not sampled), path [P], path_start, path_len, inv
    [R], ids [R] (batch row -> shape; empty: every row is shape 0), children [U, N0, K]
    (each node's children ascending, -1 after the last), tok, arg [R, N0] -> bool."""
    R = tok.shape[0]
    K = children.shape[2]
    one = len(ids) == 0
    for b in range(R):
        r = inv[b]
        if not ok[r]:
            continue
        last = path[path_start[r] + path_len[r] - 1]
        bonus = arg[b, last]
        u = 0 if one else ids[b]
        bad = False
        for k in range(K):
            c = children[u, last, k]
            bad |= (c >= 0) & (tok[b, max(c, 0)] == bonus)
        if bad:
            return True
    return False


@njit(cache=True, nogil=True)
def path_not_maximal(ok, path, path_start, path_len, start, n, parent_in_row, tokens, argmax, inv):
    """SA305 on any batch: any ok row whose path's last node L has a child (a later node
    whose safe parent, parent_in_row [T], is L) carrying argmax at L. ok [R] bool as in
    path_not_maximal_table, path [P], path_start, path_len, start, n [R], tokens, argmax
    [T], inv [R] (rows visited in batch order) -> bool."""
    for b in range(len(inv)):
        r = inv[b]
        if not ok[r]:
            continue
        s = start[r]
        last = path[path_start[r] + path_len[r] - 1]
        bonus = argmax[s + last]
        bad = False
        for i in range(last + 1, n[r]):
            bad |= (parent_in_row[s + i] == last) & (tokens[s + i] == bonus)
        if bad:
            return True
    return False


@njit(cache=True, nogil=True)
def node_count_bad(n_raw, n, budget, too_many):
    """SA102: any row with no node, more than budget + 1 nodes, or above MAX_NODES.
    n_raw, n, budget [R], too_many [R] bool (the frame's) -> bool."""
    bad = False
    for r in range(len(n)):
        bad |= (n_raw[r] < 1) | (n[r] > budget[r] + 1) | too_many[r]
    return bad


@njit(cache=True, nogil=True)
def root_parent_bad(root_parent_bad, n):
    """SA103: any row with nodes whose root's parent is not -1. root_parent_bad [R]
    bool (the frame's), n [R] -> bool."""
    bad = False
    for r in range(len(n)):
        bad |= root_parent_bad[r] & (n[r] > 0)
    return bad


@njit(cache=True, nogil=True)
def root_continuity_bad(has_prev, step, prev_step, prev_last, start, n, tokens, inv):
    """SA403: any row that follows its request's previous step (step = prev_step + 1)
    whose root token differs from that step's last committed token. has_prev, step,
    prev_step, prev_last, start, n [R] (sorted rows), tokens [T], inv [R] (rows visited
    in batch order: the roots in memory order) -> bool."""
    R, T1 = len(n), len(tokens) - 1
    if T1 < 0:
        return False
    bad = False   # (one pass to the end: a clean batch, the usual one, reads every row anyway)
    for b in range(R):
        r = inv[b]
        use = has_prev[r] & (step[r] == prev_step[r] + 1) & (n[r] > 0)
        bad |= use & (tokens[min(start[r], T1)] != prev_last[r])
    return bad


@njit(cache=True, nogil=True)
def hash_differs(mask_hash, want):
    """SA202 where every row's contract hash is the same `want` (a uniform batch of
    chains): any mask_hash[r] != want. mask_hash [R] uint64, want uint64 -> bool."""
    bad = False
    for r in range(len(mask_hash)):
        bad |= mask_hash[r] != want
    return bad
