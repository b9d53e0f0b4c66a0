"""What step rules see: StepFrame, one record batch of one run's steps, re-derived.

(Request rules see RequestFrame, invariants/request_frame.py; run rules RunFrame,
invariants/run_frame.py.) Everything is re-derived here, vectorised over Arrow
buffers with numpy: no Python loop per step (loops over node index up to N, over
distinct tree shapes, and over the request ids of a batch are fine). Rows are
sorted by (request, step) inside a batch; per-node arrays are flat over the batch
with `start` offsets.

Continuity across batches uses a per-request carry (`Carry`, invariants/carry.py):
the last step of each request seen so far (its step index, seq_len + commit, last
token, finished, output length and an order-sensitive hash of its commits). A request's steps must
come in step order across files and row groups, as every writer appending steps
in verify order does; a step that comes late is reported by SA401.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from specaudit.trace.schema import (
    MAX_NODES,
    NODE_LIST_COLUMNS,
    NULLABLE_NODE_LIST_COLUMNS,
)

from . import compiled

# the Arrow decoding (invariants/arrow.py) is re-exported: the checker imports it from here
from .arrow import (  # noqa: F401  (re-exported)
    _lengths,
    _scalar,
    _strings,
    list_lengths,
    list_parts,
    list_values,
    rows_with_null_values,
    to_np,
    valid_mask,
)
from .carry import Carry
from .frame_diagnostics import DIAGNOSTIC_RANGES, diagnostic_bad
from .frame_link import KERNELS, FrameLink
from .frame_read import SCALARS, SORT_KERNELS, read_lists, read_scalars, sort_rows
from .frame_sampling import SAMPLING_SUM_KEYS
from .frame_shapes import TreeShapes
from .row_groups import group_rows

I64 = np.int64


class StepFrame(TreeShapes, FrameLink):
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
        # rows whose required lists hold a null value (read as -1 by the lists above): SA107
        self.inner_nulls: dict[str, np.ndarray] = {}
        for name in NODE_LIST_COLUMNS + ("accepted_path", "committed_tokens"):
            m = rows_with_null_values(col[name]) if name in col else None
            if m is not None:
                self.inner_nulls[name] = m[self.order]
        self._check_structure()
        self._set_safe_parents()
        # accepted path and commit (flat in batch order; *_start per sorted row)
        # (path_row, commit_row: built on first use; by _read_lists when compiled: raw None)
        if raw is not None:
            self.path, self.path_start, self.path_len = self._own(raw["accepted_path"], self.order)
            self.commit, self.commit_start, self.commit_n = self._own(raw["committed_tokens"], self.order)
        self.true_depth = self.path_len - 1
        # a big batch: the path, commit and link arrays from compiled kernels (frame_link.py)
        self._kern = compiled.kernels(KERNELS, rows=self.R)
        self._path_commit_pass()
        self._link_previous(carry)

    # ------------------------------------------------------------ stages of __init__
    def _sort_rows(self, col: dict, carry: Carry, row_offset: int) -> None:
        """Request ids -> carry indices; the rows sorted by (request, step): `order`
        (row r of this frame is batch row order[r]) and its inverse `inv`. A big batch:
        through the compiled kernels of invariants/frame_read.py (`_sk`, also for the
        next two stages), the same arrays."""
        R = self.R
        self._sk = sk = compiled.kernels(SORT_KERNELS, rows=R)
        if sk is not None and sort_rows(self, sk, col, carry, row_offset):
            return
        rcodes, rdict = _strings(col["request_id"])
        if not all(map(str.__instancecheck__, rdict)):   # (a string dictionary: all str already)
            rdict = [str(x) for x in rdict]
        gidx = carry.index(rdict + ["\0null"])  # code -1 -> the null slot
        step, step_null = _scalar(col["step"])
        order, self.step = _request_step_order(rcodes, gidx, step)
        self.order = order
        self.row_in_file = order + row_offset
        self._rid_names = rdict + ["<null>"]
        self._rid_codes = rcodes[order]
        self.req = gidx[self._rid_codes]
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
        rc, rd = _strings(col["run_id"], wide=False)
        self._run_names = np.asarray([str(x) for x in rd] + ["<null>"], dtype=object)
        self._run_codes, per_row = _codes_in_order(rc, len(rd), order)
        self.run_id_ok = per_row(self._run_names == self.run_id)
        ac, ad = _strings(col["algo"], wide=False)
        self._algo_names = np.asarray([str(x) for x in ad] + ["<null>"], dtype=object)
        self._algo_codes, per_row = _codes_in_order(ac, len(ad), order)
        self.is_chain = per_row(self._algo_names == "chain")
        self.algo_known = per_row(np.isin(self._algo_names, ["chain", "tree"]))
        if self._sk is not None:                          # the columns below gathered in one pass
            read_scalars(self, self._sk, col)
            return
        for name, fill, dtype in SCALARS:
            v, nl = _scalar(col[name], fill=fill, dtype=dtype)
            setattr(self, name, v[order])
            if nl is not None:
                self.nulls[name] = nl[order]

    def _read_lists(self, col: dict) -> dict:
        """The list columns: lengths per sorted row (`lens`), the diagnostic lists'
        bad values, N per row (`n`, `n_raw`), flat starts, and the per-node lists flat
        in the batch's own order (no copy when every list has N entries).
        -> the raw (offsets, values, lengths) of each list column, by name; None when the
        compiled read did it all, path and commit included."""
        if self._sk is not None and read_lists(self, self._sk, col):
            return None
        R, order, inv = self.R, self.order, self.inv
        self.lens: dict[str, np.ndarray] = {}
        raw = {}
        for name in (*NODE_LIST_COLUMNS, *NULLABLE_NODE_LIST_COLUMNS, "accepted_path", "committed_tokens"):
            if name not in col:
                continue
            off, v, lens = list_parts(col[name])
            raw[name] = (off, v, lens)
            same = name != "node_tokens" and np.array_equal(lens, raw["node_tokens"][2])
            self.lens[name] = self.lens["node_tokens"] if same else lens[order]   # (shared: read-only)
        # diagnostic values (SA109), when the column was decoded: column -> (bad [R], value [R])
        self.diag_bad = {c: diagnostic_bad(col[c], *DIAGNOSTIC_RANGES[c], R, inv)
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
        if self.uniform_n:          # every n is N0 >= 1 and equals n_raw: the lists sharing it need no compare
            N0 = self.T // R
            self.too_many_nodes = np.full(R, N0 > MAX_NODES)
            shapes_ok = np.full(R, N0 <= MAX_NODES)
        else:
            self.too_many_nodes = n > MAX_NODES
            shapes_ok = (n >= 1) & ~self.too_many_nodes
        for k in ("parents", "positions", "target_argmax"):
            if not (self.uniform_n and self.lens[k] is self.n_raw):
                shapes_ok &= self.lens[k] == n
        for k in ("draft_logprob", "target_margin"):
            if k in self.lens and not (self.uniform_n and self.lens[k] is self.n_raw):
                shapes_ok &= (self.lens[k] == n) | (self.lens[k] == -1)
        shapes_ok &= (self.lens["accepted_path"] >= 1) & (self.lens["committed_tokens"] >= 0)
        self.shapes_ok = shapes_ok
        p = self.parents
        if self.uniform_n:                                # [R, N0] blocks: once per distinct tree
            N0 = self.T // R
            P = p.reshape(R, N0)
            ids, first = self._raw_shapes = group_rows(P, self._sk)  # (invariants/row_groups.py)
            Pu, ii = P[first], np.arange(1, N0, dtype=I64)
            # per batch row, and per sorted row (one shape: no gather; n >= 1 on every row)
            one = len(first) == 1
            per_row = (lambda v: np.full(R, v[0])) if one else (lambda v: v[ids])
            per_sorted = per_row if one else (lambda v: v[ids][self.order])
            chain_u = (Pu[:, 1:] == ii - 1).all(axis=1)
            self._chain_rows = per_row(chain_u)            # per batch row: parents are i - 1
            self._all_chains = bool(chain_u.all())
            self.root_parent_bad = per_sorted(Pu[:, 0] != -1)
            self.parent_order_bad = per_sorted(((Pu[:, 1:] < 0) | (Pu[:, 1:] >= ii)).any(axis=1))
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
        """parent_in_row: the parents where a row is ok, a chain where it is not (derivations
        stay in range); parent_flat: the parent as a flat index (-1 at roots), built here
        or on first use (a uniform-N tree batch, see the `parent_flat` property)."""
        p, T = self.parents, self.T
        if self.ok.all() and self._all_chains:            # all chains: parent = previous node
            self.parent_in_row = p
            if not self.uniform_n:                        # (uniform: the property, if a rule asks)
                self.parent_flat = np.arange(-1, T - 1, dtype=I64)
                self.parent_flat[self.node_i == 0] = -1
            self.__dict__["chain_shaped"] = np.ones(self.R, dtype=bool)
        elif self.uniform_n and self.ok.all():           # a tree batch: its own parents, no copy
            self.parent_in_row = p
            ids, first = self._raw_shapes                 # the shapes grouped by _check_structure
            self.__dict__["_shapes"] = (ids, np.ascontiguousarray(p.reshape(self.R, -1)[first]))
            self.__dict__["chain_shaped"] = self._chain_rows[self.order]
        elif self.uniform_n:                              # the same on [R, N0] blocks, no gathers
            N0 = T // self.R
            ok_b = self.ok[self.inv]                      # per batch row
            ps = p.reshape(self.R, N0).astype(I64)        # an ok row's root parent is -1
            ps[~ok_b] = np.arange(-1, N0 - 1, dtype=I64)
            self.parent_in_row = ps.reshape(-1)
            self.__dict__["chain_shaped"] = self._chain_rows[self.order]
        else:
            is_root = self.node_i == 0
            okn = self.ok[self.node_row]
            self.parent_in_row = np.where(okn & ~is_root, p, self.node_i - 1)
            self.parent_flat = np.where(self.parent_in_row >= 0, self.start[self.node_row] + self.parent_in_row, -1)

    @cached_property
    def parent_flat(self) -> np.ndarray:
        """A uniform-N batch's parent as a flat index (ragged batches set it in
        __init__): every safe parent is >= 0 but the roots' (column 0)."""
        R = self.R
        N0 = self.T // R
        g = self.parent_in_row.reshape(R, N0) + np.arange(0, self.T, N0, dtype=I64)[:, None]
        g[:, 0] = -1
        return g.reshape(-1)

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
    def _own(part, order):
        """A ragged list column -> (flat values in batch order, start per sorted row,
        length per sorted row)."""
        off, v, lens = part
        ln = np.maximum(lens, 0)
        flat = list_values(off, v, lens)
        s0 = np.cumsum(ln) - ln
        return flat, s0[order], ln[order]

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
            # entry k's parent is entry k - 1 (one row: local indices suffice; an entry out
            # of range has made its row bad already, whatever this finds)
            link[1:] = (k[1:] > 0) & (self.parent_in_row[self.path_glob[1:]] != self.path[:-1])
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

    # the sorted row of each path and commit entry (inv[batch row of each entry])
    @cached_property
    def path_row(self) -> np.ndarray:
        return np.repeat(self.inv, self.path_len[self.inv])

    @cached_property
    def commit_row(self) -> np.ndarray:
        return np.repeat(self.inv, self.commit_n[self.inv])

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

def _request_step_order(rcodes: np.ndarray, gidx: np.ndarray, step: np.ndarray):
    """np.lexsort((step, gidx[rcodes])): rows by (request, step), ties in batch order
    -> (that order, step in it).

    A writer appends each request's steps in step order, so a stable sort by request
    alone usually gives the same permutation: the request keys are ranks among the
    batch's few distinct requests, sorted by radix (uint16) when they fit; the steps
    are then checked to ascend inside each request, else the full lexsort runs."""
    _, rank = np.unique(gidx, return_inverse=True)      # dense rank of each dictionary code's request
    key = rank.reshape(-1)[rcodes]                      # code -1 -> the null slot (last entry)
    if len(gidx) <= 1 << 16:
        key = key.astype(np.uint16)
    order = np.argsort(key, kind="stable")
    ss = step[order]
    if len(order) > 1:
        ks = key[order]
        if ((ks[1:] == ks[:-1]) & (ss[1:] < ss[:-1])).any():
            order = np.lexsort((step, gidx[rcodes]))
            ss = step[order]
    return order, ss


def _codes_in_order(codes: np.ndarray, n_values: int, order: np.ndarray):
    """A string column's codes in sorted row order, and a function: per-value table ->
    per-row values. A column of one value and no null (a run's run_id, its algo: the
    usual batch) needs neither gather: every code is 0."""
    if n_values == 1 and codes.min(initial=0) >= 0:
        return codes, lambda table: np.full(len(codes), table[0])
    codes = codes[order]
    return codes, lambda table: table[codes]


def _local_index(row: np.ndarray, start: np.ndarray, size: int) -> np.ndarray:
    return np.arange(size, dtype=I64) - start[row] if size else np.zeros(0, dtype=I64)
