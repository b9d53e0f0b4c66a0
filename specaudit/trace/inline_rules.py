"""The live rules: the cheap per-step rules of the invariant catalog on one batch of step rows.

Evaluated on every row of every step with numpy over the Arrow buffers (no Python loop
over rows). Their codes and names are the checker's (specaudit.invariants), so a live
violation and `specaudit check` on the same trace name the same rule. The expensive rules (mask hash,
continuity across steps, losslessness, aggregates) stay in the offline checker.

The Prometheus sink (trace/prom_sink.py) counts what `inline_violations` flags as
specaudit_invariant_violations_total{code=...}; `list_parts`, `pad_rows` and `column_np` read
a batch's Arrow columns as numpy for the rules and the sink alike.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from specaudit.trace.schema import tree_depths

# (code, name, what it catches): the step-scope rules of specaudit.invariants that need
# nothing but the row itself, under the checker's own codes and names. Rows whose
# structure is unsound (any SA1xx but SA105/SA106) are skipped by the SA2xx/SA3xx rules,
# as the checker does. Left to the offline checker: SA107 (nulls), SA108 (partition),
# SA311 and SA4xx (need the request's earlier steps), SA5xx (run aggregates).

# The catalog (specaudit.invariants) is the home of these rules: each is marked
# live = ("prom", ...) there. The trace layer may not import the catalog (the trace layer never
# imports readers), so the codes and names are spelled here once more and
# tests/test_one_verdict.py fails when they drift from the catalog's live rules.
INLINE_RULES = (
    ("SA101", "node-list-lengths", "a per-node list does not have N = len(node_tokens) entries"),
    ("SA102", "node-count", "N outside 1..budget + 1"),
    ("SA103", "root-parent", "parents[0] != -1"),
    ("SA104", "parent-precedes", "a parent outside 0..i-1"),
    ("SA105", "topk-children", "a node with more than topk children"),
    ("SA106", "chain-shape", "a chain (or topk 1) whose parents are not i - 1"),
    ("SA201", "positions", "positions[i] != seq_len + depth(i)"),
    ("SA202", "mask-hash", "mask_hash is not the ancestor-or-self mask of the parents"),
    ("SA301", "commit-len-vs-depth", "unfinished commit_len != accepted_depth + 1, or finished above it"),
    ("SA302", "depth-vs-path", "accepted_depth != len(accepted_path) - 1"),
    ("SA303", "path-walk", "accepted_path is not a root-to-node walk of the tree"),
    ("SA304", "path-matches-argmax", "an accepted token differs from the target's argmax at its parent"),
    ("SA305", "path-maximal", "a child of the path's last node carries the bonus token"),
    ("SA306", "commit-len-vs-tokens", "commit_len != len(committed_tokens)"),
    ("SA307", "committed-tokens", "committed_tokens are not the accepted drafts then the bonus"),
    ("SA308", "commit-ends-at-eos", "the commit goes on after an EOS"),
    ("SA309", "eos-finishes", "a commit holding EOS on an unfinished step"),
    ("SA310", "counters-sign", "accepted_depth < 0 or commit_len < 1"),
)
INLINE_CODES = tuple(r[0] for r in INLINE_RULES)
_CHAIN_HASH: dict[int, int] = {}


def list_parts(arr) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A list column -> (flat values int64 [sum L], lengths int64 [B] (-1 when null), starts [B]).

    Works on sliced arrays (flatten honours the slice; null lists hold no values).
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    lens = pc.list_value_length(arr)
    null = lens.is_null().to_numpy(zero_copy_only=False)
    lens = pc.fill_null(lens, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = arr.flatten().to_numpy(zero_copy_only=False)
    flat = np.asarray(flat, dtype=np.int64) if flat.dtype.kind in "iu" else np.asarray(flat)
    starts = np.zeros(len(lens), dtype=np.int64)
    if len(lens) > 1:
        np.cumsum(lens[:-1], out=starts[1:])
    return flat, np.where(null, -1, lens), starts


def column_np(batch, name) -> np.ndarray:
    return batch.column(batch.schema.get_field_index(name)).to_numpy(zero_copy_only=False)


def pad_rows(flat, lens, starts, n_max: int, fill: int = -1) -> np.ndarray:
    """Ragged rows -> [B, n_max] int64 padded with `fill` (longer rows are cut)."""
    B = len(lens)
    out = np.full((B, max(n_max, 1)), fill, dtype=np.int64)
    j = np.arange(out.shape[1])[None, :]
    keep = j < np.minimum(np.maximum(lens, 0), out.shape[1])[:, None]
    out[keep] = flat[(starts[:, None] + j)[keep]]
    return out


def _mask_hashes(P: np.ndarray, n: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Contract hash of the ancestor-or-self mask of each listed row's tree, uint64 [B].

    Chains (the common case) hit a per-N cache; trees are hashed per distinct N. Both
    loop over distinct N, never over rows."""
    from specaudit.trace.schema import ancestor_mask, mask_hash, mask_hash_from_parents
    out = np.zeros(len(n), dtype=np.uint64)
    N = P.shape[1]
    is_chain = (P == np.where(np.arange(N)[None, :] < n[:, None], np.arange(N)[None, :] - 1, -1)).all(axis=1)
    chain = rows[is_chain[rows]]
    for k in np.unique(n[chain]):
        k = int(k)
        if k not in _CHAIN_HASH:
            _CHAIN_HASH[k] = mask_hash_from_parents(np.arange(-1, k - 1))
        out[chain[n[chain] == k]] = _CHAIN_HASH[k]
    tree = rows[~is_chain[rows]]
    for k in np.unique(n[tree]):
        sel = tree[n[tree] == k]
        out[sel] = mask_hash(ancestor_mask(P[sel, :k]))
    return out


def inline_violations(batch: pa.RecordBatch, budget: int | None = None,
                      eos_id: int | None = None) -> dict[str, np.ndarray]:
    """Evaluate the cheap per-step rules on one RecordBatch of STEPS_SCHEMA rows.

    Returns {code: bool [B]} (True = the row breaks the rule), every code of
    INLINE_CODES present. `budget` defaults to the batch's own budget column; the EOS
    rules (SA308, SA309) run only when `eos_id` is known (the manifest's config.eos_id).
    Vectorised: rows are padded to [B, Nmax] (Nmax <= budget + 1) and every rule is a
    few array expressions; the loops run over node index, never over rows.
    """
    B = batch.num_rows
    def col(name):
        return batch.column(batch.schema.get_field_index(name))
    tok, n, tok_s = list_parts(col("node_tokens"))
    par, n_par, par_s = list_parts(col("parents"))
    pos, n_pos, pos_s = list_parts(col("positions"))
    am, n_am, am_s = list_parts(col("target_argmax"))
    path, n_path, path_s = list_parts(col("accepted_path"))
    com, n_com, com_s = list_parts(col("committed_tokens"))
    n = np.maximum(n, 0)
    n_path, n_com = np.maximum(n_path, 0), np.maximum(n_com, 0)
    depth = column_np(batch, "accepted_depth").astype(np.int64)
    commit = column_np(batch, "commit_len").astype(np.int64)
    fin = column_np(batch, "finished").astype(bool)
    seq = column_np(batch, "seq_len").astype(np.int64)
    topk = column_np(batch, "topk").astype(np.int64)
    chain_algo = pc.equal(col("algo"), "chain").to_numpy(zero_copy_only=False).astype(bool)
    bud = (np.full(B, budget, dtype=np.int64) if budget is not None
           else column_np(batch, "budget").astype(np.int64))
    out: dict[str, np.ndarray] = {}
    rows = np.arange(B)
    R = rows[:, None]

    # ---- SA1xx: shapes and tree structure
    lens_bad = (n_par != n) | (n_pos != n) | (n_am != n)
    for name in ("draft_logprob", "target_margin"):
        _, nl, _ = list_parts(col(name))
        lens_bad |= (nl != -1) & (nl != n)
    out["SA101"] = lens_bad
    out["SA102"] = (n < 1) | (n > bud + 1)
    shapes_ok = ~lens_bad & (n >= 1) & (n_path >= 1)
    n_max = max(int(n.max()) if B else 1, 1)
    P = pad_rows(par, n_par, par_s, n_max)
    T = pad_rows(tok, n, tok_s, n_max)
    A = pad_rows(am, n_am, am_s, n_max)
    j = np.arange(n_max)[None, :]
    real = (j < n[:, None]) & shapes_ok[:, None]             # [B, N] nodes of sound rows
    out["SA103"] = (n < 1) | (shapes_ok & (P[:, 0] != -1))
    out["SA104"] = shapes_ok & ((real & (j > 0) & ((P < 0) | (P >= j))).any(axis=1))
    ok = shapes_ok & ~out["SA103"] & ~out["SA104"]            # the checker's `ok`
    okn = real & ok[:, None]
    kids = np.zeros((B, n_max + 1), dtype=np.int64)           # children per node (col n_max: sink)
    np.add.at(kids, (R.repeat(n_max, 1), np.where(okn & (j > 0), P, n_max)), 1)
    out["SA105"] = ok & (kids[:, :n_max].max(axis=1) > topk)
    need_chain = chain_algo | (topk == 1)
    out["SA106"] = ok & need_chain & (okn & (j > 0) & (P != j - 1)).any(axis=1)

    # ---- SA2xx: positions and mask
    D = tree_depths(P, n)
    Pos = pad_rows(pos, n_pos, pos_s, n_max)
    out["SA201"] = ok & (okn & (Pos != seq[:, None] + D)).any(axis=1)
    mh = column_np(batch, "mask_hash").astype(np.uint64)
    want = _mask_hashes(P, n, rows[ok]) if ok.any() else np.zeros(B, dtype=np.uint64)
    out["SA202"] = ok & (mh != want)

    # ---- SA3xx: counters
    out["SA301"] = ok & np.where(fin, commit > depth + 1, commit != depth + 1)
    out["SA302"] = ok & (n_path >= 1) & (depth != n_path - 1)
    out["SA306"] = ok & (commit != n_com)
    out["SA310"] = ok & ((depth < 0) | (commit < 1) | (n_com < 1))

    # ---- SA3xx: the path: [B, Pmax] node indices, -1 padded
    p_max = max(int(n_path.max()) if B else 1, 1)
    Q = pad_rows(path, n_path, path_s, p_max)
    kq = np.arange(p_max)[None, :]
    inpath = kq < n_path[:, None]
    in_range = (Q >= 0) & (Q < n[:, None])
    Qc = np.clip(Q, 0, n_max - 1)
    walk_bad = (inpath & ~in_range).any(axis=1) | (Q[:, 0] != 0) | (n_path < 1)
    if p_max > 1:
        link = inpath[:, 1:] & (P[R, Qc[:, 1:]] != Q[:, :-1])
        walk_bad |= link.any(axis=1)
    out["SA303"] = ok & walk_bad
    path_ok = ok & ~walk_bad
    if p_max > 1:
        mism = inpath[:, 1:] & (A[R, Qc[:, :-1]] != T[R, Qc[:, 1:]])
        out["SA304"] = path_ok & mism.any(axis=1)
    else:
        out["SA304"] = np.zeros(B, dtype=bool)
    last = Qc[rows, np.clip(n_path - 1, 0, p_max - 1)]       # path's last node
    bonus = A[rows, last]
    out["SA305"] = path_ok & (okn & (j > 0) & (P == last[:, None]) & (T == bonus[:, None])).any(axis=1)

    # expected commit: token of path[k+1] for k < len-1, then the bonus
    c_max = max(int(n_com.max()) if B else 1, 1)
    C = pad_rows(com, n_com, com_s, c_max)
    kc = np.arange(c_max)[None, :]
    nxt = Qc[R, np.clip(kc + 1, 0, p_max - 1)]
    exp = np.where(kc < (n_path - 1)[:, None], T[R, nxt], bonus[:, None])
    in_c = kc < n_com[:, None]
    differs = in_c & ((C != exp) | (kc >= n_path[:, None]))
    out["SA307"] = path_ok & (differs.any(axis=1) | (~fin & (n_com < n_path)))

    # ---- SA308, SA309: EOS
    if eos_id is not None:
        is_eos = in_c & (C == eos_id)
        first = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1), -1)
        out["SA308"] = ok & (first >= 0) & (first < n_com - 1)
        out["SA309"] = ok & (first >= 0) & ~fin
    else:
        out["SA308"] = np.zeros(B, dtype=bool)
        out["SA309"] = np.zeros(B, dtype=bool)
    if "accept_u" in batch.schema.names:
        # speculative sampling (contract v2): acceptance is not argmax matching and the
        # commit ends with the drawn token; `specaudit check` (SA8xx) audits these rows
        sampled = col("accept_u").is_valid().to_numpy(zero_copy_only=False)
        for c in ("SA304", "SA305", "SA307"):
            out[c] = out[c] & ~sampled
    return {c: out[c] for c in INLINE_CODES}
