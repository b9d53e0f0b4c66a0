"""Synthetic, contract-valid trace rows from the reference semantics, vectorised.

No model: every step is built the way the contract defines it, so every invariant
holds by construction, and a test or benchmark can make any number of steps fast.

    steps, requests, manifest = synth_run_rows(n_requests=8, algo="tree", seed=1)
    run_dir = write_synthetic_dataset("traces/", n_steps=1_000_000, n_nodes=8)

Semantics (docs/trace-contract.md, rules 1-9):
  - each step draws a draft shape: a chain of N nodes, or one of a few random trees
    with at most `topk` children per node (ragged N when `ragged`);
  - it picks the accepted path's last node (depth ~ geometric(accept_p)), so the path
    is root -> last; node tokens are chosen so that siblings differ, the target's
    argmax along the path names the next path node, and the bonus (argmax at the
    last node) differs from every child of the last node (the path is maximal);
  - the commit is the accepted drafts then the bonus; a request ends at the token
    limit (the last commit cut to fit) or at an EOS placed inside a commit (drafts
    after it may still be on the accepted path; the commit stops at it);
  - seq_len starts at the prompt length and grows by each commit; the next root is
    the last committed token; positions are seq_len + depth; mask_hash is the hash of
    the ancestor-or-self mask;
  - `reported` is computed from the rows under the declared `conventions`.
Rows are ordered as continuous batching at `concurrency` would write them.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from specaudit.trace.derived import bonus, means
from specaudit.trace.schema import (
    DEFAULT_CONVENTIONS,
    REQUESTS_SCHEMA,
    SCHEMA_VERSION,
    STEPS_SCHEMA,
    ancestor_mask,
    mask_hash,
    tree_depths,
)

# ------------------------------------------------------------------- templates


class _Templates:
    """A small set of draft shapes, padded to M = max nodes, with per-node facts.

    n [T], parents/depth/rank [T, M], anc [T, M, M] (anc[t, i, k] = the node at
    depth k on the root->i path, -1 past depth(i)), by_depth [T, M, M] (nodes at each
    depth, -1 padded) with count [T, M], mask_hash [T].
    """

    def __init__(self, parents_list: list[np.ndarray]):
        T = len(parents_list)
        M = max(len(p) for p in parents_list)
        self.n = np.array([len(p) for p in parents_list], dtype=np.int64)
        self.parents = np.full((T, M), -1, dtype=np.int64)
        for t, p in enumerate(parents_list):
            self.parents[t, : len(p)] = p
        self.depth = tree_depths(self.parents)
        self.rank = np.zeros((T, M), dtype=np.int64)  # index among siblings
        self.anc = np.full((T, M, M), -1, dtype=np.int64)
        self.by_depth = np.full((T, M, M), -1, dtype=np.int64)
        self.count = np.zeros((T, M), dtype=np.int64)
        self.max_depth = np.zeros(T, dtype=np.int64)
        self.mask_hash = np.zeros(T, dtype=np.uint64)
        for t, p in enumerate(parents_list):
            n = len(p)
            seen: dict[int, int] = {}
            for i in range(1, n):
                self.rank[t, i] = seen.get(int(p[i]), 0)
                seen[int(p[i])] = self.rank[t, i] + 1
            for i in range(n):
                path, j = [], i
                while j >= 0:
                    path.append(j)
                    j = int(p[j]) if j > 0 else -1
                path.reverse()
                self.anc[t, i, : len(path)] = path
                d = len(path) - 1
                self.by_depth[t, d, self.count[t, d]] = i
                self.count[t, d] += 1
            self.max_depth[t] = self.depth[t, :n].max()
            self.mask_hash[t] = mask_hash(ancestor_mask(np.asarray(p, dtype=np.int64)))


def _random_tree(rng, n: int, topk: int) -> np.ndarray:
    """Parents of a random tree of n nodes, parents[i] < i, at most topk children each,
    biased deep (as best-first trees are)."""
    parents = [-1]
    kids = [0]
    for i in range(1, n):
        cand = [j for j in range(i) if kids[j] < topk]
        # prefer recent nodes: deeper trees
        w = np.arange(1, len(cand) + 1, dtype=float) ** 2
        j = cand[int(rng.choice(len(cand), p=w / w.sum()))]
        parents.append(j)
        kids[j] += 1
        kids.append(0)
    return np.asarray(parents, dtype=np.int64)


def make_templates(rng, algo: str, budget: int, topk: int, ragged: bool,
                   n_trees: int = 16) -> _Templates:
    Nmax = budget + 1
    sizes = list(range(2, Nmax + 1)) if ragged else [Nmax]
    shapes = []
    for n in sizes:
        if algo == "chain" or topk == 1:
            shapes.append(np.arange(-1, n - 1, dtype=np.int64))
        else:
            seen = set()
            for _ in range(n_trees):
                p = _random_tree(rng, n, topk)
                if tuple(p) not in seen:
                    seen.add(tuple(p))
                    shapes.append(p)
    return _Templates(shapes)


# ----------------------------------------------------------------------- core


def _dom(k: np.ndarray, eos_id: int) -> np.ndarray:
    """Map k in [0, V-1) onto the token ids other than EOS."""
    return np.where(k < eos_id, k, k + 1)


def _list(offsets: np.ndarray, values: np.ndarray, typ) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()),
                                    pa.array(values, typ.value_type))


def _gen(rng, R: int, *, tm: _Templates, max_new_tokens: int, eos_frac: float, vocab: int,
         eos_id: int, accept_p: float, concurrency: int, run_id: str, req_offset: int,
         t0: float, zero_step_frac: float):
    """R requests -> (steps RecordBatch-ready dict, requests dict, per-request facts)."""
    M_out = max_new_tokens
    if M_out < 2:
        raise ValueError("synth needs max_new_tokens >= 2")
    D = vocab - 1                       # token ids other than EOS
    K = M_out - 1                       # most steps a request can take
    T = len(tm.n)
    topk_eff = int(tm.rank.max()) + 1

    # --- per (request, potential step) draws: template, accepted depth, last node [R, K]
    tmpl = rng.integers(0, T, size=(R, K))
    # geometric accepted depth, truncated at the template's deepest node
    g = rng.geometric(1.0 - accept_p, size=(R, K)) - 1 if accept_p > 0 else np.zeros((R, K), np.int64)
    depth = np.minimum(g, tm.max_depth[tmpl])
    cnt = tm.count[tmpl, depth]
    pick = (rng.random((R, K)) * cnt).astype(np.int64)
    last = tm.by_depth[tmpl, depth, pick]                      # [R, K] node index
    full_len = depth + 1                                       # commit before any cut
    out_after = 1 + np.cumsum(full_len, axis=1)                # output length after step k
    # steps in "length" mode: the first k with out_after >= M_out ends the request
    k_len = (out_after < M_out).sum(1) + 1                     # [R] step count
    k_len = np.minimum(k_len, K)
    before_last = np.where(k_len > 1, np.take_along_axis(out_after, (k_len - 2)[:, None], 1)[:, 0], 1)
    cut_last = M_out - before_last                             # tokens the last step may commit
    # "eos" mode: end at a random step e <= last, EOS at commit index j
    eos_mode = rng.random(R) < eos_frac
    e = np.minimum((rng.random(R) * k_len).astype(np.int64), k_len - 1)
    n_steps = np.where(eos_mode, e + 1, k_len)
    d_end = np.take_along_axis(depth, (n_steps - 1)[:, None], 1)[:, 0]
    room = np.where(n_steps == k_len, np.minimum(cut_last, d_end + 1), d_end + 1)
    j_eos = np.minimum((rng.random(R) * room).astype(np.int64), room - 1)
    last_commit = np.where(eos_mode, j_eos + 1, np.minimum(cut_last, d_end + 1))
    # a few requests end at prefill (first token is EOS): no steps
    zero = rng.random(R) < zero_step_frac
    n_steps = np.where(zero, 0, n_steps)

    # --- expand to step rows, grouped by request then step
    S = int(n_steps.sum())
    req = np.repeat(np.arange(R), n_steps)
    sstart = np.concatenate(([0], np.cumsum(n_steps)))
    step = np.arange(S) - np.repeat(sstart[:-1], n_steps)
    t_s = tmpl[req, step]
    d_s = depth[req, step]
    last_s = last[req, step]
    is_last = step == (n_steps[req] - 1)
    commit_len = np.where(is_last, last_commit[req], d_s + 1)
    eos_at = np.where(is_last & eos_mode[req], j_eos[req], -1)   # commit index of EOS or -1
    n_s = tm.n[t_s]

    # --- nodes, flat [Tn]
    nstart = np.concatenate(([0], np.cumsum(n_s)))
    Tn = int(nstart[-1])
    node_row = np.repeat(np.arange(S), n_s)
    node_i = np.arange(Tn) - nstart[node_row]
    node_t = t_s[node_row]
    par = tm.parents[node_t, node_i]
    ndep = tm.depth[node_t, node_i]
    rank = tm.rank[node_t, node_i]
    base = rng.integers(0, D, size=Tn)                        # each node's children start here
    par_flat = np.where(par >= 0, nstart[node_row] + par, 0)
    tokk = (base[par_flat] + rank) % D
    tokens = _dom(tokk, eos_id)
    argmax = _dom(rng.integers(0, D, size=Tn), eos_id)
    # path: root -> last, flat [P]
    plen = d_s + 1
    pstart = np.concatenate(([0], np.cumsum(plen)))
    prow = np.repeat(np.arange(S), plen)
    pk = np.arange(int(pstart[-1])) - pstart[prow]
    path = tm.anc[t_s[prow], last_s[prow], pk]
    parent_flat = nstart[prow] + path
    # along the path the target's argmax names the next path node
    nxt = np.flatnonzero(pk < d_s[prow])                      # path entries with a successor
    argmax[parent_flat[nxt]] = tokens[parent_flat[nxt + 1]]
    # bonus: differs from every child of the last node (maximal path)
    lastg = nstart[:-1] + last_s
    u = rng.integers(0, max(D - topk_eff, 1), size=S)
    bonus = _dom((base[lastg] + topk_eff + u) % D, eos_id)
    argmax[lastg] = bonus
    # EOS inside the commit: the draft at commit index j (or the bonus) is EOS
    has_eos = eos_at >= 0
    mid = has_eos & (eos_at < d_s)
    # commit index j is path node j+1; its parent path node j sees argmax = EOS
    tok_node = pstart[:-1] + eos_at + 1                       # index into path of node j+1
    tokens[parent_flat[tok_node[mid]]] = eos_id
    argmax[parent_flat[tok_node[mid] - 1]] = eos_id
    end = has_eos & (eos_at == d_s)
    argmax[lastg[end]] = eos_id
    bonus = argmax[lastg]
    # commit: path tokens after the root, then the bonus, cut to commit_len
    exp_tok = np.empty(int(pstart[-1]), dtype=np.int64)      # commit index k = path entry k+1
    exp_tok[nxt] = tokens[parent_flat[nxt + 1]]
    tail = pk == d_s[prow]
    exp_tok[tail] = bonus[prow[tail]]
    keep = pk < commit_len[prow]
    commit = exp_tok[keep]
    cstart = np.concatenate(([0], np.cumsum(commit_len)))
    last_tok = commit[cstart[1:] - 1] if S else np.zeros(0, np.int64)

    # --- requests: prompt, first token, output
    prompt_len = rng.integers(4, 48, size=R)
    first = _dom(rng.integers(0, D, size=R), eos_id)
    first = np.where(zero, eos_id, first)
    # roots: the previous commit's last token, or the first token
    root = np.empty(S, dtype=np.int64)
    root[step == 0] = first[req[step == 0]]
    later = step > 0
    root[later] = last_tok[np.flatnonzero(later) - 1]
    tokens[nstart[:-1]] = root
    # seq_len: the prompt, then every commit
    cum = np.cumsum(commit_len) - commit_len                  # exclusive, global
    seq_len = prompt_len[req] + cum - cum[sstart[:-1][req]]
    positions = seq_len[node_row] + ndep

    out_len = 1 + np.bincount(req, weights=commit_len, minlength=R).astype(np.int64)
    finish = np.where(zero | eos_mode, "eos", "length")
    # a length-ended request whose cut commit happens to end at its token limit with
    # an EOS is still "eos" (the runtime's rule); eos_mode already covers those

    # --- row order: continuous batching in waves of `concurrency` requests
    wave = np.arange(R) // max(concurrency, 1)
    wmax = np.zeros(wave.max() + 1 if R else 0, dtype=np.int64)
    np.maximum.at(wmax, wave, n_steps)
    wstart = np.concatenate(([0], np.cumsum(wmax)))[:-1]
    tick = wstart[wave[req]] + step
    order = np.lexsort((req, tick))
    batch = np.bincount(tick, minlength=int(tick.max()) + 1 if S else 0)[tick] if S else tick

    lp = -rng.exponential(1.0, size=Tn).astype(np.float32)
    lp[nstart[:-1]] = 0.0
    margin = rng.exponential(2.0, size=Tn).astype(np.float32)
    t_start = t0 + tick * 0.01

    steps = dict(req=req, step=step, n=n_s, nstart=nstart, node_row=node_row, tokens=tokens,
                 parents=par, positions=positions, argmax=argmax, lp=lp, margin=margin,
                 path=path, pstart=pstart, depth=d_s, commit=commit, cstart=cstart,
                 commit_len=commit_len, finished=is_last, seq_len=seq_len,
                 mask_hash=tm.mask_hash[t_s], batch=batch, t_start=t_start, order=order)
    # outputs: first token then the commits, request by request
    ostart = np.concatenate(([0], np.cumsum(out_len)))
    outputs = np.empty(int(ostart[-1]), dtype=np.int64)
    outputs[ostart[:-1]] = first
    rest = np.ones(len(outputs), dtype=bool)
    rest[ostart[:-1]] = False
    outputs[rest] = commit                                   # commits are grouped by request
    prompts = _dom(rng.integers(0, D, size=int(prompt_len.sum())), eos_id)
    pr_start = np.concatenate(([0], np.cumsum(prompt_len)))
    end_t = t0 + (wstart[wave] + n_steps) * 0.01 if R else np.zeros(0)
    requests = dict(rid=np.arange(R) + req_offset, prompts=prompts, pr_start=pr_start, first=first,
                    outputs=outputs, ostart=ostart, finish=finish,
                    ttft=np.full(R, 0.005), e2e=end_t - (t0 + wstart[wave] * 0.01) + 0.005)
    return steps, requests, n_steps


def _steps_table(s: dict, run_id: str, algo: str, budget: int, topk: int, req_offset: int) -> pa.Table:
    i32, f32 = pa.list_(pa.int32()), pa.list_(pa.float32())
    S = len(s["step"])
    cols = {
        "run_id": pa.array(np.full(S, run_id, dtype=object), pa.string()),
        "request_id": pa.array((s["req"] + req_offset).astype(str), pa.string()),
        "step": pa.array(s["step"].astype(np.int32)),
        "algo": pa.array(np.full(S, algo, dtype=object), pa.string()),
        "budget": pa.array(np.full(S, budget, np.int32)),
        "topk": pa.array(np.full(S, topk, np.int32)),
        "batch_size": pa.array(s["batch"].astype(np.int32)),
        "seq_len": pa.array(s["seq_len"].astype(np.int32)),
        "node_tokens": _list(s["nstart"], s["tokens"].astype(np.int32), i32),
        "parents": _list(s["nstart"], s["parents"].astype(np.int32), i32),
        "positions": _list(s["nstart"], s["positions"].astype(np.int32), i32),
        "mask_hash": pa.array(s["mask_hash"], pa.uint64()),
        "draft_logprob": _list(s["nstart"], s["lp"], f32),
        "target_argmax": _list(s["nstart"], s["argmax"].astype(np.int32), i32),
        "target_margin": _list(s["nstart"], s["margin"], f32),
        "accepted_path": _list(s["pstart"], s["path"].astype(np.int32), i32),
        "accepted_depth": pa.array(s["depth"].astype(np.int32)),
        "commit_len": pa.array(s["commit_len"].astype(np.int32)),
        "committed_tokens": _list(s["cstart"], s["commit"].astype(np.int32), i32),
        "finished": pa.array(s["finished"]),
        "t_start": pa.array(s["t_start"]),
        "draft_s": pa.array(np.full(S, 0.002)),
        "verify_s": pa.array(np.full(S, 0.006)),
        "step_s": pa.array(np.full(S, 0.01)),
    }
    t = pa.table([cols[c] for c in STEPS_SCHEMA.names], schema=STEPS_SCHEMA)
    return t.take(pa.array(s["order"])) if S else t


def _requests_table(q: dict, run_id: str, oracle: bool) -> pa.Table:
    i32 = pa.list_(pa.int32())
    R = len(q["rid"])
    out = _list(q["ostart"], q["outputs"].astype(np.int32), i32)
    return pa.table({
        "run_id": pa.array([run_id] * R, pa.string()),
        "request_id": pa.array(q["rid"].astype(str), pa.string()),
        "prompt_tokens": _list(q["pr_start"], q["prompts"].astype(np.int32), i32),
        "first_token": pa.array(q["first"].astype(np.int32)),
        "output_tokens": out,
        "finish_reason": pa.array(q["finish"].tolist(), pa.string()),
        "reference_tokens": out if oracle else pa.nulls(R, i32),
        "ttft_s": pa.array(q["ttft"].astype(np.float64)),
        "e2e_s": pa.array(q["e2e"].astype(np.float64)),
    }, schema=REQUESTS_SCHEMA)


class _Acc:
    """Running sums for `reported`, across chunks."""

    def __init__(self, budget: int):
        self.steps = self.drafted = self.accepted = self.committed = self.generated = 0
        self.req_n, self.req_depth, self.req_commit = [], [], []   # per request with steps: [R] steps, sums
        self.by_depth = np.zeros(max(budget, 1), dtype=np.int64)  # steps with depth >= d+1

    def add(self, s: dict, n_steps: np.ndarray, out_len_total: int) -> None:
        S = len(s["step"])
        self.steps += S
        self.drafted += int((s["n"] - 1).sum())
        self.accepted += int(s["depth"].sum())
        self.committed += int(s["commit_len"].sum())
        self.generated += out_len_total
        has = n_steps > 0
        st = np.concatenate(([0], np.cumsum(n_steps)))[:-1][has]
        if S:
            self.req_n.append(n_steps[has])
            self.req_depth.append(np.add.reduceat(s["depth"], st))
            self.req_commit.append(np.add.reduceat(s["commit_len"], st))
            d = np.bincount(s["depth"], minlength=len(self.by_depth) + 1)
            self.by_depth += np.cumsum(d[::-1])[::-1][1: len(self.by_depth) + 1]

    def reported(self, conventions: dict, wall_s: float) -> dict:
        S = max(self.steps, 1)
        # the rows are honest (depth = len(accepted_path) - 1, commit_len = len(committed_tokens)),
        # so `reported` is the derived means under the declared conventions (0 for a run without steps)
        cat = (lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64))
        m = means(cat(self.req_n), cat(self.req_depth), cat(self.req_commit), conventions)
        md, mc = m["mean_accepted_depth"] or 0.0, m["mean_commit_len"] or 0.0
        acc_len = md + bonus(conventions)
        return {
            "verify_steps": self.steps, "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted, "committed_tokens": self.committed,
            "generated_tokens": self.generated, "mean_accepted_depth": md, "mean_commit_len": mc,
            "gen_throughput_tps": self.generated / wall_s if wall_s > 0 else 0.0, "wall_s": wall_s,
            "mean_accept_length": acc_len,
            "accept_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "acceptance_by_depth": (self.by_depth / S).tolist(),
        }


def _manifest(run_id, algo, budget, topk, concurrency, max_new_tokens, eos_id, seed, conventions,
              started, finished, reported) -> dict:
    return {
        "schema_version": SCHEMA_VERSION, "run_id": run_id,
        "engine": {"name": "specaudit-synth", "version": "1"},
        "models": {"target": {"name": "synthetic", "sha256": None},
                   "drafter": {"name": "synthetic", "sha256": None}},
        "config": {"algo": algo, "budget": budget, "topk": topk,
                   "block_size": budget + 1 if algo == "chain" else None,
                   "concurrency": concurrency, "max_new_tokens": max_new_tokens, "dtype": "none",
                   "device": "none", "seed": seed, "fault": None, "eos_id": eos_id, "oracle": True},
        "conventions": dict(conventions),
        "host": {"hostname": "synthetic"}, "started_at": started, "finished_at": finished,
        "reported": reported,
    }


def _norm(algo, budget, topk, n_nodes):
    if n_nodes is not None:
        budget = n_nodes - 1
    if topk is None:
        topk = 1 if algo == "chain" else min(3, budget)
    if algo == "chain" and topk != 1:
        raise ValueError("a chain has topk 1")
    if budget < 1 or topk < 1 or topk > budget:
        raise ValueError(f"bad budget/topk: {budget}/{topk}")
    return budget, topk


def synth_run_rows(n_requests: int = 8, *, algo: str = "chain", budget: int = 7, topk: int | None = None,
                   n_nodes: int | None = None, ragged: bool = False, max_new_tokens: int = 48,
                   eos_frac: float = 0.5, vocab: int = 256, eos_id: int = 0, accept_p: float = 0.7,
                   concurrency: int = 4, seed: int = 0, run_id: str = "synth",
                   conventions: dict | None = None, zero_step_frac: float = 0.05,
                   oracle: bool = True, n_trees: int = 16):
    """One valid run in memory -> (steps pa.Table, requests pa.Table, manifest dict).

    n_nodes overrides budget (budget = n_nodes - 1). ragged: N varies per step in
    2..budget+1. conventions: {"accept_length": ..., "mean": ...} used for `reported`.
    """
    budget, topk = _norm(algo, budget, topk, n_nodes)
    conventions = {**DEFAULT_CONVENTIONS, **(conventions or {})}
    rng = np.random.default_rng(seed)
    tm = make_templates(rng, algo, budget, topk, ragged, n_trees)
    t0 = 1.7e9
    s, q, n_steps = _gen(rng, n_requests, tm=tm, max_new_tokens=max_new_tokens, eos_frac=eos_frac,
                         vocab=vocab, eos_id=eos_id, accept_p=accept_p, concurrency=concurrency,
                         run_id=run_id, req_offset=0, t0=t0, zero_step_frac=zero_step_frac)
    acc = _Acc(budget)
    acc.add(s, n_steps, int(len(q["outputs"])))
    wall = float(s["t_start"].max() + 0.01 - t0) if len(s["step"]) else 0.01
    manifest = _manifest(run_id, algo, budget, topk, concurrency, max_new_tokens, eos_id, seed,
                         conventions, t0, t0 + wall, acc.reported(conventions, wall))
    return (_steps_table(s, run_id, algo, budget, topk, 0), _requests_table(q, run_id, oracle), manifest)


def write_run(out, steps: pa.Table, requests: pa.Table | None, manifest: dict,
              row_group_size: int = 65536, n_files: int = 1, rollups: bool = False) -> Path:
    """Write one run's partition (dataset/run_id=<id>/) from in-memory tables; rollups:
    also each file's rollup, written as the Parquet sink writes them."""
    from specaudit.trace.parquet import write_with_rollup
    run_dir = Path(out) / f"run_id={manifest['run_id']}"
    run_dir.mkdir(parents=True, exist_ok=True)
    per = -(-steps.num_rows // max(n_files, 1)) if steps.num_rows else 0
    for i in range(max(n_files, 1)):
        part = steps.slice(i * per, per) if per else steps
        write_with_rollup(run_dir / f"steps-{i:06d}.parquet", part, row_group_size, rollups=rollups)
    if requests is not None:
        write_with_rollup(run_dir / "requests.parquet", requests, what="requests", rollups=rollups)
    (run_dir / "run.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return run_dir


def write_synthetic_dataset(out, n_steps: int, n_nodes: int = 8, algo: str = "chain", seed: int = 0, *,
                            topk: int | None = None, ragged: bool = False, max_new_tokens: int = 64,
                            concurrency: int = 8, eos_id: int = 0, run_id: str | None = None,
                            conventions: dict | None = None, chunk_steps: int = 500_000,
                            row_group_size: int = 65536, compression: str = "zstd",
                            rollups: bool = True) -> Path:
    """Write a large valid run of about n_steps steps, in chunks (bounded memory).

    One steps-<seq>.parquet file per chunk, requests.parquet and run.json with a
    `reported` that matches; rollups: the rollups the Parquet sink writes, by its code
    (trace/rollup.py): the step files' partial sums chunk by chunk, one rollup-steps.parquet
    at the end, and requests.parquet's rollup. Returns the run folder.
    """
    from specaudit.trace.parquet import write_parquet_atomic
    from specaudit.trace.rollup_writer import RollupAccumulator, write_rollup
    budget, topk = _norm(algo, n_nodes - 1, topk, None)
    conventions = {**DEFAULT_CONVENTIONS, **(conventions or {})}
    run_id = run_id or f"synth-{algo}-n{n_nodes}-{n_steps}"
    run_dir = Path(out) / f"run_id={run_id}"
    run_dir.mkdir(parents=True, exist_ok=False)
    rng = np.random.default_rng(seed)
    tm = make_templates(rng, algo, budget, topk, ragged)
    # steps per request ~ max_new_tokens / mean commit; size chunks by a trial
    t0 = 1.7e9
    acc = _Acc(budget)
    roll = RollupAccumulator() if rollups else None
    rq_writer = None
    written, seq, rid, t_cur = 0, 0, 0, t0
    per_req = None
    while written < n_steps:
        want = min(chunk_steps, n_steps - written)
        R = 64 if per_req is None else max(1, int(want / per_req))
        s, q, ns = _gen(rng, R, tm=tm, max_new_tokens=max_new_tokens, eos_frac=0.3, vocab=256,
                        eos_id=eos_id, accept_p=0.7, concurrency=concurrency, run_id=run_id,
                        req_offset=rid, t0=t_cur, zero_step_frac=0.01)
        per_req = max(len(s["step"]) / R, 1e-9)
        acc.add(s, ns, int(len(q["outputs"])))
        tbl = _steps_table(s, run_id, algo, budget, topk, rid)
        path = run_dir / f"steps-{seq:06d}.parquet"
        if compression == "zstd":
            size = write_parquet_atomic(path, tbl, row_group_size)
        else:
            pq.write_table(tbl, path, compression=compression, row_group_size=row_group_size)
            size = path.stat().st_size
        if roll is not None:
            roll.add(path, tbl, size)
        rt = _requests_table(q, run_id, True)
        if rq_writer is None:
            rq_writer = pq.ParquetWriter(run_dir / "requests.parquet", REQUESTS_SCHEMA, compression="zstd")
        rq_writer.write_table(rt)
        written += tbl.num_rows
        seq += 1
        rid += R
        if len(s["t_start"]):
            t_cur = float(s["t_start"].max()) + 0.01
        del s, q, tbl, rt
    if roll is not None:
        roll.write(run_dir)
    if rq_writer is not None:
        rq_writer.close()
        if rollups:   # the requests table was streamed: its rollup reads back the two columns it needs
            path = run_dir / "requests.parquet"
            write_rollup(path, pq.read_table(path, columns=["run_id", "output_tokens"]), path.stat().st_size,
                         what="requests")
    wall = t_cur - t0
    manifest = _manifest(run_id, algo, budget, topk, concurrency, max_new_tokens, eos_id, seed,
                         conventions, t0, t_cur, acc.reported(conventions, wall))
    (run_dir / "run.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return run_dir

