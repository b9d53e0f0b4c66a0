"""Prometheus sink: live counters, histograms and inline invariant checks.

    registry = CollectorRegistry()
    sink = PromSink(registry, max_depth=8)             # one registry per server
    tracer = Tracer([ParquetSink(...), sink], manifest, run_id)
    ...  GET /metrics -> prometheus_client.generate_latest(registry)

A tracer sink: `write_steps(RecordBatch)` runs on the tracer's background thread, once
per batched verify forward (B rows, STEPS_SCHEMA), and `write_request(dict)` once per
finished request. Everything is vectorised over the batch: one `inc()` per family per
forward, never one per row, and every labelled child is created once up front (cached
in lists and dicts), so every series is exported as 0 from the first scrape.

Naming (Prometheus conventions): `specaudit_` prefix, base units (seconds), `_total`
on counters, no per-request labels; the only labels are `depth` (1..max_depth, bounded:
deeper values count in the last one), `code` (the inline rules below) and
`finish_reason` (eos, length, abort).

Reported against derived: `specaudit_committed_tokens_total` and
`specaudit_accepted_tokens_total` sum the engine's own counters (commit_len,
accepted_depth: the numbers under audit); the `specaudit_derived_*` twins count the
same thing from the recorded tokens and path (len(committed_tokens), len(path) - 1).
They agree on an honest engine; a gap is a metrics bug, live.

Inline rules: the cheap per-step rules of the invariant catalog, evaluated on every
row of every step with numpy over the Arrow buffers (no Python loop over rows). Their
codes and names are the checker's (specaudit.invariants), so a live violation and
`specaudit check` on the same trace name the same rule. The expensive rules (mask hash,
continuity across steps, losslessness, aggregates) stay in the offline checker.
"""
from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# --------------------------------------------------------------------- inline rules

# (code, name, what it catches). Same codes as the offline checker.
INLINE_RULES = (
    ("SA101", "node-list-lengths", "a per-node list does not have N entries, or N > budget + 1"),
    ("SA201", "path-starts-at-root", "accepted_path is empty or does not start at node 0"),
    ("SA202", "path-follows-tree", "an accepted_path entry is not a child of the one before"),
    ("SA203", "path-matches-argmax", "an accepted draft token differs from the target's argmax at its parent"),
    ("SA301", "depth-equals-path", "accepted_depth != len(accepted_path) - 1"),
    ("SA302", "commit-len-vs-depth", "unfinished step with commit_len != accepted_depth + 1, "
                                     "or a finished one with commit_len outside 1..accepted_depth + 1"),
    ("SA303", "commit-len-equals-tokens", "commit_len != len(committed_tokens)"),
    ("SA304", "committed-tokens-match-path", "committed_tokens are not the accepted drafts then the bonus"),
    ("SA305", "counter-range", "a negative counter, or accepted_depth above the drafted nodes"),
    ("SA306", "commit-stops-at-eos", "a commit goes on past an EOS, or a step that committed EOS is not finished"),
    ("SA401", "positions-are-depths", "positions[i] != seq_len + depth(i)"),
)
INLINE_CODES = tuple(r[0] for r in INLINE_RULES)


def _lists(arr) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A list column -> (flat values int64 [sum L], lengths int64 [B], starts int64 [B]).

    Null lists count as empty. Works on sliced arrays (flatten honours the slice).
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    lens = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = arr.flatten().to_numpy(zero_copy_only=False)
    flat = np.asarray(flat, dtype=np.int64) if flat.dtype.kind in "iu" else np.asarray(flat)
    starts = np.zeros(len(lens), dtype=np.int64)
    if len(lens) > 1:
        np.cumsum(lens[:-1], out=starts[1:])
    return flat, lens, starts


def _col(batch, name) -> np.ndarray:
    return batch.column(batch.schema.get_field_index(name)).to_numpy(zero_copy_only=False)


def _padded(flat, lens, starts, n_max: int, fill: int = -1) -> np.ndarray:
    """Ragged rows -> [B, n_max] int64 padded with `fill` (rows longer are cut)."""
    B = len(lens)
    out = np.full((B, max(n_max, 1)), fill, dtype=np.int64)
    j = np.arange(out.shape[1])[None, :]
    keep = j < np.minimum(lens, out.shape[1])[:, None]
    idx = (starts[:, None] + j)[keep]
    out[keep] = flat[idx]
    return out


def _depths(par: np.ndarray, n: np.ndarray) -> np.ndarray:
    """[B, N] padded parents -> [B, N] node depths (root 0; -1 on padding or a broken parent).

    A node whose parent is out of range (not 0 <= p < i) gets depth -1, and so do its
    descendants: N passes of one gather, parents precede children.
    """
    B, N = par.shape
    d = np.full((B, N), -1, dtype=np.int64)
    d[:, 0] = np.where(n > 0, 0, -1)
    rows = np.arange(B)
    for i in range(1, N):
        p = par[:, i]
        ok = (i < n) & (p >= 0) & (p < i)
        pd = d[rows, np.clip(p, 0, N - 1)]
        d[:, i] = np.where(ok & (pd >= 0), pd + 1, -1)
    return d


def inline_violations(batch: pa.RecordBatch, budget: int | None = None,
                      eos_id: int | None = None) -> dict[str, np.ndarray]:
    """Evaluate the cheap per-step rules on one RecordBatch of STEPS_SCHEMA rows.

    Returns {code: bool [B]} (True = the row breaks the rule). `budget` defaults to the
    batch's own budget column; the EOS rule runs only when `eos_id` is known (the
    manifest's config.eos_id). Rows with broken shapes are flagged SA101 and skipped by
    the rules that index into their lists.
    """
    B = batch.num_rows
    tok, n, tok_s = _lists(batch.column(batch.schema.get_field_index("node_tokens")))
    par, n_par, par_s = _lists(batch.column(batch.schema.get_field_index("parents")))
    pos, n_pos, pos_s = _lists(batch.column(batch.schema.get_field_index("positions")))
    am, n_am, am_s = _lists(batch.column(batch.schema.get_field_index("target_argmax")))
    path, n_path, path_s = _lists(batch.column(batch.schema.get_field_index("accepted_path")))
    com, n_com, com_s = _lists(batch.column(batch.schema.get_field_index("committed_tokens")))
    depth = _col(batch, "accepted_depth").astype(np.int64)
    commit = _col(batch, "commit_len").astype(np.int64)
    fin = _col(batch, "finished").astype(bool)
    seq = _col(batch, "seq_len").astype(np.int64)
    bud = (np.full(B, budget, dtype=np.int64) if budget is not None
           else _col(batch, "budget").astype(np.int64))
    out: dict[str, np.ndarray] = {}

    # SA101 shapes: every per-node list has N = len(node_tokens) entries, 1 <= N <= budget + 1
    shape_bad = (n < 1) | (n > bud + 1) | (n_par != n) | (n_pos != n) | (n_am != n)
    out["SA101"] = shape_bad
    good = ~shape_bad
    # SA301, SA303, SA305: the counters against the lists they count
    out["SA301"] = depth != n_path - 1
    out["SA303"] = commit != n_com
    out["SA305"] = (depth < 0) | (commit < 0) | (depth > n - 1)
    # SA302: unfinished commit = depth + 1; finished commits a non-empty prefix of that
    out["SA302"] = np.where(fin, (commit < 1) | (commit > depth + 1), commit != depth + 1)

    # Path rules need each row's lists: pad to [B, Nmax] and [B, Pmax] (Nmax <= budget + 1).
    n_max = int(n.max()) if B else 1
    p_max = int(n_path.max()) if B else 1
    P = _padded(par, n_par, par_s, n_max)
    T = _padded(tok, n, tok_s, n_max)
    A = _padded(am, n_am, am_s, n_max)
    Q = _padded(path, n_path, path_s, max(p_max, 1))          # [B, Pmax], -1 padded
    rows = np.arange(B)[:, None]
    out["SA201"] = (n_path < 1) | (Q[:, 0] != 0)
    # consecutive (prev, cur) pairs of the path; valid where both exist and are in range
    if Q.shape[1] > 1:
        prev, cur = Q[:, :-1], Q[:, 1:]
        has = (np.arange(1, Q.shape[1])[None, :] < n_path[:, None])
        inr = has & (prev >= 0) & (prev < n[:, None]) & (cur >= 0) & (cur < n[:, None]) & good[:, None]
        pc_ = np.clip(prev, 0, n_max - 1)
        cc_ = np.clip(cur, 0, n_max - 1)
        follows = P[rows, cc_] == prev
        out["SA202"] = (has & ~(inr & follows)).any(axis=1) & good
        out["SA203"] = (inr & follows & (A[rows, pc_] != T[rows, cc_])).any(axis=1)
    else:
        out["SA202"] = np.zeros(B, dtype=bool)
        out["SA203"] = np.zeros(B, dtype=bool)

    # SA304: committed = node_tokens[path[1:]] then target_argmax[path[-1]]; a finished
    # step commits a prefix of that. Compare position by position over the commit.
    path_ok = good & ~out["SA201"] & ~out["SA202"]
    L = n_path                                              # expected full commit length
    C = _padded(com, n_com, com_s, max(int(n_com.max()) if B else 1, 1))
    k = np.arange(C.shape[1])[None, :]
    q_next = Q[rows, np.clip(k + 1, 0, Q.shape[1] - 1)]     # path[k + 1] (draft k)
    last = Q[np.arange(B), np.clip(L - 1, 0, Q.shape[1] - 1)]
    exp = np.where(k < (L - 1)[:, None], T[rows, np.clip(q_next, 0, n_max - 1)],
                   A[np.arange(B), np.clip(last, 0, n_max - 1)][:, None])
    in_commit = k < np.minimum(n_com, L)[:, None]
    mism = (in_commit & (C != exp)).any(axis=1) | (n_com > L) | (~fin & (n_com != L))
    out["SA304"] = path_ok & mism

    # SA306: EOS ends the commit; a commit holding EOS ends the request
    if eos_id is not None:
        is_eos = C == eos_id                                     # [B, Cmax] (padding is -1)
        in_c = k < n_com[:, None]
        last_k = (n_com - 1)[:, None]
        early = (is_eos & in_c & (k < last_k)).any(axis=1)       # EOS before the last token
        out["SA306"] = early | ((is_eos & in_c).any(axis=1) & ~fin)
    else:
        out["SA306"] = np.zeros(B, dtype=bool)

    # SA401: positions[i] = seq_len + depth(i) (depth from parents; broken trees skipped)
    D = _depths(P, n)
    Pos = _padded(pos, n_pos, pos_s, n_max)
    valid = (np.arange(n_max)[None, :] < n[:, None]) & (D >= 0) & good[:, None]
    out["SA401"] = (valid & (Pos != seq[:, None] + D)).any(axis=1)
    return out


# ------------------------------------------------------------------------ the sink

DURATION_BUCKETS = tuple(0.00025 * 2 ** i for i in range(15))  # 0.25 ms .. 4.1 s
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)
FINISH_REASONS = ("eos", "length", "abort")


class PromSink:
    """Tracer sink that keeps Prometheus metric families up to date.

    registry: where the families live (a fresh CollectorRegistry by default; servers
    expose it at /metrics). max_depth: the largest `depth` label (default: the run's
    budget + 1 from the manifest at open_run, else 16); deeper values count in it.
    """

    def __init__(self, registry: CollectorRegistry | None = None, max_depth: int | None = None,
                 rules: bool = True):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.rules = rules
        self._max_depth = max_depth
        self.eos_id: int | None = None   # from the manifest (config.eos_id) at open_run
        self._lock = threading.Lock()
        self._built = False
        if max_depth is not None:
            self._build(max_depth)

    # ------------------------------------------------------------- families
    def _build(self, max_depth: int) -> None:
        if self._built:
            return
        D = self.max_depth = max(1, min(int(max_depth), 64))
        r = self.registry
        self.verify_steps = Counter("specaudit_verify_steps", "Step rows: one per request per verify forward", registry=r)
        self.verify_forwards = Counter("specaudit_verify_forwards", "Batched verify forwards of the target", registry=r)
        self.drafted = Counter("specaudit_drafted_tokens", "Draft nodes verified (N - 1 per step)", registry=r)
        self.accepted = Counter("specaudit_accepted_tokens",
                                "Accepted draft tokens as the engine reported them (sum of accepted_depth)", registry=r)
        self.committed = Counter("specaudit_committed_tokens",
                                 "Committed tokens as the engine reported them (sum of commit_len)", registry=r)
        self.d_accepted = Counter("specaudit_derived_accepted_tokens",
                                  "Accepted draft tokens derived from the path (sum of len(accepted_path) - 1)", registry=r)
        self.d_committed = Counter("specaudit_derived_committed_tokens",
                                   "Tokens really appended to outputs (sum of len(committed_tokens))", registry=r)
        dd = Counter("specaudit_depth_drafted", "Steps whose draft reached depth `depth`", ["depth"], registry=r)
        da = Counter("specaudit_depth_accepted",
                     "Steps whose reported accepted depth was at least `depth`", ["depth"], registry=r)
        self._depth_drafted = [dd.labels(depth=str(d)) for d in range(1, D + 1)]   # cached children
        self._depth_accepted = [da.labels(depth=str(d)) for d in range(1, D + 1)]
        vio = Counter("specaudit_invariant_violations", "Step rows breaking an inline invariant rule, by rule code",
                      ["code"], registry=r)
        self._violations = {c: vio.labels(code=c) for c in INLINE_CODES}
        int_buckets = tuple(float(i) for i in range(0, D + 2))    # one bucket per integer
        self.commit_hist = Histogram("specaudit_commit_length_tokens", "Reported commit length per step",
                                     buckets=int_buckets, registry=r)
        self.depth_hist = Histogram("specaudit_accepted_depth_tokens", "Reported accepted depth per step",
                                    buckets=int_buckets, registry=r)
        self.draft_s = Histogram("specaudit_draft_duration_seconds", "Drafter wall time per batched forward",
                                 buckets=DURATION_BUCKETS, registry=r)
        self.verify_s = Histogram("specaudit_verify_duration_seconds", "Target verify wall time per batched forward",
                                  buckets=DURATION_BUCKETS, registry=r)
        self.step_s = Histogram("specaudit_step_duration_seconds", "Whole step wall time per batched forward",
                                buckets=DURATION_BUCKETS, registry=r)
        self.batch_size = Histogram("specaudit_batch_size_requests", "Requests per batched verify forward",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        req = Counter("specaudit_requests", "Finished requests by finish reason", ["finish_reason"], registry=r)
        self._requests = {f: req.labels(finish_reason=f) for f in FINISH_REASONS}
        self.generated = Counter("specaudit_generated_tokens",
                                 "Output tokens of finished requests (first token included)", registry=r)
        self.ttft = Histogram("specaudit_time_to_first_token_seconds", "Arrival to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("specaudit_request_duration_seconds", "Arrival to last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.running = Gauge("specaudit_running_requests", "Requests in the running batch", registry=r)
        self.queued = Gauge("specaudit_queued_requests", "Requests waiting for a free slot", registry=r)
        self.reported_cl = Gauge("specaudit_reported_commit_length",
                                 "Mean commit length the engine reports, over the estimator window", registry=r)
        self.estimated_cl = Gauge("specaudit_estimated_commit_length",
                                  "Commit length estimated from throughput (0 until an estimate exists)", registry=r)
        self.estimated_lo = Gauge("specaudit_estimated_commit_length_lower",
                                  "Lower bound of the throughput estimate", registry=r)
        self.estimated_hi = Gauge("specaudit_estimated_commit_length_upper",
                                  "Upper bound of the throughput estimate", registry=r)
        self.info = Gauge("specaudit_run_info", "The run being served (value 1)",
                          ["run_id", "algo", "budget", "topk", "fault", "model"], registry=r)
        self._built = True

    # ---------------------------------------------------------- sink protocol
    def open_run(self, manifest: dict) -> None:
        cfg = manifest.get("config") or {}
        if cfg.get("eos_id") is not None:
            self.eos_id = int(cfg["eos_id"])
        if not self._built:
            self._build(self._max_depth or (int(cfg["budget"]) + 1 if cfg.get("budget") else 16))
        model = ((manifest.get("models") or {}).get("target") or {}).get("name", "")
        self.info.labels(run_id=str(manifest.get("run_id", "")), algo=str(cfg.get("algo", "")),
                         budget=str(cfg.get("budget", "")), topk=str(cfg.get("topk", "")),
                         fault=str(cfg.get("fault") or "none"), model=str(model)).set(1)

    def write_steps(self, batch: pa.RecordBatch) -> None:
        if not self._built:
            self._build(self._max_depth or 16)
        B = batch.num_rows
        if B == 0:
            return
        depth = _col(batch, "accepted_depth").astype(np.int64)
        commit = _col(batch, "commit_len").astype(np.int64)
        n = pc.list_value_length(batch.column(batch.schema.get_field_index("node_tokens")))
        n = pc.fill_null(n, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        n_path = pc.fill_null(pc.list_value_length(batch.column(batch.schema.get_field_index("accepted_path"))), 0)
        n_com = pc.fill_null(pc.list_value_length(batch.column(batch.schema.get_field_index("committed_tokens"))), 0)
        n_path = n_path.to_numpy(zero_copy_only=False).astype(np.int64)
        n_com = n_com.to_numpy(zero_copy_only=False).astype(np.int64)
        D = self.max_depth
        # how deep each row's draft reaches: chains are N - 1; trees need parents
        algo = batch.column(batch.schema.get_field_index("algo"))
        if pc.all(pc.equal(algo, "chain")).as_py():
            reach = np.maximum(n - 1, 0)
        else:
            par, n_par, par_s = _lists(batch.column(batch.schema.get_field_index("parents")))
            P = _padded(par, n_par, par_s, int(n.max()))
            reach = np.maximum(_depths(P, n).max(axis=1), 0)
        # at-least-d counts for d = 1..D from one bincount each (deeper values land in D)
        reach_ge = np.cumsum(np.bincount(np.clip(reach, 0, D), minlength=D + 1)[::-1])[::-1]
        depth_ge = np.cumsum(np.bincount(np.clip(depth, 0, D), minlength=D + 1)[::-1])[::-1]
        viol = inline_violations(batch, eos_id=self.eos_id) if self.rules else {}
        t = {name: float(_col(batch, name)[0]) for name in ("draft_s", "verify_s", "step_s")}
        bs = int(_col(batch, "batch_size")[0])
        with self._lock:
            self.verify_steps.inc(B)
            self.verify_forwards.inc()
            self.drafted.inc(int(np.maximum(n - 1, 0).sum()))
            # Counter.inc refuses negatives: a negative reported counter is SA305, not a crash
            self.accepted.inc(int(np.maximum(depth, 0).sum()))
            self.committed.inc(int(np.maximum(commit, 0).sum()))
            self.d_accepted.inc(int(np.maximum(n_path - 1, 0).sum()))
            self.d_committed.inc(int(n_com.sum()))
            for d in range(1, D + 1):
                if reach_ge[d]:
                    self._depth_drafted[d - 1].inc(int(reach_ge[d]))
                if depth_ge[d]:
                    self._depth_accepted[d - 1].inc(int(depth_ge[d]))
            for code, bad in viol.items():
                k = int(bad.sum())
                if k:
                    self._violations[code].inc(k)
            for c, k in zip(*np.unique(commit, return_counts=True)):
                self._observe_many(self.commit_hist, float(c), int(k))
            for c, k in zip(*np.unique(depth, return_counts=True)):
                self._observe_many(self.depth_hist, float(c), int(k))
            self.draft_s.observe(t["draft_s"])
            self.verify_s.observe(t["verify_s"])
            self.step_s.observe(t["step_s"])
            self.batch_size.observe(bs)

    @staticmethod
    def _observe_many(h: Histogram, value: float, k: int) -> None:
        for _ in range(k):  # k rows of one value: at most B per forward
            h.observe(value)

    def write_request(self, row: dict) -> None:
        if not self._built:
            self._build(self._max_depth or 16)
        fr = row.get("finish_reason")
        with self._lock:
            if fr in self._requests:
                self._requests[fr].inc()
            self.generated.inc(len(row.get("output_tokens") or ()))
            if row.get("ttft_s") is not None and row["ttft_s"] >= 0:
                self.ttft.observe(float(row["ttft_s"]))
            if row.get("e2e_s") is not None and row["e2e_s"] >= 0:
                self.e2e.observe(float(row["e2e_s"]))

    def close_run(self, manifest: dict) -> None:
        pass

    # ----------------------------------------------------------- server gauges
    def set_load(self, running: int, queued: int) -> None:
        if self._built:
            self.running.set(running)
            self.queued.set(queued)

    def set_commit_lengths(self, reported: float | None, estimate=None) -> None:
        """Reported mean commit length and the throughput estimate (value, low, high)."""
        if not self._built:
            return
        if reported is not None:
            self.reported_cl.set(reported)
        if estimate is not None:
            self.estimated_cl.set(estimate.value)
            self.estimated_lo.set(estimate.low)
            self.estimated_hi.set(estimate.high)
