"""Compiled "is anything bad in this batch?" tests of the hottest step rules:
rule_kernels.c, built and loaded by invariants/compiled.py (importing this module builds
it on first use).

    kern = compiled.kernels("specaudit.invariants.rule_kernels", rows=f.R)   # or None

Each kernel answers, in one pass over the frame's own arrays, whether the rule's numpy
mask has any hit (True) or none (False); when it says True the rule runs its numpy
code unchanged, which finds the rows and builds every message. The numpy code is the
definition: tests/test_compiled_rules.py holds each answer equal to numpy's mask.any()
and the findings equal with and without kernels. Imported only through
invariants/compiled.py. An array the C does not take as it is (token values other than
int32, say) gets the answer True: "maybe", and the rule's numpy decides.

Shapes, as in StepFrame (invariants/frame.py): R rows, "sorted rows" r (by request,
step) or "batch rows" b (the file's order; inv [R] maps b -> r); T flat nodes in batch
order, sorted row r's at start[r] .. start[r] + n[r] - 1, a uniform-N batch's viewed as
[R, N0] blocks (block b is batch row b); P flat path entries in batch order, row r's at
path_start[r] .. path_start[r] + path_len[r] - 1, path_row [P] the sorted row of each.
Node indices in path and parent_in_row are local to their row. Inner loops over a row
run to their end (no early exit: they vectorise), the batch stops at a bad row.

  positions_bad_chain / _uniform / _parents      SA201 (positions = seq_len + depth)
  path_chain_bad / path_tree_bad                  SA304 and SA305 on chains / known shapes, one pass
  path_argmax_bad                                 SA304 (path follows the argmax)
  path_not_maximal                                SA305 (no child carries the bonus)
  hash_differs                                    SA202 (mask_hash, a batch of chains)
  node_count_bad                                  SA102 (N within the budget)
  root_parent_bad                                 SA103 (the root's parent is -1)
  root_continuity_bad                             SA403 (the root continues the last commit)
  step_bad                                        SA401 (step = the previous step + 1)
  commit_len_bad                                  SA301 (commit_len vs accepted_depth + 1)
  path_depth_bad                                  SA302 (the path's depth is accepted_depth)
  eos_inside_commit                               SA308 (nothing committed after EOS)
  children_over_topk / _chain                     SA105 (children of a node <= topk)
  token_limit_bad                                 SA311 (max_new_tokens ends the output)
  seq_len_bad                                     SA402 (seq_len where the previous step ended)
  committed_tokens_bad                            SA307 (the commit is the path's tokens + bonus)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .compiled import bind, library

_LIB = library(Path(__file__).with_name("rule_kernels.c"))
_POS = {np.dtype(np.int32): "w", np.dtype(np.int64): "l"}     # positions' dtype -> its C code
_BITS = {"w": 32, "l": 64}
_UNIFORM = {c: bind(_LIB, f"positions_bad_uniform_p{_BITS[c]}", f"i i {c} l l i l l", True) for c in _BITS}
_CHAIN = {(p, q): bind(_LIB, f"positions_bad_chain_p{_BITS[p]}_s{_BITS[q]}", f"i i {p} {q}", True)
          for p in _BITS for q in _BITS}
_PARENTS = {c: bind(_LIB, f"positions_bad_parents_p{_BITS[c]}", f"i {c} l l l l l ol", True) for c in _BITS}
_ARGMAX = bind(_LIB, "path_argmax_bad", "i b w l l l w w l", True)
_PATH_CHAIN = bind(_LIB, "path_chain_bad", "i i b l l w w", True)
_MAXIMAL = bind(_LIB, "path_not_maximal", "i b w l l l l l w w l", True)
_PATH_TREE = bind(_LIB, "path_tree_bad", "i i i b w l l l i l l w w", True)
_NODE_COUNT = bind(_LIB, "node_count_bad", "i l l l b", True)
_ROOT_PARENT = bind(_LIB, "root_parent_bad", "i b l", True)
_ROOT_CONTINUITY = bind(_LIB, "root_continuity_bad", "i i b l w w l l w l", True)
_HASH = bind(_LIB, "hash_differs", "i q u", True)
_STEP = {c: bind(_LIB, f"step_bad_p{_BITS[c]}", f"i l b {c}", True) for c in _BITS}
_SEQ_LEN = {c: bind(_LIB, f"seq_len_bad_p{_BITS[c]}", f"i l b {c} l l", True) for c in _BITS}
# the per-row tests (one blocked pass over sorted rows): C name -> its argument codes
_ROW = {name: bind(_LIB, name, spec, True) for name, spec in (
    ("commit_len_bad", "i l l b"), ("path_depth_bad", "i l l"), ("eos_inside_commit", "i l l"),
    ("children_over_topk", "i b l l"), ("children_over_topk_chain", "i b l l"),
    ("token_limit_bad", "i i i l l l b b b"), ("committed_tokens_bad", "i b b l l l"))}
_I64 = np.iinfo(np.int64)


def _i64(*values) -> bool:
    """Every array whose values a test adds to int64: numpy's sums wrap in its dtype, the
    C's in int64, so another width gets "maybe"."""
    return all(v.dtype == np.int64 for v in values)


def _i32(*values) -> bool:
    """Every token-valued array int32 (the contract's type): the C reads them as they are."""
    return all(v.dtype == np.int32 for v in values)


def positions_bad_uniform(pos, seq_len, inv, ids, depth):
    """SA201 on a uniform-N batch of known shapes: any pos[b, i] != seq_len[inv[b]] +
    depth[ids[b], i]. pos [R, N0] (int32 or int64), seq_len [R] (sorted rows), inv [R],
    ids [R] (batch row -> shape; empty: every row is shape 0), depth [U, N0] -> bool."""
    c = _POS.get(pos.dtype)
    if c is None:
        return True
    R, N0 = pos.shape
    return bool(_UNIFORM[c](R, N0, pos, seq_len, inv, len(ids), ids, depth))


def positions_bad_chain(pos, seq):
    """SA201 on a uniform-N batch of chains (each node's depth its index): any pos[b, i]
    != seq[b] + i. pos [R, N0], seq [R] (seq_len in batch order: seq_len[inv]), each int32
    or int64 -> bool."""
    c, s = _POS.get(pos.dtype), _POS.get(seq.dtype)
    if c is None or s is None:
        return True
    R, N0 = pos.shape
    return bool(_CHAIN[c, s](R, N0, pos, seq))


def positions_bad_parents(pos, seq_len, start, n, parent_in_row, inv):
    """SA201 on any batch: each node's depth from the safe parents (parent_in_row [T], an
    earlier node of the row, -1 at a root), then any pos[start[r] + i] != seq_len[r] +
    depth. pos [T], seq_len, start, n [R] (sorted rows), inv [R] (rows visited in batch
    order: the nodes in memory order) -> bool."""
    c = _POS.get(pos.dtype)
    if c is None:
        return True
    dep = np.zeros(max(int(n.max()), 1) if len(n) else 1, dtype=np.int64)   # [max N]: one row's depths
    return bool(_PARENTS[c](len(inv), pos, seq_len, start, n, parent_in_row, inv, dep))


def path_argmax_bad(ok, path, path_start, path_len, start, argmax, tokens, inv):
    """SA304: any ok row with a path entry k >= 1 whose node's token differs from the
    target's argmax at entry k - 1's node. ok [R] bool (sorted rows: a valid walk, every
    entry inside the row), path [P], path_start, path_len, start [R], argmax, tokens [T],
    inv [R] (rows visited in batch order: the entries in memory order) -> bool."""
    if not _i32(path, argmax, tokens):
        return True
    return bool(_ARGMAX(len(inv), ok, path, path_start, path_len, start, argmax, tokens, inv))


def path_chain_bad(ok, path_len, inv, tok, arg):
    """SA304 and SA305 on a uniform-N batch of chains, one pass: an ok row's path is 0, 1,
    .., L - 1 (each entry the child of the one before: the next node), so no path entry is
    read. -> (SA304: any node 1 <= i < L with tok[b, i] != arg[b, i - 1]; SA305: any ok
    row with L < N0 and tok[b, L] == arg[b, L - 1], the only child of the path's last
    node carrying the bonus). ok, path_len, inv [R], tok, arg [R, N0]."""
    if not _i32(tok, arg):
        return True, True
    R, N0 = tok.shape
    found = _PATH_CHAIN(R, N0, ok, path_len, inv, tok, arg)
    return bool(found & 1), bool(found & 2)


def path_tree_bad(ok, path, path_start, path_len, inv, ids, children, tok, arg):
    """SA304 and SA305 on a uniform-N batch of known shapes, one pass -> (SA304: as
    path_argmax_bad; SA305: any ok row whose path's last node L has a child c with
    tok[b, c] == arg[b, L], the bonus). ok [R] bool (sorted rows: a valid walk of at least
    one entry, not sampled), path [P], path_start, path_len, inv [R], ids [R] (batch row
    -> shape; empty: every row is shape 0), children [U, N0, K] (each node's children
    ascending, -1 after the last), tok, arg [R, N0]."""
    if not _i32(path, tok, arg):
        return True, True
    R, N0 = tok.shape
    found = _PATH_TREE(R, N0, children.shape[2], ok, path, path_start, path_len, inv, len(ids), ids,
                       children, tok, arg)
    return bool(found & 1), bool(found & 2)


def path_not_maximal(ok, path, path_start, path_len, start, n, parent_in_row, tokens, argmax, inv):
    """SA305 on any batch: any ok row whose path's last node L has a child (a later node
    whose safe parent, parent_in_row [T], is L) carrying argmax at L. ok [R] bool as in
    path_tree_bad, path [P], path_start, path_len, start, n [R], tokens, argmax
    [T], inv [R] (rows visited in batch order) -> bool."""
    if not _i32(path, tokens, argmax):
        return True
    return bool(_MAXIMAL(len(inv), ok, path, path_start, path_len, start, n, parent_in_row, tokens, argmax, inv))


def node_count_bad(n_raw, n, budget, too_many):
    """SA102: any row with no node, more than budget + 1 nodes, or above MAX_NODES.
    n_raw, n, budget [R], too_many [R] bool (the frame's) -> bool."""
    return bool(_NODE_COUNT(len(n), n_raw, n, budget, too_many))


def root_parent_bad(root_parent_bad, n):
    """SA103: any row with nodes whose root's parent is not -1. root_parent_bad [R]
    bool (the frame's), n [R] -> bool."""
    return bool(_ROOT_PARENT(len(n), root_parent_bad, n))


def root_continuity_bad(has_prev, step, prev_step, prev_last, start, n, tokens, inv):
    """SA403: any row that follows its request's previous step (step = prev_step + 1)
    whose root token differs from that step's last committed token. has_prev, step,
    prev_step, prev_last, start, n [R] (sorted rows), tokens [T], inv [R] (rows visited
    in batch order: the roots in memory order) -> bool."""
    if not _i32(prev_step, prev_last, tokens):
        return True
    return bool(_ROOT_CONTINUITY(len(n), len(tokens), has_prev, step, prev_step, prev_last, start, n, tokens, inv))


def hash_differs(mask_hash, want):
    """SA202 where every row's contract hash is the same `want` (a uniform batch of
    chains): any mask_hash[r] != want. mask_hash [R] uint64, want uint64 -> bool."""
    return bool(_HASH(len(mask_hash), mask_hash, int(want)))


def step_bad(step, has_prev, prev_step):
    """SA401: any step != where(has_prev, prev_step + 1, 0). step [R] int64, has_prev
    [R] bool, prev_step [R] int32 or int64 (+ 1 wraps in its width, as numpy's) -> bool."""
    c = _POS.get(prev_step.dtype)
    if c is None or not _i64(step):
        return True
    return bool(_STEP[c](len(step), step, has_prev, prev_step))


def commit_len_bad(accepted_depth, commit_len, finished):
    """SA301: want = accepted_depth + 1; any unfinished row with commit_len != want or
    finished one with commit_len > want. [R] int64, int64, bool -> bool."""
    if not _i64(accepted_depth, commit_len):
        return True
    return bool(_ROW["commit_len_bad"](len(commit_len), accepted_depth, commit_len, finished))


def path_depth_bad(path_len, accepted_depth):
    """SA302: any row with path_len >= 1 and path_len - 1 != accepted_depth. [R] -> bool."""
    if not _i64(accepted_depth):
        return True
    return bool(_ROW["path_depth_bad"](len(path_len), path_len, accepted_depth))


def eos_inside_commit(eos_at, commit_n):
    """SA308: any row with 0 <= eos_at < commit_n - 1 (eos_at: the commit's first EOS
    index, -1 when none). [R] int64 -> bool."""
    if not _i64(commit_n):
        return True
    return bool(_ROW["eos_inside_commit"](len(commit_n), eos_at, commit_n))


def children_over_topk(ok, kids, topk):
    """SA105: any ok row with kids > topk. ok [R] bool, kids, topk [R] -> bool."""
    return bool(_ROW["children_over_topk"](len(ok), ok, kids, topk))


def children_over_topk_chain(ok, n, topk):
    """SA105 on a batch of chains (children_max = (n > 1) as 0/1, without building it):
    any ok row with (n > 1) > topk. ok [R] bool, n, topk [R] -> bool."""
    return bool(_ROW["children_over_topk_chain"](len(ok), ok, n, topk))


def token_limit_bad(M, eos, out_before, commit_n, commit_last, contiguous, path_ok, finished):
    """SA311 with max_new_tokens M: out = out_before + commit_n; any contiguous, path_ok
    row finished without a cause (commit_last != eos and out != M), with out > M, or
    unfinished with out >= M. M, eos ints; out_before, commit_n, commit_last int64,
    contiguous, path_ok, finished bool [R] -> bool."""
    if not (_I64.min <= M <= _I64.max and _I64.min <= eos <= _I64.max and _i64(out_before, commit_n, commit_last)):
        return True
    return bool(_ROW["token_limit_bad"](len(commit_n), M, eos, out_before, commit_n, commit_last, contiguous,
                                        path_ok, finished))


def seq_len_bad(step, has_prev, prev_step, seq_len, prev_seq_end):
    """SA402: any has_prev row with step == prev_step + 1 and seq_len != prev_seq_end.
    step, seq_len, prev_seq_end [R] int64, has_prev [R] bool, prev_step [R] int32 or
    int64 (+ 1 wraps in its width, as numpy's) -> bool."""
    c = _POS.get(prev_step.dtype)
    if c is None or not _i64(step, seq_len, prev_seq_end):
        return True
    return bool(_SEQ_LEN[c](len(step), step, has_prev, prev_step, seq_len, prev_seq_end))


def committed_tokens_bad(path_ok, finished, commit_n, path_len, mis_at):
    """SA307: any path_ok row with mis_at >= 0, or unfinished with commit_n < path_len
    (and mis_at < 0, the other case). path_ok, finished [R] bool; commit_n, path_len,
    mis_at [R] int64 -> bool."""
    if not _i64(commit_n, path_len, mis_at):
        return True
    return bool(_ROW["committed_tokens_bad"](len(commit_n), path_ok, finished, commit_n, path_len, mis_at))
