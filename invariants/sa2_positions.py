"""SA2xx: positions and the attention mask actually fed (contract rules 3 and 4)."""
from __future__ import annotations

import numpy as np

from specaudit.trace.schema import MAX_NODES

from . import compiled
from .arrow import to_np
from .base import Hits, Rule

_I32 = np.iinfo(np.int32)
_CHUNK = 4096   # rows compared at a time
_KERNELS = "specaudit.invariants.rule_kernels"   # compiled "anything bad?" tests (big batches)


class Positions(Rule):
    """What: positions[i] = seq_len + depth(i) for every node.

    Why: a node's position is where its token would sit in the output; a tree's
    siblings share a position. A shifted or node-index position makes the target
    predict for the wrong place, and acceptance silently drops.

    Example: seq_len 22, node 3 at depth 3 fed position 26 instead of 25 (every node
    shifted by one: an off-by-one in the position ids).
    """

    code = "SA201"
    live = ("prom", "kernel:positions")
    name = "positions"
    message = ("node {node} (depth {depth}) was fed position {pos}, expected seq_len {seq_len} "
               "+ depth {depth} = {want}{pattern}")

    def check(self, f):
        if f.T == 0:
            return None
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and not _positions_bad(kern, f):
            return None   # the kernel found no bad node: numpy's mask would be all false
        if f.uniform_n:   # [R, N0] blocks in batch order: seq_len broadcast, no gather
            R = f.R
            pos = f.positions.reshape(R, -1)
            N0 = pos.shape[1]
            seq = f.seq_len[f.inv]
            if N0 <= MAX_NODES and seq.min() >= _I32.min and seq.max() <= _I32.max - N0:
                seq = seq.astype(np.int32)   # seq_len + depth fits int32: half the bytes
            # a chain's depth is the node index, a tree's its shape's: no flat depth array
            if f.chain_shaped.all():
                dep = lambda sl: np.arange(N0, dtype=seq.dtype)
            elif f._shapes is not None:
                D, ids = f.shape_depth.astype(seq.dtype), f._shapes[0]
                dep = lambda sl: D[ids[sl]]
            else:
                D = f.depth.reshape(R, -1)
                dep = lambda sl: D[sl]
            # by chunks of rows (small temporaries, reused: a fresh [R, N0] one costs more
            # in page faults than the compare); the usual batch stops there, all equal
            bad_at = lambda sl: pos[sl] != seq[sl, None] + dep(sl)
            if not any(bad_at(slice(c, c + _CHUNK)).any() for c in range(0, R, _CHUNK)):
                return None
            badn = bad_at(slice(None)).reshape(-1)
        else:
            badn = f.positions != f.seq_len[f.node_row] + f.depth
        node = f.first_node(badn)
        hit = node >= 0
        if not hit.any():
            return None
        want = f.seq_len[f.node_row] + f.depth
        g = np.where(hit, f.start + np.maximum(node, 0), 0)
        pos = np.where(hit, f.positions[np.minimum(g, f.T - 1)], -1)
        dep = np.where(hit, f.depth[np.minimum(g, f.T - 1)], -1)
        # explain: the same shift on every node, or positions by node index
        shift = f.positions - want
        smin = np.full(f.R, np.iinfo(np.int64).max)
        smax = np.full(f.R, np.iinfo(np.int64).min)
        np.minimum.at(smin, f.node_row, shift)
        np.maximum.at(smax, f.node_row, shift)
        byidx = ~f.row_any(f.positions != f.seq_len[f.node_row] + f.node_i)
        def pattern(i):
            if byidx[i] and not f.chain_shaped[i]:
                return " (positions follow node index, not depth)"
            return f" (every node shifted by {smin[i]})" if smin[i] == smax[i] else ""
        return Hits(hit, node=node, depth=dep, pos=pos, seq_len=f.seq_len,
                    want=f.seq_len + np.maximum(dep, 0), pattern=pattern)

    def fail(self, run):
        s = run.steps[5]
        s["positions"] = [p + 1 for p in s["positions"]]


def _positions_bad(kern, f) -> bool:
    """SA201's mask has a hit (compiled): on [R, N0] blocks when every row is a chain or
    the shapes are grouped already, else with depths from the safe parents."""
    if f.uniform_n:
        R = f.R
        pos = f.positions.reshape(R, -1)
        if f.chain_shaped.all():   # (set by the frame for a uniform batch: no cost)
            # seq_len in batch order as the column holds it (-1 where null, as the frame's):
            # seq_len[inv] without the gather
            return kern.positions_bad_chain(pos, to_np(f.columns["seq_len"], -1))
        shapes = f.__dict__.get("_shapes")   # grouped by the frame when every row is ok
        if shapes is not None:
            return kern.positions_bad_uniform(pos, f.seq_len, f.inv, shapes[0], f.shape_depth)
    return kern.positions_bad_parents(f.positions, f.seq_len, f.start, f.n, f.parent_in_row, f.inv)


class MaskHash(Rule):
    """What: mask_hash equals the contract hash of the ancestor-or-self visibility of
    `parents` (each node sees itself and its ancestors, never a sibling's branch).

    Why: the hash is of the mask the verify forward really used; a mask that lets a
    node see other branches (a plain causal mask on a tree) changes the target's
    predictions, so acceptance and even the output can go wrong.

    Example: a branching tree verified with a lower-triangular mask: the recorded
    hash is the causal mask's, not the tree's.
    """

    code = "SA202"
    live = ("prom", "kernel:mask")
    name = "mask-hash"
    message = "mask_hash {got} is not the ancestor-or-self mask of these parents ({want}){explain}"
    fixture_algo = "tree"

    def check(self, f):
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and f.uniform_n and f.chain_shaped.all():
            # every row a chain of N0 nodes: derived_mask_hash gives each row the chain hash
            # of N0 (0 above MAX_NODES), by the frame's _chain_hash; one row's N suffices
            if not kern.hash_differs(f.mask_hash, np.uint64(f._chain_hash(f.n[:1])[0])):
                return None
        want = f.derived_mask_hash
        bad = f.mask_hash != want
        if not bad.any():
            return None
        causal = f.causal_mask_hash
        explain = lambda i: ": it is a plain causal mask over node index" if f.mask_hash[i] == causal[i] else ""
        got = np.array([f"{int(x):#018x}" for x in f.mask_hash[bad]], dtype=object)
        wanted = np.array([f"{int(x):#018x}" for x in want[bad]], dtype=object)
        g = np.full(f.R, "", dtype=object)
        w = np.full(f.R, "", dtype=object)
        g[bad], w[bad] = got, wanted
        return Hits(bad, got=g, want=w, explain=explain)

    def fail(self, run):
        import numpy as _np

        from specaudit.trace.schema import mask_hash
        s = run.steps_where(lambda s: any(p != i - 1 for i, p in enumerate(s["parents"]) if i))[0]
        n = len(s["parents"])
        s["mask_hash"] = int(mask_hash(_np.tril(_np.ones((n, n), dtype=bool))))
