"""The clean-batch screen: a batch of steps that no step rule would report on, folded into
the carry and the run sums in one compiled pass, without building its StepFrame.

Most batches of a healthy run are clean, and a StepFrame spends most of its time on what
a finding needs (rows sorted by request and step, every column gathered in that order,
per-row arrays each rule reads). The screen (invariants/screen_kernels.c) walks the batch
in its own order instead, each row against its request's carried state (a sink writes
each request's steps in order), and tests every row against what the step rules SA101-
SA311 and SA401-SA404 demand, stricter where that is simpler (see the C file). Either
every row passes, and the batch is folded into the carry and the run sums exactly as
StepFrame.finish_carry and RunSums.add fold it, or the carry is put back as it was and
the batch is checked in full: a batch with a finding is always checked by StepFrame,
which is the definition. tests/test_screen.py holds the findings, run sums and request
findings equal with and without the screen on every rule's fixtures and on faults
injected at random.

A batch is not screened (None, nothing changed) when it has fewer rows than the compiled
kernels' MIN_ROWS, or the kernels are off (SPECAUDIT_COMPILED=0) or SPECAUDIT_SCREEN=0,
or it is not the usual kind: a step rule outside SCREENED selected (a user's rule), any
null, a type other than the contract's, sampling or diagnostic columns present, more
than one run_id or algo value, N above MAX_NODES.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from specaudit.trace.schema import MAX_NODES, NODE_LIST_COLUMNS, SAMPLING_COLUMNS

from . import compiled
from .arrow import to_np
from .frame_diagnostics import DIAGNOSTIC_RANGES
from .frame_link import _FOLDED
from .frame_read import SORT_KERNELS
from .frame_sampling import SAMPLING_SUM_KEYS
from .frame_shapes import TreeShapes, tree_hash
from .request_ids import arrow_encoded
from .row_groups import group_rows

ENV = "SPECAUDIT_SCREEN"
KERNELS = "specaudit.invariants.screen_kernels"
# the step rules the screen vouches for: a batch it passes holds no finding of theirs
# (SA800-SA803 need sampling columns and SA109 diagnostic ones: batches with them are
# not screened, so those rules are silent on every batch it passes)
SCREENED = frozenset({
    "SA101", "SA102", "SA103", "SA104", "SA105", "SA106", "SA107", "SA108", "SA109",
    "SA201", "SA202", "SA301", "SA302", "SA303", "SA304", "SA305", "SA306", "SA307", "SA308",
    "SA309", "SA310", "SA311", "SA401", "SA402", "SA403", "SA404", "SA800", "SA801", "SA802", "SA803"})
_INTS = ("step", "seq_len", "budget", "topk", "accepted_depth", "commit_len")
_LISTS = (*NODE_LIST_COLUMNS, "accepted_path", "committed_tokens")
_STRINGS = ("request_id", "run_id", "algo")
_OTHER = (("batch_size", None), ("finished", pa.bool_()), ("mask_hash", pa.uint64()))   # (None: any type)
_REFUSE = frozenset((*SAMPLING_COLUMNS, *DIAGNOSTIC_RANGES))
_LIST32 = pa.list_(pa.int32())


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def covers(step_rules) -> bool:
    """Every selected step rule is one the screen vouches for (built-in codes: a user's
    rule cannot take one, invariants/base.py refuses a code defined twice)."""
    return all(r.code in SCREENED for r in step_rules)


def screen_batch(batch, *, run_id: str, carry, eos_id: int, max_new_tokens: int | None):
    """Screen one record batch: ({counter: int}, depth histogram) as RunSums.add would add
    for it, the batch folded into `carry`; or None (the carry unchanged): check it in full."""
    R = batch.num_rows
    kern = compiled.kernels(KERNELS, rows=R) if enabled() else None
    if kern is None or (max_new_tokens is not None and max_new_tokens < 0):
        return None
    col = _columns(batch, run_id)
    if col is None:
        return None
    algo = col.pop("algo")
    o_tok = col["node_tokens"][0]
    N = int(o_tok[1] - o_tok[0])
    if N < 1 or N > MAX_NODES:
        return None
    tree = algo == "tree"
    z32 = np.zeros(N + 1, dtype=np.int32)
    shapes = (np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.uint64), z32, z32, z32, z32, z32)  # (chains: unused)
    if tree:
        shapes = _shapes(col["parents"], R, N)
        if shapes is None:
            return None
    chain_hash = int(TreeShapes._chain_hash(np.array([N]))[0])
    # request ids -> carry slots as StepFrame names them (the null slot included), then rows
    rid = col.pop("request_id")
    gidx = carry.index(*_names(rid.dictionary))
    # carry rows of the ids only (no row has a null id): the null slot's page is not
    # touched, so a paged carry keeps the pages of the requests in flight, as StepFrame does
    crow = np.ascontiguousarray(carry.rows(gidx[:-1]), dtype=np.int64)
    fields = [getattr(carry, k) for k in _FOLDED]
    saved = [a[crow] for a in fields]               # put back if a row does not pass
    sums = np.zeros(8, dtype=np.uint64)
    hist = np.zeros(MAX_BIN + 1, dtype=np.int64)
    lists = [a for name in _LISTS for a in col[name]]
    bad = kern.screen_rows(R, N, int(tree), eos_id, -1 if max_new_tokens is None else max_new_tokens,
                           np.uint64(chain_hash), col["codes"], crow, *(col[k] for k in _INTS),
                           col["finished"], col["mask_hash"], *lists, *shapes, *fields, sums, hist)
    if bad:
        for a, v in zip(fields, saved):
            a[crow] = v                                 # (a row listed twice: the same value)
        return None
    carry.trim()                                    # a paged carry: old pages out (as finish_carry)
    vals = dict(zip(SUM_KEYS, sums.view(np.int64).tolist()))
    vals.update(dict.fromkeys(SAMPLING_SUM_KEYS, 0))
    used = np.flatnonzero(hist)
    return vals, hist[: (used[-1] if used.size else 0) + 1]


MAX_BIN = 4096   # the depth histogram's last bin, as RunSums.depth_bins clips
# RunSums' counters in the order both C passes write them (screen_kernels.c and
# specaudit/audit/check/sums_kernels.c, whose wrapper takes this layout from here)
SUM_KEYS = ("drafted", "accepted", "accepted_counter", "committed", "commit_len_sum", "width_sum", "refused",
            "steps")


_NULL_SLOT = "\0null"   # StepFrame names the null request id's slot so (frame_read.sort_rows)


def _names(dictionary) -> tuple[list | None, tuple | None]:
    """carry.index's arguments for a batch's request id dictionary, the null slot's name
    last (as StepFrame asks, so slots are numbered alike): the UTF-8 bytes read from the
    Arrow buffers, no str made per id (RequestIds hashes the bytes)."""
    enc = arrow_encoded(dictionary)
    if enc is None:
        return dictionary.to_pylist() + [_NULL_SLOT], None
    blob, off = enc
    tail = np.frombuffer(_NULL_SLOT.encode(), dtype=np.uint8)
    return None, (np.concatenate([blob, tail]), np.append(off, off[-1] + len(tail)))


def _columns(batch, run_id: str) -> dict | None:
    """The batch's columns as the kernel reads them (numpy views of the Arrow buffers:
    to_np, not pyarrow's to_numpy, which imports pandas on first use), or None when it is
    not the usual kind."""
    names = batch.schema.names
    if _REFUSE.intersection(names):
        return None
    col = {n: batch.column(i) for i, n in enumerate(names)}
    need = (*_INTS, *_LISTS, *_STRINGS, *(n for n, _ in _OTHER))
    if any(n not in col or col[n].null_count for n in need):
        return None
    out = {}
    for n in _STRINGS:
        a = col[n]
        if not pa.types.is_dictionary(a.type) or not pa.types.is_string(a.type.value_type) or \
                a.type.index_type != pa.int32() or a.dictionary.null_count:
            return None
    for n in ("run_id", "algo"):                    # one value in the batch (its dictionary's only one)
        d = col[n].dictionary
        if len(d) != 1:
            return None
    if col["run_id"].dictionary[0].as_py() != run_id:
        return None
    algo = col["algo"].dictionary[0].as_py()
    if algo not in ("chain", "tree"):
        return None
    out["algo"] = algo
    out["request_id"] = col["request_id"]
    out["codes"] = to_np(col["request_id"].indices)
    for n in _INTS:
        if col[n].type != pa.int32():
            return None
        out[n] = to_np(col[n])
    for n in _LISTS:
        a = col[n]
        if a.type != _LIST32 or a.values.null_count:
            return None
        out[n] = (to_np(a.offsets), to_np(a.values))
    if any(t is not None and col[n].type != t for n, t in _OTHER):
        return None
    out["finished"] = to_np(col["finished"]).view(np.uint8)
    out["mask_hash"] = to_np(col["mask_hash"])
    return out


def _shapes(parents, R: int, N: int):
    """A tree batch's rows grouped by their parents (rows of one shape have equal parents:
    invariants/row_groups.py) -> (shape id [R], per shape: mask hash [U], node depths
    [U, N] flat, most children of a node [U], parents [U, N] flat, each node's children as
    offsets [U, N + 1] into child lists [U, N] (ascending), all flat), or None when the
    parents are not R rows of N (the kernel refuses a row of another length) or a shape
    is not a tree."""
    off, v = parents
    lo = int(off[0])
    if len(v) - lo < R * N:
        return None
    P = v[lo: lo + R * N].reshape(R, N)
    ids, first = group_rows(P, compiled.kernels(SORT_KERNELS, rows=R))
    S = P[first].astype(np.int64)                         # [U, N] the shapes
    U, i = len(first), np.arange(N)
    if (S[:, 0] != -1).any() or ((S[:, 1:] < 0) | (S[:, 1:] >= i[1:])).any():
        return None                                       # SA103 / SA104: the frame reports it
    depth = np.zeros((U, N), dtype=np.int32)
    for j in range(1, N):                                 # parents come first: one pass
        depth[:, j] = depth[np.arange(U), S[:, j]] + 1
    kids = np.zeros((U, N), dtype=np.int32)
    np.add.at(kids, (np.repeat(np.arange(U), N - 1), S[:, 1:].reshape(-1)), 1)
    hashes = np.array([tree_hash(s) for s in S], dtype=np.uint64)
    # child lists: nodes 1..N-1 of each shape ordered by parent (stable: ascending within one)
    child = np.zeros((U, N), dtype=np.int32)
    child[:, : N - 1] = np.argsort(S[:, 1:], axis=1, kind="stable") + 1
    off = np.zeros((U, N + 1), dtype=np.int32)
    np.cumsum(kids, axis=1, out=off[:, 1:])
    return (np.ascontiguousarray(ids, dtype=np.int64), hashes, depth.reshape(-1), kids.max(axis=1),
            S.astype(np.int32).reshape(-1), off.reshape(-1), child.reshape(-1))
