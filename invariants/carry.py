"""Carry: the per-request state carried across the step batches of one run.

For each request seen so far, in arrays indexed by its slot (request ids -> slots:
invariants/request_ids.py): the last step (its index, seq_len + commit, last token,
finished), the output length, the sums the run rules average per request, the first
step's facts, and an order-sensitive fingerprint of its commits (`token_mix`, summed
mod 2^64). StepFrame reads it for continuity and folds each batch back into it
(StepFrame.finish_carry); RequestFrame joins it with the requests table.

Up to SPILL_SLOTS requests the arrays are dense, indexed by slot. Past that the carry
is paged: slots in pages of PAGE_SLOTS, at most SPILL_SLOTS // PAGE_SLOTS pages in
memory (least recently used out first, to a file of the run's SpillDir, or dropped when
no slot of the page has a step yet), the others read back when a step of theirs comes
(rows() maps slots to rows of the pages in memory). Requests arrive and finish roughly
in slot order, so the pages in memory are the in-flight requests' and the carry's
memory stays flat in the number of requests; a step of an old request (SA401, or a
request id used twice) reads its page back: the same state, the same findings.
"""
from __future__ import annotations

import numpy as np

from .carry_pages import _Pages
from .request_ids import RequestIds
from .spill import SpillDir

I64 = np.int64
_MIX1 = np.uint64(0x9E3779B97F4A7C15)
_MIX2 = np.uint64(0xC2B2AE3D27D4EB4F)
_MIX3 = np.uint64(0xBF58476D1CE4E5B9)

PAGE_SLOTS = 65536   # slots per page: ~4 MB of carry, one file write or read per page
# requests kept in dense arrays, and in memory once paged (~60 B each: ~8 MB). Below it a
# run pays nothing for paging; 131072 requests of state are small beside one step batch's
# working memory (~200 MB), so spilling sooner would buy no peak RSS
SPILL_SLOTS = 2 * PAGE_SLOTS


_MIX_CHUNK = 16384   # elements per pass: a chunk's five passes stay in cache (~2-3x on millions)


def token_mix(tokens: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """uint64 contribution of token t at output position p; summed (mod 2^64) over a
    request's tokens it is an order-sensitive fingerprint of the whole sequence."""
    n = len(tokens)
    if n > 2 * _MIX_CHUNK:
        out = np.empty(n, dtype=np.uint64)
        for i in range(0, n, _MIX_CHUNK):
            out[i: i + _MIX_CHUNK] = _token_mix(tokens[i: i + _MIX_CHUNK], pos[i: i + _MIX_CHUNK])
        return out
    return _token_mix(tokens, pos)


def _token_mix(tokens: np.ndarray, pos: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (tokens.astype(np.uint64) + np.uint64(1)) * _MIX1
        x ^= pos.astype(np.uint64) * _MIX2
        x ^= x >> np.uint64(31)
        x *= _MIX3
        x ^= x >> np.uint64(29)
    return x


class Carry:
    """Per-request state carried across batches of one run (arrays indexed by request,
    or by rows(slots) once paged: see the module docstring)."""

    # int32 where the trace column is int32; sums int64. About 60 bytes per request.
    FIELDS = {
        "last_step": (np.int32, -1), "seq_end": (I64, -1), "last_tok": (np.int32, -1),
        "finished": (bool, False), "out_len": (I64, 1), "n_steps": (np.int32, 0),
        "sum_commit_len": (I64, 0), "sum_commit_n": (I64, 0), "sum_depth": (I64, 0),
        "sum_true_depth": (I64, 0), "first_seq_len": (np.int32, -1), "first_root": (np.int32, -1),
        "hash": (np.uint64, 0), "contiguous": (bool, True), "last_finished": (bool, False),
        "seen": (bool, False), "first_ok": (bool, True),
    }

    def __init__(self):
        self.names = RequestIds()   # request id <-> slot (sliceable: names[:n] is a list of str)
        self.n = 0
        self.spill = SpillDir()     # the run's temporary folder (made only if it spills)
        self.paged = False
        self._alloc(1024)

    def index(self, names: list[str], encoded=None) -> np.ndarray:
        """Request ids -> dense indices (new ids get new slots, in order of first appearance);
        `encoded`: their UTF-8 bytes and offsets when known (RequestIds.index)."""
        got = self.names.index(names, encoded)
        n = len(self.names)
        if self.paged:
            self._pages.grow(n)
            self.n = n
        elif n > SPILL_SLOTS:
            self._pages = _Pages(self, PAGE_SLOTS, max(SPILL_SLOTS // PAGE_SLOTS, 1))
            self.paged = True
            self._pages.grow(n)
            self.n = n
        else:
            self._grow(n)
        return got

    def rows(self, slots: np.ndarray) -> np.ndarray:
        """The array rows of `slots` (the slots themselves until paged); valid until trim()."""
        return self._pages.rows(slots) if self.paged else slots

    def trim(self) -> None:
        """Spill the least recently used pages past the limit (after a batch is folded in)."""
        if self.paged:
            self._pages.trim()

    def fields(self, lo: int, hi: int) -> dict:
        """Every field over slots [lo, hi) (views until paged, copies after)."""
        if not self.paged:
            return {k: getattr(self, k)[lo:hi] for k in self.FIELDS}
        return self._pages.fields(lo, hi)

    def view(self, k: str) -> np.ndarray:
        return self.fields(0, self.n)[k] if self.paged else getattr(self, k)[: self.n]

    def close(self) -> None:
        """Remove the spilled pages (the carry is not used after)."""
        self.spill.close()

    def _alloc(self, cap: int) -> None:
        for k, (dt, v) in self.FIELDS.items():
            setattr(self, k, np.full(cap, v, dtype=dt))

    def _grow(self, n: int) -> None:
        cap = len(self.last_step)
        if n > cap:
            # doubling (a run's requests arrive in batches: a few copies, not dozens), up to
            # SPILL_SLOTS (past it the carry is paged); each slot written once: old or default
            new = max(n, min(2 * cap, SPILL_SLOTS))
            for k, (dt, v) in self.FIELDS.items():
                a = getattr(self, k)
                b = np.empty(new, dtype=dt)
                b[:cap] = a
                b[cap:] = v
                setattr(self, k, b)
        self.n = n
