"""FrameLink: a StepFrame's link to each request's previous step and the carry folded
back in (a mixin of invariants/frame.py), in numpy, or through the compiled kernels of
invariants/frame_kernels.py for a big batch (invariants/compiled.py decides: `_kern`).

numpy is the definition; a kernel computes the same arrays (tests/test_compiled_frame.py):
  _path_commit_pass: path_struct_bad, last_node, bonus, commit_mismatch_at,
      commit_eos_at, commit_last in one pass (else, like the flat path_k, path_glob,
      expected_commit and commit_k always, StepFrame's cached properties compute them
      when a rule asks); not for a batch with sampling columns (its bonus is the
      sampled token there);
  _link_previous: has_prev, prev_step, prev_seq_end, prev_last, prev_finished,
      out_before, contiguous;
  finish_carry: the batch folded into the carry.
Reads from the frame: R, T, n, start, step, req, seq_len, commit_len, accepted_depth,
finished, ok, tokens, argmax, parent_in_row, path*, commit*, inv, eos_id, columns.
"""
from __future__ import annotations

import numpy as np

from .carry import Carry, token_mix

I64 = np.int64
KERNELS = "specaudit.invariants.frame_kernels"
# sampling columns (contract v2): the bonus is the drawn token on sampled rows (frame.bonus)
_SAMPLING = ("accept_u", "sampled_token")


class FrameLink:
    _kern = None   # the compiled kernels (set by StepFrame.__init__ for a big batch), or None

    def _path_commit_pass(self) -> None:
        """The path and commit arrays in one compiled pass, cached as the properties
        of the same names; nothing without kernels (the properties compute them)."""
        k = self._kern
        if k is None or any(c in self.columns for c in _SAMPLING):
            return
        R = self.R
        d = self.__dict__
        bonus_dtype = self.argmax.dtype if self.T else I64
        for name, dt in (("path_struct_bad", bool), ("last_node", I64), ("bonus", bonus_dtype),
                         ("commit_mismatch_at", I64), ("commit_eos_at", I64), ("commit_last", I64)):
            d[name] = np.empty(R, dtype=dt)
        k.path_commit(self.inv, self.start, self.n, self.T, self.tokens, self.argmax, self.parent_in_row, self.path,
                      self.path_start, self.path_len, self.commit, self.commit_start, self.commit_n, self.eos_id,
                      d["path_struct_bad"], d["last_node"], d["bonus"], d["commit_mismatch_at"], d["commit_eos_at"],
                      d["commit_last"])

    def _link_previous(self, carry: Carry) -> None:
        """Continuity from each request's previous step (carried from earlier batches,
        or the previous sorted row): has_prev, prev_step, prev_seq_end, prev_last,
        prev_finished, out_before, contiguous; and the groups (one per request) that
        finish_carry folds back into the carry."""
        R = self.R
        first = np.ones(R, dtype=bool)
        first[1:] = self.req[1:] != self.req[:-1]
        self.group_first = first
        gstart = np.flatnonzero(first)
        sizes = np.diff(gstart, append=R)                # rows per group
        cr = carry.rows(self.req[gstart])                # carry row of each group (its slot until paged)
        self._carry = carry
        self._gstart, self._cr = gstart, cr
        if self._kern is not None:
            self._link_compiled(carry, gstart, cr)
            return
        # a row's previous step is the sorted row before it, but at a group's first row,
        # where it is the carried one: a shift, then one write per group
        self.has_prev = np.ones(R, dtype=bool)
        self.has_prev[gstart] = carry.seen[cr]
        self.prev_step = _shifted(self.step, carry.last_step.dtype)
        self.prev_step[gstart] = carry.last_step[cr]
        self.prev_seq_end = _shifted(self.seq_len + self.commit_n, carry.seq_end.dtype)
        self.prev_seq_end[gstart] = carry.seq_end[cr]
        self.prev_last = _shifted(self.commit_last, carry.last_tok.dtype)
        self.prev_last[gstart] = carry.last_tok[cr]
        # any earlier step of the request finished (carried, or earlier in this batch)
        fcum = np.cumsum(self.finished) - self.finished   # exclusive, over sorted rows
        self.prev_finished = (fcum - np.repeat(fcum[gstart] - carry.finished[cr], sizes)) > 0
        # output tokens before this step: carried length + earlier commits in this batch
        csum = np.cumsum(self.commit_n) - self.commit_n  # exclusive, over the sorted rows
        self.out_before = csum + np.repeat(carry.out_len[cr] - csum[gstart], sizes)
        # rows whose request's steps so far run 0, 1, 2, ... without a gap: out_before
        # and the token limit are exact there
        bad = self.step != np.where(self.has_prev, self.prev_step + 1, 0)
        bad_cum = np.cumsum(bad)
        # a group whose carry is not contiguous starts R + 1 behind: never 0 again
        before = bad_cum[gstart] - bad[gstart] + (~carry.contiguous[cr]) * (R + 1)
        self.contiguous = bad_cum - np.repeat(before, sizes) == 0

    def _link_compiled(self, carry: Carry, gstart: np.ndarray, cr: np.ndarray) -> None:
        """_link_previous's arrays from the link_rows kernel, numpy's dtypes."""
        R = self.R
        self.has_prev = np.empty(R, dtype=bool)
        self.prev_step = np.empty(R, dtype=carry.last_step.dtype)
        self.prev_seq_end = np.empty(R, dtype=carry.seq_end.dtype)
        self.prev_last = np.empty(R, dtype=carry.last_tok.dtype)
        self.prev_finished = np.empty(R, dtype=bool)
        self.out_before = np.empty(R, dtype=np.result_type(self.commit_n, carry.out_len))
        self.contiguous = np.empty(R, dtype=bool)
        self._kern.link_rows(gstart, cr, self.step, self.seq_len, self.commit_n, self.commit_last, self.finished,
                             carry.seen, carry.last_step, carry.seq_end, carry.last_tok, carry.finished,
                             carry.out_len, carry.contiguous, self.has_prev, self.prev_step, self.prev_seq_end,
                             self.prev_last, self.prev_finished, self.out_before, self.contiguous)

    def finish_carry(self) -> None:
        """Fold this batch into the carry (call once, after the rules ran)."""
        c, cr, gstart = self._carry, self._cr, self._gstart
        if self.R == 0:
            return
        if self._kern is not None:
            self._kern.fold_carry(
                gstart, cr, self.seq_len, self.tokens, self.start, self.n, self.ok, self.commit_len, self.commit_n,
                self.accepted_depth, self.path_len, self.commit, self.commit_start, self.out_before,
                self.contiguous, self.finished, self.step, self.commit_last,
                *(getattr(c, f) for f in _FOLDED))
            c.trim()
            return
        last = np.concatenate((gstart[1:], [self.R])) - 1
        # per-group integer sums: groups are runs of sorted rows starting at gstart
        sums = lambda v: np.add.reduceat(v, gstart, dtype=I64)
        new = ~c.seen[cr]
        fr = gstart[new]
        c.first_seq_len[cr[new]] = self.seq_len[fr]
        c.first_root[cr[new]] = self.at_root(self.tokens)[fr]
        c.first_ok[cr[new]] = self.ok[fr]   # a refused first step is no evidence (SA405)
        c.seen[cr] = True
        c.n_steps[cr] += np.diff(gstart, append=self.R)
        c.sum_commit_len[cr] += sums(self.commit_len)
        commit_n = sums(self.commit_n)
        c.sum_commit_n[cr] += commit_n
        c.sum_depth[cr] += sums(self.accepted_depth)
        c.sum_true_depth[cr] += sums(self.true_depth)
        # order-sensitive fingerprint of the commits at their output positions
        if len(self.commit):
            pos = self.out_before[self.commit_row] + self.commit_k
            contrib = token_mix(self.commit, pos)
            # commit entries of one row are contiguous in batch order
            row_h = np.zeros(self.R, dtype=np.uint64)
            nz = self.commit_n > 0
            # the sorted rows with commits, in batch order (their flat starts increase
            # strictly along the batch): no sort needed
            rows_nz = self.inv if nz.all() else self.inv[np.flatnonzero(nz[self.inv])]
            red = np.add.reduceat(contrib, self.commit_start[rows_nz])
            row_h[rows_nz] = red
            grp_h = np.add.reduceat(row_h, gstart)
            with np.errstate(over="ignore"):
                c.hash[cr] += grp_h
        c.out_len[cr] += commit_n
        c.contiguous[cr] = self.contiguous[last]
        c.finished[cr] |= np.logical_or.reduceat(self.finished, gstart)
        c.last_finished[cr] = self.finished[last]
        c.last_step[cr] = self.step[last]
        c.seq_end[cr] = self.seq_len[last] + self.commit_n[last]
        c.last_tok[cr] = self.commit_last[last]
        c.trim()                                           # a paged carry: old pages out


# the carry's fields in fold_carry's order (all of Carry.FIELDS)
_FOLDED = ("first_seq_len", "first_root", "first_ok", "seen", "n_steps", "sum_commit_len", "sum_commit_n",
           "sum_depth", "sum_true_depth", "hash", "out_len", "contiguous", "finished", "last_finished",
           "last_step", "seq_end", "last_tok")
assert set(_FOLDED) == set(Carry.FIELDS)


def _shifted(a: np.ndarray, dtype) -> np.ndarray:
    """a[r - 1] at row r (row 0 left unset: every group's first row is written after)."""
    out = np.empty(len(a), dtype=dtype)
    out[1:] = a[:-1]
    return out
