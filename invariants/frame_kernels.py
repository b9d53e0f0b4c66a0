"""StepFrame's core as compiled kernels: frame_kernels.c, built and loaded by
invariants/compiled.py (importing this module builds it on first use); one pass per
stage instead of a dozen numpy passes. Imported only through compiled.kernels; the
numpy code of invariants/frame.py and invariants/frame_link.py is the definition, and
tests/test_compiled_frame.py holds every array here equal to it.

Shapes: R sorted rows (row r of the frame is batch row order[r]; inv [R] the sorted row
of each batch row); T flat nodes (node i of sorted row r is flat start[r] + i, aligned
on node_tokens); P path and C commit entries, flat in batch order, path_start /
commit_start per sorted row; G request groups (runs of sorted rows of one request,
starting at gstart [G]), cr [G] their carry rows.

  path_commit: path_struct_bad, last_node, bonus (greedy: the target's argmax at the
      path's last node), commit_mismatch_at, commit_eos_at, commit_last (StepFrame's
      cached properties of those names; the flat per-entry ones, path_k, path_glob,
      expected_commit and commit_k, stay numpy's, built on first use);
  link_rows: has_prev, prev_step, prev_seq_end, prev_last, prev_finished, out_before,
      contiguous (StepFrame._link_previous);
  fold_carry: the batch folded into the carry (StepFrame.finish_carry).

The list values (tokens, argmax, parents, path, commit) go to C as int32 when they all
are (the contract's type), else all widened to int64: a C function per width.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .compiled import bind, library

_LIB = library(Path(__file__).with_name("frame_kernels.c"))
_V = {"32": "w", "64": "l"}
_PATH_COMMIT = {w: bind(_LIB, f"path_commit_v{w}",
                        f"i l l l i {v} {v} {v} {v} l l {v} l l i ob ol ol ol ol ol")
                for w, v in _V.items()}
_LINK = bind(_LIB, "link_rows", "i i l l l l l l b b w l w b l b ob ow ol ow ob ol ob")
_CARRY = "ow ow ob ob ow ol ol ol ol oq ol ob ob ob ow ol ow"
_FOLD = {w: bind(_LIB, f"fold_carry_v{w}", f"i i l l l {v} l l b l l l l {v} l l b b l l {_CARRY}")
         for w, v in _V.items()}


def _width(*values) -> str:
    """'32' when every list-value array is int32, else '64' (the C function to call)."""
    return "32" if all(v.dtype == np.int32 for v in values) else "64"


def path_commit(inv, start, n, T, tokens, argmax, parent_in_row, path, path_start, path_len,
                commit, commit_start, commit_n, eos_id, psb, last_node, bonus, mis_at, eos_at, c_last):
    """inv, start, n, path_start, path_len, commit_start, commit_n [R]; tokens, argmax,
    parent_in_row [T]; path [P]; commit [C]. Writes psb (bool), last_node, bonus, mis_at,
    eos_at, c_last [R] (int64 but bonus, which is written in its own dtype)."""
    R = len(start)
    b64 = bonus if bonus.dtype == np.int64 else np.empty(R, dtype=np.int64)
    _PATH_COMMIT[_width(tokens, argmax, parent_in_row, path, commit)](
        R, inv, start, n, T, tokens, argmax, parent_in_row, path, path_start, path_len, commit, commit_start,
        commit_n, eos_id, psb, last_node, b64, mis_at, eos_at, c_last)
    if b64 is not bonus:
        bonus[:] = b64


def link_rows(gstart, cr, step, seq_len, commit_n, commit_last, finished,
              c_seen, c_last_step, c_seq_end, c_last_tok, c_finished, c_out_len, c_contiguous,
              has_prev, prev_step, prev_seq_end, prev_last, prev_finished, out_before, contiguous):
    """gstart, cr [G]; step, seq_len, commit_n, commit_last, finished [R] sorted; c_*:
    the carry's arrays (rows cr). Writes the link arrays [R]: a row's previous step is
    the sorted row before it, or the carried one at its group's first row."""
    _LINK(len(step), len(gstart), gstart, cr, step, seq_len, commit_n, commit_last, finished,
          c_seen, c_last_step, c_seq_end, c_last_tok, c_finished, c_out_len, c_contiguous,
          has_prev, prev_step, prev_seq_end, prev_last, prev_finished, out_before, contiguous)


def fold_carry(gstart, cr, seq_len, tokens, start, n, ok, commit_len, commit_n, accepted_depth, path_len,
               commit, commit_start, out_before, contiguous, finished, step, commit_last, *carry):
    """gstart, cr [G]; per sorted row [R]: seq_len ... commit_last; tokens [T]; commit [C];
    carry: the carry's arrays in frame_link._FOLDED's order, written in place (rows cr)."""
    _FOLD[_width(tokens, commit)](len(seq_len), len(gstart), gstart, cr, seq_len, tokens, start, n, ok, commit_len,
                                  commit_n, accepted_depth, path_len, commit, commit_start, out_before, contiguous,
                                  finished, step, commit_last, *carry)
