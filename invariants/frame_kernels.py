"""StepFrame's core as compiled kernels (numba): one pass per stage instead of a dozen
numpy passes. Imported only through invariants/compiled.py (`kernels(...)`); the numpy
code of invariants/frame.py and invariants/frame_link.py is the definition, and
tests/test_compiled_frame.py holds every array here equal to it.

Shapes: R sorted rows (row r of the frame is batch row order[r]); T flat nodes (node i
of sorted row r is flat start[r] + i, aligned on node_tokens); P path entries and C
commit entries, flat in batch order, path_start / commit_start per sorted row; G
request groups (runs of sorted rows of one request, starting at gstart [G]), cr [G]
their carry rows.

  path_commit: path_k, path_glob, path_struct_bad, last_node, bonus (greedy: the target's argmax at the
      path's last node), expected_commit, commit_k, commit_mismatch_at, commit_eos_at,
      commit_last (StepFrame's cached properties of those names);
  link_rows: has_prev, prev_step, prev_seq_end, prev_last, prev_finished, out_before,
      contiguous (StepFrame._link_previous);
  fold_carry: the batch folded into the carry (StepFrame.finish_carry).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .carry import _MIX1, _MIX2, _MIX3


@njit(cache=True, nogil=True)
def path_commit(inv, start, n, T, tokens, argmax, parent_in_row, path, path_start, path_len,
                commit, commit_start, commit_n, eos_id,
                psb, last_node, bonus, expected, commit_k, mis_at, eos_at, c_last, path_k, path_glob):
    """inv [R]: the sorted row of each batch row (rows are visited in batch order, the
    flat arrays' own: sequential reads, ~25% less time on a tree batch); start, n,
    path_start, path_len, commit_start, commit_n [R]; tokens, argmax, parent_in_row [T];
    path [P]; commit [C]. Writes psb (bool), last_node, bonus, mis_at, eos_at, c_last
    [R]; expected, path_k, path_glob [P]; commit_k [C]."""
    R = len(start)
    for b in range(R):
        r = inv[b]
        s, nr, ps, pl = start[r], n[r], path_start[r], path_len[r]
        # the path: starts at node 0, stays inside the row's tree, each entry a child
        # of the one before (by the safe parents); an empty path is bad too
        bad = pl < 1
        for k in range(pl):
            node = path[ps + k]
            path_k[ps + k] = k
            path_glob[ps + k] = s + node if 0 <= node < nr else 0
            if node < 0 or node >= nr:
                bad = True
            elif k == 0:
                if node != 0:
                    bad = True
            elif parent_in_row[s + node] != path[ps + k - 1]:
                bad = True
        psb[r] = bad
        # the path's last node, global (flat 0 for an entry out of range; the row's
        # start when the path is empty), at most T - 1
        ln = s
        if pl > 0:
            node = path[ps + pl - 1]
            ln = s + node if 0 <= node < nr else 0
        ln = min(ln, max(T - 1, 0))
        last_node[r] = ln
        bn = argmax[ln] if T > 0 else -1
        bonus[r] = bn
        # expected commit: the token of each next path entry, the bonus last
        for k in range(pl - 1):
            node = path[ps + k + 1]
            if T > 0:
                expected[ps + k] = tokens[s + node if 0 <= node < nr else 0]
            else:
                expected[ps + k] = -1
        if pl > 0:
            expected[ps + pl - 1] = bonus[r]
        # the commit against it, its first EOS and its last token
        cs, cn = commit_start[r], commit_n[r]
        mis, eat, cl = -1, -1, -1
        for k in range(cn):
            t = commit[cs + k]
            commit_k[cs + k] = k
            if mis < 0 and (k >= pl or t != expected[ps + k]):
                mis = k
            if eat < 0 and t == eos_id:
                eat = k
            cl = t
        mis_at[r], eos_at[r], c_last[r] = mis, eat, cl


@njit(cache=True, nogil=True)
def link_rows(gstart, cr, step, seq_len, commit_n, commit_last, finished,
              c_seen, c_last_step, c_seq_end, c_last_tok, c_finished, c_out_len, c_contiguous,
              has_prev, prev_step, prev_seq_end, prev_last, prev_finished, out_before, contiguous):
    """gstart, cr [G]; step, seq_len, commit_n, commit_last, finished [R] sorted; c_*:
    the carry's arrays (rows cr). Writes the link arrays [R]: a row's previous step is
    the sorted row before it, or the carried one at its group's first row."""
    R = len(step)
    G = len(gstart)
    for g in range(G):
        r0 = gstart[g]
        r1 = gstart[g + 1] if g + 1 < G else R
        c = cr[g]
        fin = c_finished[c]
        out = c_out_len[c]
        run_ok = c_contiguous[c]
        for r in range(r0, r1):
            if r == r0:
                has_prev[r] = c_seen[c]
                prev_step[r] = c_last_step[c]
                prev_seq_end[r] = c_seq_end[c]
                prev_last[r] = c_last_tok[c]
            else:
                has_prev[r] = True
                prev_step[r] = step[r - 1]
                prev_seq_end[r] = seq_len[r - 1] + commit_n[r - 1]
                prev_last[r] = commit_last[r - 1]
            prev_finished[r] = fin
            fin = fin or finished[r]
            out_before[r] = out
            out += commit_n[r]
            # prev_step + 1 in prev_step's int32 (the carry's last_step), as numpy adds
            want = np.int64(np.int32(prev_step[r] + 1)) if has_prev[r] else np.int64(0)
            run_ok = run_ok and step[r] == want
            contiguous[r] = run_ok


@njit(cache=True, nogil=True, inline="always")
def _mix(t, p):
    """carry.token_mix of one token t at output position p (uint64, wrapping)."""
    x = (np.uint64(np.int64(t)) + np.uint64(1)) * _MIX1
    x ^= np.uint64(p) * _MIX2
    x ^= x >> np.uint64(31)
    x *= _MIX3
    x ^= x >> np.uint64(29)
    return x


@njit(cache=True, nogil=True)
def fold_carry(gstart, cr, seq_len, tokens, start, n, ok, commit_len, commit_n, accepted_depth, path_len,
               commit, commit_start, out_before, contiguous, finished, step, commit_last,
               c_first_seq_len, c_first_root, c_first_ok, c_seen, c_n_steps, c_sum_commit_len,
               c_sum_commit_n, c_sum_depth, c_sum_true_depth, c_hash, c_out_len, c_contiguous,
               c_finished, c_last_finished, c_last_step, c_seq_end, c_last_tok):
    """gstart, cr [G]; per sorted row [R]: seq_len ... commit_last; tokens [T]; commit [C].
    Folds each group into its carry row (the c_* arrays, indexed by cr)."""
    R = len(seq_len)
    G = len(gstart)
    for g in range(G):
        r0 = gstart[g]
        r1 = gstart[g + 1] if g + 1 < G else R
        last = r1 - 1
        c = cr[g]
        if not c_seen[c]:
            c_first_seq_len[c] = seq_len[r0]
            c_first_root[c] = tokens[start[r0]] if n[r0] > 0 else -1
            c_first_ok[c] = ok[r0]
        c_seen[c] = True
        c_n_steps[c] += r1 - r0
        scl = np.int64(0)
        scn = np.int64(0)
        sd = np.int64(0)
        std = np.int64(0)
        h = np.uint64(0)
        fin = False
        for r in range(r0, r1):
            scl += commit_len[r]
            scn += commit_n[r]
            sd += accepted_depth[r]
            std += path_len[r] - 1
            fin = fin or finished[r]
            # the order-sensitive fingerprint of the commits at their output positions
            cs = commit_start[r]
            for k in range(commit_n[r]):
                h += _mix(commit[cs + k], out_before[r] + k)
        c_sum_commit_len[c] += scl
        c_sum_commit_n[c] += scn
        c_sum_depth[c] += sd
        c_sum_true_depth[c] += std
        c_hash[c] += h
        c_out_len[c] += scn
        c_contiguous[c] = contiguous[last]
        c_finished[c] = c_finished[c] or fin
        c_last_finished[c] = finished[last]
        c_last_step[c] = step[last]
        c_seq_end[c] = seq_len[last] + commit_n[last]
        c_last_tok[c] = commit_last[last]
