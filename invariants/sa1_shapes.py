"""SA1xx: shapes and tree structure (contract rules 1 and 2).

These rules see every row; a row that breaks one of them is hidden from every other
family (its tensors cannot be interpreted), so one broken row gives one clear line.
"""
from __future__ import annotations

import numpy as np

from specaudit.trace.schema import MAX_NODES

from . import compiled
from .base import Hits, Rule

_KERNELS = "specaudit.invariants.rule_kernels"   # compiled "anything bad?" tests (big batches)
_LISTS = ("parents", "positions", "target_argmax", "draft_logprob", "target_margin")


class NodeListLengths(Rule):
    """What: node_tokens, parents, positions and target_argmax (and draft_logprob,
    target_margin when not null) all have N entries, one per node.

    Why: every per-node tensor of one verify forward has the same length; unequal
    lists mean the writer mixed rows or truncated a tensor, and nothing about the
    step can be trusted. (draft_logprob and target_margin, which no other rule
    reads, are decoded only when a row group's Parquet statistics do not already
    show them null or holding exactly node_tokens' number of values with no null.)

    Example: node_tokens has 8 entries and positions 7.
    """

    code = "SA101"
    live = ("prom",)
    name = "node-list-lengths"
    message = "per-node lists differ in length: node_tokens has {n} entries but {column} has {got}"

    def check(self, f):
        # the usual batch: every list as long as node_tokens (no per-row text to build)
        # (a list as long as node_tokens in every row shares its lengths array: `is`)
        if all(f.lens[c] is f.n_raw or np.array_equal(f.lens[c], f.n_raw) for c in _LISTS if c in f.lens):
            return None
        bad = np.zeros(f.R, dtype=bool)
        which = np.full(f.R, "", dtype=object)
        got = np.zeros(f.R, dtype=np.int64)
        for c in _LISTS[::-1]:
            if c not in f.lens:
                continue
            ln = f.lens[c]
            b = (ln != f.n) & ~((ln == -1) & (c in ("draft_logprob", "target_margin")))
            b &= f.n_raw >= 0
            which[b] = c
            got[b] = ln[b]
            bad |= b
        return Hits(bad, n=f.n, column=which, got=got)

    def fail(self, run):
        s = run.steps[3]
        s["positions"] = s["positions"][:-1]


class NodeCount(Rule):
    """What: 1 <= N <= budget + 1, and N <= 4096 (rows above are refused).

    Why: a step holds the root and at most `budget` draft nodes; N above 4096 is a
    corrupt row, not a real tree (the reader refuses it rather than allocating it).

    Example: budget 7 and 12 nodes: the engine drafted more than it declared.
    """

    code = "SA102"
    live = ("prom", "kernel:tree")
    name = "node-count"
    message = "{n} nodes but the budget allows 1 + {budget} = {limit}{refused}"

    def check(self, f):
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and not kern.node_count_bad(f.n_raw, f.n, f.budget, f.too_many_nodes):
            return None   # every N within its budget: numpy's mask would be all false
        bad = (f.n_raw < 1) | (f.n > f.budget + 1) | f.too_many_nodes
        refused = lambda i: f" (above {MAX_NODES}: row refused)" if f.too_many_nodes[i] else ""
        return Hits(bad, n=f.n_raw, budget=f.budget, limit=f.budget + 1, refused=refused)

    def fail(self, run):
        s = run.steps[2]
        s["budget"] = len(s["node_tokens"]) - 3


class RootParent(Rule):
    """What: parents[0] = -1: node 0 is the root.

    Why: the root is the last committed token; it has no parent in the verify block.

    Example: parents = [0, 0, 1, ...].
    """

    code = "SA103"
    live = ("prom", "kernel:tree")
    name = "root-parent"
    message = "parents[0] is {p0}, expected -1 (node 0 is the root)"

    def check(self, f):
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and not kern.root_parent_bad(f.root_parent_bad, f.n):
            return None   # every root's parent is -1: numpy's mask would be all false
        return Hits(f.root_parent_bad & (f.n > 0), p0=f.at_root(f.parents))

    def fail(self, run):
        run.steps[1]["parents"][0] = 0


class ParentPrecedes(Rule):
    """What: 0 <= parents[i] < i for every node i >= 1.

    Why: parents come before children in node order; a parent at or after its child
    makes a cycle or a forward edge, and depth, mask and path are undefined.

    Example: parents = [-1, 0, 3, 2]: nodes 2 and 3 form a cycle.
    """

    code = "SA104"
    live = ("prom", "kernel:tree")
    name = "parent-precedes"
    message = "node {node} has parent {parent}: parents must point backward (0 <= parent < node){what}"

    def check(self, f):
        if not f.parent_order_bad.any():                 # the frame's own pass found none
            return None
        p = f.parents
        badn = (f.node_i > 0) & ((p < 0) | (p >= f.node_i))
        node = f.first_node(badn)
        par = np.full(f.R, -1, dtype=np.int64)
        hit = node >= 0
        par[hit] = p[f.start[hit] + node[hit]]
        what = lambda i: " (a self-loop)" if par[i] == node[i] else (" (forward: a cycle)" if par[i] > node[i] else "")
        return Hits(hit & f.shapes_ok, node=node, parent=par, what=what)

    def fail(self, run):
        s = run.steps_where(lambda s: len(s["parents"]) >= 4)[0]
        s["parents"][2], s["parents"][3] = 3, 2


class TopkChildren(Rule):
    """What: no node has more than `topk` children.

    Why: topk bounds the branching the drafter was configured for; more children
    mean the tree builder ignored its configuration (or the topk column lies).

    Example: topk 2 and the root has 3 children.
    """

    code = "SA105"
    live = ("prom",)
    name = "topk-children"
    message = "a node has {kids} children but topk is {topk}"
    fixture_algo = "tree"

    def check(self, f):
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None:   # numpy's mask all false: no Hits (the same findings: none)
            if f.T > 0 and f.chain_shaped.all():   # (children_max: n > 1 as 0/1, not built)
                if not kern.children_over_topk_chain(f.ok, f.n, f.topk):
                    return None
            elif not kern.children_over_topk(f.ok, f.children_max, f.topk):
                return None
        kids = f.children_max
        return Hits(f.ok & (kids > f.topk), kids=kids, topk=f.topk)

    def fail(self, run):
        s = run.steps_where(lambda s: max(s["parents"].count(i) for i in range(len(s["parents"]))) >= 2)[0]
        s["topk"] = 1
        s["algo"] = "tree"


class ChainShape(Rule):
    """What: when algo is `chain` or topk is 1, parents[i] = i - 1.

    Why: a chain is the tree in which every node's parent is the node before; a
    chain row with another shape means the algo column or the proposer is wrong.

    Example: algo chain, parents = [-1, 0, 0, 2].
    """

    code = "SA106"
    live = ("prom", "kernel:tree")
    name = "chain-shape"
    message = "algo {algo} with topk {topk} must be a chain, but node {node} has parent {parent}"

    def check(self, f):
        if f.chain_shaped.all():
            return None
        need = f.is_chain | (f.topk == 1)
        if not need.any():                               # no row must be a chain
            return None
        badn = need[f.node_row] & (f.node_i > 0) & (f.parents != f.node_i - 1)
        node = f.first_node(badn)
        hit = (node >= 0) & f.ok
        par = np.full(f.R, -1, dtype=np.int64)
        par[hit] = f.parents[f.start[hit] + node[hit]]
        return Hits(hit, algo=f.algo, topk=f.topk, node=node, parent=par)

    def fail(self, run):
        s = run.steps_where(lambda s: len(s["parents"]) >= 3)[0]
        s["parents"][2] = 0


class RequiredValues(Rule):
    """What: required columns hold a value in every row (only draft_logprob and
    target_margin may be null), the required lists hold no null value, and algo is
    `chain` or `tree`.

    Why: a null counter or tensor cannot be audited, and a token id lost inside a
    list would otherwise be read as -1; an unknown algo cannot be interpreted.

    Example: commit_len is null on a row; node_tokens is [250, 51, null, 181];
    algo is "medusa".
    """

    code = "SA107"
    name = "required-values"
    message = "{what}"

    def check(self, f):
        # (lists as long as node_tokens share its lengths array: each array tested once)
        lens = {id(a): a for a in (f.lens[c] for c in ("accepted_path", "committed_tokens", "node_tokens",
                                                       "parents", "positions", "target_argmax"))}
        inner = getattr(f, "inner_nulls", {})
        if not f.nulls and not inner and f.algo_known.all() and not any((a < 0).any() for a in lens.values()):
            return None                                  # the usual batch: nothing null
        what = np.full(f.R, "", dtype=object)
        bad = np.zeros(f.R, dtype=bool)
        for c, nl in f.nulls.items():
            what[nl & ~bad] = f"{c} is null"
            bad |= nl
        for c in ("accepted_path", "committed_tokens", "node_tokens", "parents", "positions", "target_argmax"):
            nl = f.lens[c] < 0
            what[nl & ~bad] = f"{c} is null"
            bad |= nl
        for c, nl in inner.items():                     # a value inside a required list
            what[nl & ~bad] = f"{c} holds a null value"
            bad |= nl
        unk = ~f.algo_known
        for i in np.flatnonzero(unk & ~bad):
            what[i] = f"unknown algo {f.algo[i]!r}"
        bad |= unk
        return Hits(bad, what=what)

    def fail(self, run):
        run.steps[4]["commit_len"] = None


class RunIdPartition(Rule):
    """What: every row's run_id is the run of the partition (run_id=<id>/) it is in.

    Why: rows of one run written into another's partition are counted twice or
    against the wrong manifest.

    Example: a row with run_id "r2" in traces/run_id=r1/.
    """

    code = "SA108"
    name = "run-id-partition"
    message = "row has run_id {row_run}, but it is in the partition of run {run}"

    def check(self, f):
        bad = ~f.run_id_ok
        if not bad.any():
            return None
        return Hits(bad, row_run=f.row_run_id, run=f.run_id)

    def fail(self, run):
        run.steps[0]["run_id"] = "someone-else"


class DiagnosticValues(Rule):
    """What: target_margin values are finite and >= 0 (top-1 minus top-2 logit) and
    draft_logprob values are finite and <= 0 (log-probabilities); no null inside a list.

    Why: no counter depends on them, so a writer that corrupts them (a wrong cast, an
    uninitialised buffer, logits where log-probabilities belong) goes unnoticed by every
    other rule, and every calibration plot drawn from them lies. A row group whose
    Parquet statistics already prove the range (min/max) is not decoded; NaN, which
    Parquet statistics leave out, is seen only in the row groups that are decoded.

    Example: target_margin [3.1, -7.2, ...] (a negative margin) or draft_logprob 2.3.
    """

    code = "SA109"
    name = "diagnostic-values"
    severity = "warning"
    message = "{column} holds {value}, outside its range ({want})"

    WANT = {"target_margin": "finite, >= 0: top-1 minus top-2 logit",
            "draft_logprob": "finite, <= 0: a log-probability"}

    def check(self, f):
        if not any(b.any() for b, _ in getattr(f, "diag_bad", {}).values()):
            return None
        bad = np.zeros(f.R, dtype=bool)
        column = np.full(f.R, "", dtype=object)
        value = np.full(f.R, np.nan)
        for c, (b, v) in getattr(f, "diag_bad", {}).items():
            new = b & ~bad
            column[new] = c
            value[new] = v[new]
            bad |= b
        if not bad.any():
            return None
        shown = lambda i: "null or NaN" if np.isnan(value[i]) else f"{value[i]:g}"
        return Hits(bad, column=column, value=shown, want=lambda i: self.WANT[column[i]])

    def fail(self, run):
        s = run.steps_where(lambda s: s.get("target_margin") and len(s["target_margin"]) >= 2)[0]
        s["target_margin"][1] = -7.25
