"""What rules see: StepFrame (a batch of step rows), RequestFrame, RunFrame.

Everything is re-derived here, vectorised over Arrow buffers with numpy: no Python
loop per step (loops over node index up to N, over distinct tree shapes, and over
the request ids of a batch are fine). Rows are sorted by (request, step) inside a
batch; per-node arrays are flat over the batch with `start` offsets.

Continuity across batches uses a per-request carry (`Carry`): the last step of
each request seen so far (its step index, seq_len + commit, last token, finished,
output length and an order-sensitive hash of its commits). A request's steps must
come in step order across files and row groups, as every writer appending steps
in verify order does; a step that comes late is reported by SA401.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np
import pyarrow as pa

from specaudit.trace.schema import (
    MAX_NODES,
    NODE_LIST_COLUMNS,
    NULLABLE_NODE_LIST_COLUMNS,
    ancestor_mask,
    mask_hash,
    tree_depths_flat,
)

# the Arrow decoding (invariants/arrow.py) is re-exported: the checker imports it from here
from .arrow import (  # noqa: F401  (re-exported)
    _lengths,
    _scalar,
    _strings,
    list_lengths,
    list_parts,
    list_values,
    to_np,
    valid_mask,
)
from .frame_sampling import SAMPLING_SUM_KEYS
from .request_ids import RequestIds

I64 = np.int64
_MIX1 = np.uint64(0x9E3779B97F4A7C15)
_MIX2 = np.uint64(0xC2B2AE3D27D4EB4F)
_MIX3 = np.uint64(0xBF58476D1CE4E5B9)


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


# ---------------------------------------------------------------------- carry


class Carry:
    """Per-request state carried across batches of one run (arrays indexed by request)."""

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
        cap = 1024
        for k, (dt, v) in self.FIELDS.items():
            setattr(self, k, np.full(cap, v, dtype=dt))

    def index(self, names: list[str]) -> np.ndarray:
        """Request ids -> dense indices (new ids get new slots, in order of first appearance)."""
        got = self.names.index(names)
        self._grow(len(self.names))
        return got

    def _grow(self, n: int) -> None:
        cap = len(self.last_step)
        if n > cap:
            new = max(n, cap + cap // 4)
            for k, (dt, v) in self.FIELDS.items():
                a = getattr(self, k)
                b = np.full(new, v, dtype=dt)
                b[:cap] = a
                setattr(self, k, b)
        self.n = n

    def view(self, k: str) -> np.ndarray:
        return getattr(self, k)[: self.n]


# -------------------------------------------------------------------- StepFrame


class StepFrame:
    """One record batch of one run's steps, re-derived. See the package docstring.

    Built in stages, each a method below: the rows' order (request, step) and the
    carry indices, the scalar columns, the per-node lists (flat, aligned on
    node_tokens), the tree structure a row must have for the deeper rules to trust
    it, the safe parents, the path and commit lists, and the continuity from each
    request's previous step. A uniform-N batch (every row N nodes: the usual one)
    works on [R, N] blocks and defers the flat per-node index arrays until a rule
    asks; a ragged batch builds them up front."""

    def __init__(self, batch, *, run_id: str, carry: Carry, eos_id: int = 0,
                 max_new_tokens: int | None = None, manifest: dict | None = None,
                 conventions: dict | None = None, file: str | None = None, row_offset: int = 0):
        self.run_id = run_id
        self.file = file
        self.eos_id = int(eos_id)
        self.max_new_tokens = max_new_tokens
        self.manifest = manifest or {}
        self.conventions = conventions or {}
        names = batch.schema.names
        col = {n: batch.column(i) for i, n in enumerate(names)}
        self.columns = col   # the batch's columns by name (optional ones: see `sampling`)
        self.R = batch.num_rows
        self.nulls: dict[str, np.ndarray] = {}  # column -> bool [R] (required values missing)
        self._sort_rows(col, carry, row_offset)
        self._read_scalars(col)
        raw = self._read_lists(col)
        self._check_structure()
        self._set_safe_parents()
        # accepted path and commit (flat in batch order; *_start per sorted row)
        self.path, self.path_start, self.path_len, self.path_row = self._own(raw["accepted_path"], self.inv, self.order)
        self.commit, self.commit_start, self.commit_n, self.commit_row = self._own(
            raw["committed_tokens"], self.inv, self.order)
        self.true_depth = self.path_len - 1
        self._link_previous(carry)

    # ------------------------------------------------------------ stages of __init__
    def _sort_rows(self, col: dict, carry: Carry, row_offset: int) -> None:
        """Request ids -> carry indices; the rows sorted by (request, step): `order`
        (row r of this frame is batch row order[r]) and its inverse `inv`."""
        R = self.R
        rcodes, rdict = _strings(col["request_id"])
        if not all(map(str.__instancecheck__, rdict)):   # (a string dictionary: all str already)
            rdict = [str(x) for x in rdict]
        gidx = carry.index(rdict + ["\0null"])  # code -1 -> the null slot
        req = gidx[rcodes]
        step, step_null = _scalar(col["step"])
        order = _request_step_order(rcodes, gidx, step)
        self.order = order
        self.row_in_file = order + row_offset
        self.req = req[order]
        self.step = step[order]
        self._rid_names = rdict + ["<null>"]
        self._rid_codes = rcodes[order]
        if step_null is not None:
            self.nulls["step"] = step_null[order]
        if rcodes.min(initial=0) < 0:
            self.nulls["request_id"] = (rcodes < 0)[order]
        inv = np.empty(R, dtype=I64)
        inv[order] = np.arange(R, dtype=I64)
        self.inv = inv

    def _read_scalars(self, col: dict) -> None:
        """run_id and algo as codes into small per-batch dictionaries; the integer,
        hash and flag columns in sorted order, their missing values in `nulls`."""
        order = self.order
        rc, rd = _strings(col["run_id"])
        self._run_names = np.asarray([str(x) for x in rd] + ["<null>"], dtype=object)
        self._run_codes = rc[order]
        self.run_id_ok = (self._run_names == self.run_id)[self._run_codes]
        ac, ad = _strings(col["algo"])
        self._algo_names = np.asarray([str(x) for x in ad] + ["<null>"], dtype=object)
        self._algo_codes = ac[order]
        self.is_chain = (self._algo_names == "chain")[self._algo_codes]
        self.algo_known = np.isin(self._algo_names, ["chain", "tree"])[self._algo_codes]
        for name, fill, dtype in (("budget", -1, I64), ("topk", -1, I64), ("batch_size", -1, I64),
                                  ("seq_len", -1, I64), ("accepted_depth", -1, I64), ("commit_len", -1, I64),
                                  ("mask_hash", 0, np.uint64), ("finished", False, bool)):
            v, nl = _scalar(col[name], fill=fill, dtype=dtype)
            setattr(self, name, v[order])
            if nl is not None:
                self.nulls[name] = nl[order]

    def _read_lists(self, col: dict) -> dict:
        """The list columns: lengths per sorted row (`lens`), the diagnostic lists'
        bad values, N per row (`n`, `n_raw`), flat starts, and the per-node lists flat
        in the batch's own order (no copy when every list has N entries).
        -> the raw (offsets, values, lengths) of each list column, by name."""
        R, order, inv = self.R, self.order, self.inv
        self.lens: dict[str, np.ndarray] = {}
        raw = {}
        for name in (*NODE_LIST_COLUMNS, *NULLABLE_NODE_LIST_COLUMNS, "accepted_path", "committed_tokens"):
            if name not in col:
                continue
            off, v, lens = list_parts(col[name])
            raw[name] = (off, v, lens)
            self.lens[name] = lens[order]
        # diagnostic values (SA109), when the column was decoded: column -> (bad [R], value [R])
        self.diag_bad = {c: _diag_bad(col[c], *DIAGNOSTIC_RANGES[c], R, inv)
                         for c in DIAGNOSTIC_RANGES if c in col}
        n0 = np.maximum(raw["node_tokens"][2], 0)          # N per batch row
        self.n_raw = self.lens["node_tokens"]
        self.n = n0[order]
        self.T = T = int(n0.sum())
        s0 = np.cumsum(n0) - n0                           # batch row -> flat start
        self.start = s0[order]                            # sorted row -> flat start
        N0 = int(n0[0]) if R else 0
        self.uniform_n = bool(R) and N0 > 0 and bool((n0 == N0).all())
        if self.uniform_n:                                # every row has N nodes: [R, N] blocks
            rows0 = None                                  # built by _aligned only if a list is ragged
            # node_i and node_row: built on first use (the cached properties below)
        else:
            rows0 = np.repeat(np.arange(R, dtype=I64), n0)    # batch row of each flat node
            self.node_row = inv[rows0]
            self.node_i = np.arange(T, dtype=I64) - np.repeat(s0, n0)
        self.tokens = self._aligned(raw["node_tokens"], n0, rows0, s0)
        self.parents = self._aligned(raw["parents"], n0, rows0, s0)
        self.positions = self._aligned(raw["positions"], n0, rows0, s0)
        self.argmax = self._aligned(raw["target_argmax"], n0, rows0, s0)
        return raw

    def _check_structure(self) -> None:
        """Rows the deeper rules may trust (`ok`): every per-node list N long, N in
        range, a path and a commit, the root's parent -1 and every other parent an
        earlier node, no required value missing."""
        n, R = self.n, self.R
        shapes_ok = n >= 1
        for k in ("parents", "positions", "target_argmax"):
            shapes_ok &= self.lens[k] == n
        for k in ("draft_logprob", "target_margin"):
            if k in self.lens:
                shapes_ok &= (self.lens[k] == n) | (self.lens[k] == -1)
        self.too_many_nodes = n > MAX_NODES
        shapes_ok &= ~self.too_many_nodes & (self.lens["accepted_path"] >= 1) & (self.lens["committed_tokens"] >= 0)
        self.shapes_ok = shapes_ok
        p = self.parents
        if self.uniform_n:                                # [R, N0] blocks: node i at column i
            N0 = self.T // R
            P = p.reshape(R, N0)
            Pc, ii = P[:, 1:], np.arange(1, N0, dtype=I64)
            self.root_parent_bad = (P[:, 0] != -1)[self.order] | (n < 1)
            self._chain_rows = (Pc == ii - 1).all(axis=1)  # per batch row: parents are i - 1
            self._all_chains = bool(self._chain_rows.all())
            if self._all_chains:                          # parents i - 1: all in order
                self.parent_order_bad = np.zeros(R, dtype=bool)
            else:
                bad = (Pc < 0) | (Pc >= ii)
                self.parent_order_bad = bad.any(axis=1)[self.order] if bad.any() else np.zeros(R, dtype=bool)
        else:
            is_root = self.node_i == 0
            self.root_parent_bad = self.row_any(is_root & (p != -1)) | (n < 1)
            self.parent_order_bad = self.row_any(~is_root & ((p < 0) | (p >= self.node_i)))
            self._all_chains = not self.row_any(~is_root & (p != self.node_i - 1)).any()
        tree_ok = shapes_ok & ~self.root_parent_bad & ~self.parent_order_bad
        null_any = np.zeros(R, dtype=bool)
        for v_ in self.nulls.values():
            null_any |= v_
        self.null_any = null_any
        self.ok = tree_ok & ~null_any

    def _set_safe_parents(self) -> None:
        """psafe: the parents where a row is ok, a chain where it is not (derivations
        stay in range); pglob: the parent as a flat index (-1 at roots), built here
        or on first use (a uniform-N tree batch, see the `pglob` property)."""
        p, T = self.parents, self.T
        if self.ok.all() and self._all_chains:            # all chains: parent = previous node
            self.psafe = p
            self.pglob = np.arange(-1, T - 1, dtype=I64)
            if self.uniform_n:
                self.pglob[:: T // self.R] = -1
            else:
                self.pglob[self.node_i == 0] = -1
            self.__dict__["chain_shaped"] = np.ones(self.R, dtype=bool)
        elif self.uniform_n:                              # the same on [R, N0] blocks, no gathers
            N0 = T // self.R
            ok_b = self.ok[self.inv]                      # per batch row
            ps = p.reshape(self.R, N0).astype(I64)        # an ok row's root parent is -1
            ps[~ok_b] = np.arange(-1, N0 - 1, dtype=I64)
            self.psafe = ps.reshape(-1)
            self.__dict__["chain_shaped"] = self._chain_rows[self.order]
        else:
            is_root = self.node_i == 0
            okn = self.ok[self.node_row]
            self.psafe = np.where(okn & ~is_root, p, self.node_i - 1)
            self.pglob = np.where(self.psafe >= 0, self.start[self.node_row] + self.psafe, -1)

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
        cr = self.req[gstart]                            # carry index of each group
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
        self._carry = carry
        self._gstart, self._cr = gstart, cr

    @cached_property
    def pglob(self) -> np.ndarray:
        """A uniform-N tree batch's parent as a flat index (other batches set it in
        __init__): every safe parent is >= 0 but the roots' (column 0)."""
        R = self.R
        N0 = self.T // R
        g = self.psafe.reshape(R, N0) + np.arange(0, self.T, N0, dtype=I64)[:, None]
        g[:, 0] = -1
        return g.reshape(-1)

    def pglob_at(self, idx: np.ndarray) -> np.ndarray:
        """pglob[idx], without building pglob for a uniform-N batch."""
        if "pglob" in self.__dict__ or not self.uniform_n:
            return self.pglob[idx]
        N0 = self.T // self.R
        ps = self.psafe[idx]
        return np.where(ps >= 0, idx - idx % N0 + ps, -1)

    # a uniform-N batch's flat node index and row, built only when a rule asks (most
    # work on the [R, N0] blocks instead); a ragged batch sets both in __init__
    @cached_property
    def node_i(self) -> np.ndarray:
        return np.tile(np.arange(self.T // self.R, dtype=I64), self.R)

    @cached_property
    def node_row(self) -> np.ndarray:
        return np.repeat(self.inv, self.T // self.R)

    # per-row strings, built only when a rule needs them (messages, mostly)
    @cached_property
    def request_id(self) -> np.ndarray:
        return np.asarray(self._rid_names, dtype=object)[self._rid_codes]

    @cached_property
    def row_run_id(self) -> np.ndarray:
        return self._run_names[self._run_codes]

    @cached_property
    def algo(self) -> np.ndarray:
        return self._algo_names[self._algo_codes]

    # ------------------------------------------------------------ flat helpers
    def _aligned(self, part, n0, rows0, s0):
        """A per-node list column flat and aligned on node_tokens (-1 where a row's list
        is shorter than its N). Fast path: same lengths -> one slice of the values."""
        off, v, lens = part
        T = self.T
        if T == 0:
            return np.zeros(0, dtype=I64)
        if np.array_equal(lens, n0):
            return v[off[0]: off[-1]]                    # a view of the Arrow buffer (int32)
        if rows0 is None:
            rows0 = np.repeat(np.arange(len(n0), dtype=I64), n0)
        i = np.arange(T, dtype=I64) - s0[rows0]
        ok = i < lens[rows0]
        idx = np.where(ok, off[:-1][rows0] + i, 0)
        if len(v) == 0:
            return np.full(T, -1, dtype=I64)
        return np.where(ok, v[np.minimum(idx, len(v) - 1)], -1).astype(I64)

    @staticmethod
    def _own(part, inv, order):
        """A ragged list column -> (flat values in batch order, start per sorted row,
        length per sorted row, sorted row of each flat entry)."""
        off, v, lens = part
        ln = np.maximum(lens, 0)
        flat = list_values(off, v, lens)
        s0 = np.cumsum(ln) - ln
        return flat, s0[order], ln[order], np.repeat(inv, ln)   # inv[row of each entry]

    def row_any(self, flat: np.ndarray) -> np.ndarray:
        """Per-row any() of a bool array over this frame's flat nodes."""
        if not flat.any():   # the usual answer on a clean batch: one fast pass
            return np.zeros(self.R, dtype=bool)
        if self.uniform_n:   # [R, N0] blocks in batch order: no scatter
            return flat.reshape(self.R, -1).any(axis=1)[self.order]
        return np.bincount(self.node_row[flat], minlength=self.R) > 0

    def row_sum(self, flat: np.ndarray) -> np.ndarray:
        return np.bincount(self.node_row, weights=flat, minlength=self.R)

    def at_root(self, flat: np.ndarray) -> np.ndarray:
        """Per row, the value of a per-node array at node 0 (-1 for a row without nodes)."""
        if self.uniform_n:                               # every row has its node 0
            return flat[self.start].astype(I64)
        out = np.full(self.R, -1, dtype=I64)
        has = self.n > 0
        out[has] = flat[self.start[has]]
        return out

    def first_node(self, flat_bad: np.ndarray, fill=-1) -> np.ndarray:
        """Per row, the local index of the first node where flat_bad is true (or fill)."""
        out = np.full(self.R, fill, dtype=I64)
        if not flat_bad.any():
            return out
        idx = np.flatnonzero(flat_bad)[::-1]               # reversed: first wins on assignment
        out[self.node_row[idx]] = self.node_i[idx]
        return out

    # -------------------------------------------------------------- derived
    @cached_property
    def commit_last(self) -> np.ndarray:
        """Last committed token of each row (-1 when the commit is empty)."""
        out = np.full(self.R, -1, dtype=I64)
        ok = self.commit_n > 0
        if ok.any():
            out[ok] = self.commit[self.commit_start[ok] + self.commit_n[ok] - 1]
        return out

    @cached_property
    def chain_shaped(self) -> np.ndarray:
        """Rows whose parents are i - 1 for every node (a chain)."""
        return ~self.row_any((self.node_i > 0) & (self.parents != self.node_i - 1))

    @cached_property
    def depth(self) -> np.ndarray:
        """Depth of every node (flat), by pointer jumping over the safe parents."""
        if self.T == 0:
            return np.zeros(0, dtype=I64)
        if self.chain_shaped.all():
            if self.uniform_n and "node_i" not in self.__dict__:   # node_i's values, own array
                return np.tile(np.arange(self.T // self.R, dtype=I64), self.R)
            return self.node_i.copy()
        if self._shapes is not None:   # once per distinct shape, gathered per row
            ids, P = self._shapes
            U, N0 = P.shape
            g = np.where(P >= 0, P + np.arange(0, U * N0, N0, dtype=I64)[:, None], -1)
            return tree_depths_flat(g.reshape(-1), N0).reshape(U, N0)[ids].reshape(-1)
        return tree_depths_flat(self.pglob, int(self.n.max()))

    @cached_property
    def children_max(self) -> np.ndarray:
        """Most children of any node, per row."""
        if self.T == 0:
            return np.zeros(self.R, dtype=I64)
        if self.chain_shaped.all():
            return (self.n > 1).astype(I64)
        if self._shapes is not None:   # once per distinct shape, gathered per row
            ids, P = self._shapes
            U, N0 = P.shape
            par = (P + np.arange(0, U * N0, N0, dtype=I64)[:, None])[P >= 0]
            kids = np.bincount(par, minlength=U * N0).reshape(U, N0).max(axis=1)
            return kids[ids][self.order].astype(I64)
        kids = np.bincount(self.pglob[self.pglob >= 0], minlength=self.T)
        out = np.zeros(self.R, dtype=I64)
        np.maximum.at(out, self.node_row, kids)
        return out

    @cached_property
    def _shapes(self):
        """Rows of a uniform-N batch grouped by their safe parents (trees of one shape
        repeat): (shape id per batch row [R], safe parents per shape [U, N0]); None
        when N varies. Grouped by a fingerprint, then verified row by row: a row that
        differs from its group's first row gets a shape of its own."""
        if not self.uniform_n:
            return None
        R = self.R
        P = self.psafe.reshape(R, -1)                    # [R, N0], batch order
        N0 = P.shape[1]
        if N0 > MAX_NODES:
            return None
        P64 = P if P.dtype == I64 and P.flags.c_contiguous else np.ascontiguousarray(P, dtype=I64)
        with np.errstate(over="ignore"):   # sum over i of (parent + 2) * w_i, mod 2^64
            fp = (P64.view(np.uint64) + np.uint64(2)) @ _POSW[:N0]
        _, first, ids = np.unique(fp, return_index=True, return_inverse=True)
        ids = ids.reshape(-1)
        rep = P[first[ids]]
        mism = np.zeros(0, dtype=I64) if np.array_equal(P, rep) else np.flatnonzero((P != rep).any(axis=1))
        if mism.size:                                    # fingerprint collision: own shapes
            ids = ids.copy()
            ids[mism] = len(first) + np.arange(mism.size)
            first = np.concatenate((first, mism))
        return ids, np.ascontiguousarray(P[first])

    def _hash_of(self, r: int) -> int:
        ps = self.psafe[self.start[r]: self.start[r] + self.n[r]]
        return int(mask_hash(ancestor_mask(ps)))

    @cached_property
    def derived_mask_hash(self) -> np.ndarray:
        """Contract hash of the ancestor-or-self mask of each row's parents (uint64 [R]).

        Computed once per distinct shape: chains by N, trees by a fingerprint of
        their parents, verified node by node against a representative row."""
        out = np.zeros(self.R, dtype=np.uint64)
        fits = self.n <= MAX_NODES                       # refused rows: no N x N work (hash 0)
        chain = self.chain_shaped & fits
        if chain.any():
            out[chain] = self._chain_hash(self.n[chain])
        tree = ~self.chain_shaped & fits & (self.n > 0)
        rows = np.flatnonzero(tree)
        if rows.size and self._shapes is not None:     # one hash per distinct shape
            ids, P = self._shapes
            hashes = np.zeros(len(P), dtype=np.uint64)
            for u in np.flatnonzero(np.bincount(ids[self.order[rows]], minlength=len(P))):
                ps = P[u]
                key = ("tree", ps.astype(I64).tobytes())
                h = _HASH_CACHE.get(key)
                if h is None:
                    h = _HASH_CACHE[key] = int(mask_hash(ancestor_mask(ps)))
                hashes[u] = h
            out[rows] = hashes[ids[self.order[rows]]]
            if len(_HASH_CACHE) > 100_000:
                _HASH_CACHE.clear()
        elif rows.size:
            sel = tree[self.node_row]
            with np.errstate(over="ignore"):
                w = _POSW[np.minimum(self.node_i[sel], len(_POSW) - 1)]
                contrib = (self.psafe[sel] + 2).astype(np.uint64) * w
            fp_all = np.zeros(self.R, dtype=np.uint64)
            if self.uniform_n:   # whole rows of N0 nodes: a row sum (mod 2^64, as add.at)
                N0 = int(self.n[0])
                fp_all[self.node_row[sel][::N0]] = contrib.reshape(-1, N0).sum(axis=1, dtype=np.uint64)
            else:
                np.add.at(fp_all, self.node_row[sel], contrib)
            with np.errstate(over="ignore"):
                fp_all ^= self.n.astype(np.uint64) * _MIX1
            fp = fp_all[rows]
            uniq, first, inv = np.unique(fp, return_index=True, return_inverse=True)
            rep = rows[first][inv]                           # representative row of each row
            # verify: every node's parent equals the representative's at that index
            nsel = np.flatnonzero(sel)
            r_of = self.node_row[nsel]
            rep_of = np.empty(self.R, dtype=I64)
            rep_of[rows] = rep
            rr = rep_of[r_of]
            i = self.node_i[nsel]
            same = (self.n[rr] == self.n[r_of])
            j = np.where(same, self.start[rr] + np.minimum(i, self.n[rr] - 1), 0)
            diff = ~same | (self.psafe[j] != self.psafe[nsel])
            mism = np.zeros(self.R, dtype=bool)
            mism[r_of[diff]] = True
            hashes = np.zeros(len(uniq), dtype=np.uint64)
            for u, r0 in enumerate(rows[first]):
                ps = self.psafe[self.start[r0]: self.start[r0] + self.n[r0]]
                key = ("tree", ps.tobytes())
                h = _HASH_CACHE.get(key)
                if h is None:
                    h = _HASH_CACHE[key] = int(mask_hash(ancestor_mask(ps)))
                hashes[u] = h
            out[rows] = hashes[inv]
            for r in np.flatnonzero(mism):
                out[r] = self._hash_of(r)
            if len(_HASH_CACHE) > 100_000:
                _HASH_CACHE.clear()
        return out

    @staticmethod
    def _chain_hash(n: np.ndarray) -> np.ndarray:
        """Hash of the causal (chain) mask of each N; 0 for N above MAX_NODES (refused
        rows: the N x N mask is never built for them)."""
        out = np.zeros(len(n), dtype=np.uint64)
        one = len(n) > 0 and n.min() == n.max()          # one N (the usual batch): no sort
        for nn in (n[:1][n[:1] <= MAX_NODES] if one else np.unique(n[n <= MAX_NODES])):
            key = ("chain", int(nn))
            if key not in _HASH_CACHE:
                _HASH_CACHE[key] = int(mask_hash(ancestor_mask(np.arange(-1, nn - 1, dtype=I64))))
            if one:
                out[:] = _HASH_CACHE[key]
            else:
                out[n == nn] = _HASH_CACHE[key]
        return out

    @cached_property
    def causal_mask_hash(self) -> np.ndarray:
        """Hash of a plain causal mask of each row's N (what a tree gets by mistake)."""
        return self._chain_hash(self.n)

    # path entries: k (index in the path), global node index, validity
    @cached_property
    def path_k(self) -> np.ndarray:
        return _local_index(self.path_row, self.path_start, len(self.path))

    @cached_property
    def path_in_range(self) -> np.ndarray:
        """Per path entry: 0 <= node < N of its row."""
        if self.uniform_n:                               # one N: no gather of it per entry
            return (self.path >= 0) & (self.path < self.T // self.R)
        return (self.path >= 0) & (self.path < self.n[self.path_row])

    @cached_property
    def path_glob(self) -> np.ndarray:
        return np.where(self.path_in_range, self.start[self.path_row] + self.path, 0)

    @cached_property
    def path_struct_bad(self) -> np.ndarray:
        """Rows whose path does not start at 0, leaves the tree, or is not parent->child."""
        k = self.path_k
        bad = ~self.path_in_range | ((k == 0) & (self.path != 0))
        if len(self.path) > 1 and self.T:   # T = 0 (every node list empty): all out of range
            link = np.zeros(len(self.path), dtype=bool)
            link[1:] = (k[1:] > 0) & (self.pglob_at(self.path_glob[1:]) != self.path_glob[:-1])
            bad |= link
        if not bad.any():                                # the usual batch: no scatter
            return self.path_len < 1
        return (np.bincount(self.path_row[bad], minlength=self.R) > 0) | (self.path_len < 1)

    @cached_property
    def path_ok(self) -> np.ndarray:
        return self.ok & ~self.path_struct_bad

    @cached_property
    def last_node(self) -> np.ndarray:
        """Global index of the path's last node per row (the row's root when empty)."""
        out = self.start.copy()
        has = self.path_len > 0
        out[has] = self.path_glob[self.path_start[has] + self.path_len[has] - 1]
        return np.minimum(out, max(self.T - 1, 0))

    @cached_property
    def bonus(self) -> np.ndarray:
        """The target's argmax at the path's last node (the bonus token) per row."""
        if self.T == 0:
            return np.full(self.R, -1, dtype=I64)
        b = self.argmax[self.last_node]
        if self.sampled.any():  # speculative sampling: the token drawn there (contract v2)
            b = np.where(self.sampled, self.sampling.token, b)
        return b

    @cached_property
    def sampling(self):
        """Contract v2 sampling columns of this batch, re-derived (invariants/frame_sampling.py),
        or None when the batch has none (a greedy or v1 trace)."""
        from .frame_sampling import SamplingView
        return SamplingView.of(self)

    @property
    def sampled(self) -> np.ndarray:
        """Rows verified by speculative sampling: the greedy argmax rules do not apply."""
        s = self.sampling
        return s.rows if s is not None else np.zeros(self.R, dtype=bool)

    def sampling_sums(self) -> dict:
        """Run-level acceptance sums of the sampled rows (SA804), zeros when none."""
        s = self.sampling
        return s.sums() if s is not None else dict.fromkeys(SAMPLING_SUM_KEYS, 0)

    @cached_property
    def path_last_k(self) -> np.ndarray:
        """Per path entry: is it its row's last entry."""
        out = np.zeros(len(self.path), dtype=bool)
        has = self.path_len > 0                          # per row: no per-entry gather
        out[(self.path_start + self.path_len - 1)[has]] = True
        return out

    @cached_property
    def expected_commit(self) -> np.ndarray:
        """Flat, aligned with `path`: accepted draft tokens then the bonus (entry k is the
        token of path[k+1], the last entry is the bonus). Offsets: expected_start."""
        P = len(self.path)
        out = np.empty(P, dtype=I64)
        if P == 0:
            return out
        # every entry but the last of the batch takes the next entry's token; each row's
        # last entry is then overwritten by the bonus
        out[:-1] = self.tokens[self.path_glob[1:]] if self.T else -1
        has = self.path_len > 0                          # each row's last entry: the bonus
        out[(self.path_start + self.path_len - 1)[has]] = self.bonus[has]
        return out

    @property
    def expected_start(self) -> np.ndarray:
        return self.path_start

    @cached_property
    def commit_k(self) -> np.ndarray:
        return _local_index(self.commit_row, self.commit_start, len(self.commit))

    @cached_property
    def commit_mismatch_at(self) -> np.ndarray:
        """Per row: first commit index where committed_tokens differs from the expected
        commit (accepted drafts + bonus), or where it runs past it; -1 when none."""
        out = np.full(self.R, -1, dtype=I64)
        if len(self.commit) and np.array_equal(self.commit_n, self.path_len):
            # one commit entry per path entry (the usual row): both flat in batch order
            # with the same lengths, so entry j of one is entry j of the other
            idx = np.flatnonzero(self.commit != self.expected_commit)[::-1]
            out[self.commit_row[idx]] = self.commit_k[idx]
        elif len(self.commit):
            k, r = self.commit_k, self.commit_row
            inside = k < self.path_len[r]
            bad = ~inside                                 # past the expected commit
            if len(self.expected_commit):
                j = np.where(inside, self.path_start[r] + k, 0)
                bad |= self.commit != self.expected_commit[j]
            idx = np.flatnonzero(bad)[::-1]
            out[r[idx]] = k[idx]
        return out

    @cached_property
    def commit_eos_at(self) -> np.ndarray:
        """Per row: first commit index holding EOS, or -1."""
        out = np.full(self.R, -1, dtype=I64)
        if len(self.commit):
            idx = np.flatnonzero(self.commit == self.eos_id)[::-1]
            out[self.commit_row[idx]] = self.commit_k[idx]
        return out

    def finish_carry(self) -> None:
        """Fold this batch into the carry (call once, after the rules ran)."""
        c, cr, gstart = self._carry, self._cr, self._gstart
        if self.R == 0:
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
            rows_nz = self.inv[np.flatnonzero(nz[self.inv])]
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


# per-node diagnostic lists and the values they can hold: target_margin is top-1 minus
# top-2 logit (finite, >= 0), draft_logprob a log-probability (finite, <= 0)
DIAGNOSTIC_RANGES = {"target_margin": (0.0, np.inf), "draft_logprob": (-np.inf, 1e-6)}


def _diag_bad(arr, lo: float, hi: float, R: int, inv: np.ndarray):
    """(bad [R] over sorted rows, first offending value [R]) of a diagnostic list column:
    a value that is null inside a list, NaN, infinite, or outside [lo, hi]."""
    import pyarrow.compute as pc
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    bad = np.zeros(R, dtype=bool)
    val = np.full(R, np.nan)
    flat = arr.flatten()                                  # values of the non-null lists
    if len(flat) == 0:
        return bad, val
    v = to_np(flat, 0).astype(np.float64)
    valid = valid_mask(flat)
    if valid is not None:
        v[~valid] = np.nan                                # null -> NaN
    with np.errstate(invalid="ignore"):
        b = ~np.isfinite(v) | (v < lo) | (v > hi)
    if not b.any():
        return bad, val
    rows = inv[to_np(pc.list_parent_indices(arr))]
    idx = np.flatnonzero(b)[::-1]                         # reversed: the first wins
    bad[rows[idx]] = True
    val[rows[idx]] = v[idx]
    return bad, val


def _request_step_order(rcodes: np.ndarray, gidx: np.ndarray, step: np.ndarray) -> np.ndarray:
    """np.lexsort((step, gidx[rcodes])): rows by (request, step), ties in batch order.

    A writer appends each request's steps in step order, so a stable sort by request
    alone usually gives the same permutation: the request keys are ranks among the
    batch's few distinct requests, sorted by radix (uint16) when they fit; the steps
    are then checked to ascend inside each request, else the full lexsort runs."""
    _, rank = np.unique(gidx, return_inverse=True)      # dense rank of each dictionary code's request
    key = rank.reshape(-1)[rcodes]                      # code -1 -> the null slot (last entry)
    if len(gidx) <= 1 << 16:
        key = key.astype(np.uint16)
    order = np.argsort(key, kind="stable")
    if len(order) > 1:
        ks, ss = key[order], step[order]
        if ((ks[1:] == ks[:-1]) & (ss[1:] < ss[:-1])).any():
            return np.lexsort((step, gidx[rcodes]))
    return order


def _shifted(a: np.ndarray, dtype) -> np.ndarray:
    """a[r - 1] at row r (row 0 left unset: every group's first row is written after)."""
    out = np.empty(len(a), dtype=dtype)
    out[1:] = a[:-1]
    return out


def _local_index(row: np.ndarray, start: np.ndarray, size: int) -> np.ndarray:
    return np.arange(size, dtype=I64) - start[row] if size else np.zeros(0, dtype=I64)


_HASH_CACHE: dict = {}
_POSW = np.random.default_rng(20261130).integers(1, 2**63 - 1, size=MAX_NODES + 1,
                                                   dtype=np.int64).astype(np.uint64) | np.uint64(1)


# ----------------------------------------------------------------- requests


class RequestFrame:
    """Every request of a run: the requests table joined with its steps' carry.

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
                 max_new_tokens: int | None, complete: bool, manifest: dict):
        Q = carry.n
        self.run_id, self.eos_id, self.max_new_tokens = run_id, eos_id, max_new_tokens
        self.complete, self.manifest = complete, manifest
        self.R = Q
        self._names = carry.names
        self.has_steps = carry.view("seen")
        self.n_steps = carry.view("n_steps")
        self.first_seq_len = carry.view("first_seq_len")
        self.first_root = carry.view("first_root")
        self.first_ok = carry.view("first_ok")      # the first step was not refused (SA1xx)
        self.commits_hash = carry.view("hash")
        self.commits_len = carry.view("out_len")
        self.sum_commit_len = carry.view("sum_commit_len")
        self.sum_commit_n = carry.view("sum_commit_n")
        self.sum_depth = carry.view("sum_depth")
        self.sum_true_depth = carry.view("sum_true_depth")
        self.last_finished = carry.view("last_finished")
        self.contiguous = carry.view("contiguous")
        t = table_facts or {}
        def arr(k, fill, dt):
            a = np.full(Q, fill, dtype=dt)
            if k in t:
                a[t["idx"]] = t[k]   # a duplicated request keeps its last row
            return a
        self.has_row = np.zeros(Q, dtype=bool)
        self.row_count = np.zeros(Q, dtype=I64)   # rows in the requests table
        if "idx" in t:
            self.has_row[t["idx"]] = True
            np.add.at(self.row_count, t["idx"], 1)
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
        null = carry.names.slot_of("\0null")
        if 0 <= null < Q:
            self.null_slot[null] = True

    @cached_property
    def request_id(self) -> np.ndarray:
        """The request id of each slot (object [Q]): built when a finding names one."""
        return np.asarray(self._names[: self.R], dtype=object)


class RunFrame:
    """One run: manifest, reported, conventions, and the aggregates re-derived.

    derived: steps, drafted (sum of N - 1), accepted (sum of len(path) - 1),
    accepted_counter (sum of accepted_depth), committed (sum of len(committed_tokens)),
    commit_len_sum, generated (sum of len(output_tokens), complete runs), requests,
    per_request_mean_depth / per_request_mean_commit (mean of per-request means),
    width_sum (steps x budget), depth_hist (steps by true depth), wall_s (from
    t_start/step_s), partitions: {name: same counters for that file or rank}.
    R = 1 (one row), so step-style rules work unchanged.
    """

    def __init__(self, run_id: str, manifest: dict | None, derived: dict, complete: bool,
                 conventions: dict, incomplete_reason: str | None = None):
        self.run_id = run_id
        self.manifest = manifest or {}
        self.reported = (manifest or {}).get("reported") or {}
        self.derived = derived
        self.complete = complete
        self.conventions = conventions
        self.incomplete_reason = incomplete_reason
        self.config = (manifest or {}).get("config") or {}
        self.R = 1
