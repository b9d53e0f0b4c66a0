"""RequestFrame: what request rules see, requests of a run joined with their steps' carry
(every request, or a range of slots of a run with many: specaudit/audit/check/core.py)."""
from __future__ import annotations

from functools import cached_property

import numpy as np

from .carry import Carry

I64 = np.int64


class RequestFrame:
    """Requests of a run (its carry slots [lo, hi)): the requests table joined with the steps' carry.

    Arrays [Q] over the carry's request indices (`request_id`): has_row (a requests
    row exists), prompt_len, first_token, output_len, output_hash (fingerprint of
    output_tokens[1:] at positions 1..), output_last, eos_inside (EOS before the
    last output token), finish_reason, reference_equal (-1 no reference, 0 differs,
    1 equal), reference_first_diff; from the steps: has_steps, n_steps, first_step
    facts (first_seq_len, first_root, first_ok: not refused by SA1xx), commits_hash, commits_len (= 1 + sum of
    len(committed_tokens)), sum_commit_len, last_finished, contiguous; plus `extra`
    (optional client-side columns of the requests table, by name), run_id,
    eos_id, max_new_tokens, complete (the run ended normally).
    """

    def __init__(self, carry: Carry, table_facts: dict | None, *, run_id: str, eos_id: int,
                 max_new_tokens: int | None, complete: bool, manifest: dict, lo: int = 0, hi: int | None = None):
        """Over the carry's slots [lo, hi) (all of them by default; a large run is
        joined a range at a time): table_facts holds the requests rows of those slots
        only, their carry index in `idx`."""
        hi = carry.n if hi is None else hi
        Q = hi - lo
        self.run_id, self.eos_id, self.max_new_tokens = run_id, eos_id, max_new_tokens
        self.complete, self.manifest = complete, manifest
        self.R = Q
        self._names, self._lo = carry.names, lo
        c = carry.fields(lo, hi)
        self.has_steps = c["seen"]
        self.n_steps = c["n_steps"]
        self.first_seq_len = c["first_seq_len"]
        self.first_root = c["first_root"]
        self.first_ok = c["first_ok"]      # the first step was not refused (SA1xx)
        self.commits_hash = c["hash"]
        self.commits_len = c["out_len"]
        self.sum_commit_len = c["sum_commit_len"]
        self.sum_commit_n = c["sum_commit_n"]
        self.sum_depth = c["sum_depth"]
        self.sum_true_depth = c["sum_true_depth"]
        self.last_finished = c["last_finished"]
        self.contiguous = c["contiguous"]
        t = table_facts or {}
        idx = t["idx"] - lo if "idx" in t else None
        def arr(k, fill, dt):
            a = np.full(Q, fill, dtype=dt)
            if k in t:
                a[idx] = t[k]   # a duplicated request keeps its last row
            return a
        self.has_row = np.zeros(Q, dtype=bool)
        self.row_count = np.zeros(Q, dtype=I64)   # rows in the requests table
        if idx is not None:
            self.has_row[idx] = True
            np.add.at(self.row_count, idx, 1)
        self.prompt_len = arr("prompt_len", -1, np.int32)
        self.first_token = arr("first_token", -1, np.int32)
        self.output_len = arr("output_len", -1, np.int32)
        self.output_hash = arr("output_hash", 0, np.uint64)
        self.output_last = arr("output_last", -1, np.int32)
        self.output_first = arr("output_first", -1, np.int32)
        self.eos_inside = arr("eos_inside", -1, np.int32)
        self.reference_equal = arr("reference_equal", -1, np.int32)
        self.reference_first_diff = arr("reference_first_diff", -1, np.int32)
        self.reference_len = arr("reference_len", -1, np.int32)
        self.finish_reason = arr("finish_reason", None, object)
        self.extra = {k[6:]: arr(k, np.nan, float) for k in t if k.startswith("extra:")}
        self.null_slot = np.zeros(Q, dtype=bool)      # the slot of rows without a request id
        null = carry.names.slot_of("\0null") - lo
        if 0 <= null < Q:
            self.null_slot[null] = True

    @cached_property
    def request_id(self) -> np.ndarray:
        """The request id of each slot (object [Q]): built when a finding names one."""
        return np.asarray(self._names[self._lo: self._lo + self.R], dtype=object)
