"""TreeShapes: the tree-shape derivations of a StepFrame (a mixin of invariants/frame.py).

Depth of every node, most children per row, the contract hash of each row's
ancestor mask and of a plain causal mask. Trees of one shape repeat within a batch,
so the work is done once per distinct shape: rows of a uniform-N batch are grouped
by their safe parents (`_shapes`, invariants/row_groups.py), and the N x N masks are hashed once per shape (cached
across batches in `_HASH_CACHE`). Reads from the frame: R, T, n, start, order,
uniform_n, parent_in_row, parent_flat, node_i, node_row, parents, chain_shaped, row_any.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from specaudit.trace.schema import MAX_NODES, ancestor_mask, mask_hash, tree_depths_flat

from .carry import _MIX1
from .row_groups import group_rows

I64 = np.int64
_HASH_CACHE: dict = {}
_POSW = np.random.default_rng(20261130).integers(1, 2**63 - 1, size=MAX_NODES + 1,
                                                   dtype=np.int64).astype(np.uint64) | np.uint64(1)


def tree_hash(ps: np.ndarray) -> int:
    """The contract hash of the ancestor-or-self mask of one row's (valid) parents,
    cached by shape across batches (the frame's derived_mask_hash, the screen's trees)."""
    key = ("tree", ps.astype(I64).tobytes())
    h = _HASH_CACHE.get(key)
    if h is None:
        h = _HASH_CACHE[key] = int(mask_hash(ancestor_mask(ps)))
    return h


class TreeShapes:
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
            return self.shape_depth[self._shapes[0]].reshape(-1)
        return tree_depths_flat(self.parent_flat, int(self.n.max()))

    @cached_property
    def shape_depth(self) -> np.ndarray:
        """Depth of every node of each distinct shape ([U, N0], rows of `_shapes`)."""
        P = self._shapes[1]
        U, N0 = P.shape
        g = np.where(P >= 0, P + np.arange(0, U * N0, N0, dtype=I64)[:, None], -1)
        return tree_depths_flat(g.reshape(-1), N0).reshape(U, N0)

    @cached_property
    def shape_children(self) -> np.ndarray:
        """The children of every node of each distinct shape, ascending, -1 after the
        last ([U, N0, K], K the most children of any node; rows of `_shapes`)."""
        P = self._shapes[1]
        U, N0 = P.shape
        has = P >= 0
        key = (P + np.arange(0, U * N0, N0, dtype=I64)[:, None])[has]   # parent, as u * N0 + node
        child = np.broadcast_to(np.arange(N0, dtype=I64), P.shape)[has]
        cnt = np.bincount(key, minlength=U * N0)
        K = max(int(cnt.max(initial=0)), 1)
        o = np.argsort(key, kind="stable")                 # by parent, children ascending
        key, child = key[o], child[o]
        rank = np.arange(len(key), dtype=I64) - (np.cumsum(cnt) - cnt)[key]
        out = np.full((U * N0, K), -1, dtype=I64)
        out[key, rank] = child
        return out.reshape(U, N0, K)

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
        kids = np.bincount(self.parent_flat[self.parent_flat >= 0], minlength=self.T)
        out = np.zeros(self.R, dtype=I64)
        np.maximum.at(out, self.node_row, kids)
        return out

    @cached_property
    def _shapes(self):
        """Rows of a uniform-N batch grouped by their safe parents (trees of one shape
        repeat; invariants/row_groups.py): (shape id per batch row [R], safe parents per
        shape [U, N0]); None when N varies. (A batch whose rows are all ok has it set by
        _set_safe_parents: the grouping _check_structure made of the same parents.)"""
        if not self.uniform_n:
            return None
        P = self.parent_in_row.reshape(self.R, -1)              # [R, N0], batch order
        if P.shape[1] > MAX_NODES:
            return None
        ids, first = group_rows(P, self._sk)                    # (compiled: a big batch)
        return ids, np.ascontiguousarray(P[first])

    def _hash_of(self, r: int) -> int:
        ps = self.parent_in_row[self.start[r]: self.start[r] + self.n[r]]
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
            every = rows.size == self.R                     # the usual batch: every row a tree
            sid = ids[self.order] if every else ids[self.order[rows]]   # each row's shape, once
            for u in np.flatnonzero(np.bincount(sid, minlength=len(P))):
                hashes[u] = tree_hash(P[u])
            if every:
                out = hashes[sid]
            else:
                out[rows] = hashes[sid]
            if len(_HASH_CACHE) > 100_000:
                _HASH_CACHE.clear()
        elif rows.size:
            sel = tree[self.node_row]
            with np.errstate(over="ignore"):
                w = _POSW[np.minimum(self.node_i[sel], len(_POSW) - 1)]
                contrib = (self.parent_in_row[sel] + 2).astype(np.uint64) * w
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
            diff = ~same | (self.parent_in_row[j] != self.parent_in_row[nsel])
            mism = np.zeros(self.R, dtype=bool)
            mism[r_of[diff]] = True
            hashes = np.zeros(len(uniq), dtype=np.uint64)
            for u, r0 in enumerate(rows[first]):
                ps = self.parent_in_row[self.start[r0]: self.start[r0] + self.n[r0]]
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
