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
deeper values count in the last one), `code` (the inline rules below),
`finish_reason` (eos, length, abort) and `sink` (SINK_NAMES, on
specaudit_sink_errors_total: failed writes of the Parquet or OTel sink).

Reported against derived: `specaudit_committed_tokens_total` and
`specaudit_accepted_tokens_total` sum the engine's own counters (commit_len,
accepted_depth: the numbers under audit); the `specaudit_derived_*` twins count the
same thing from the recorded tokens and path (len(committed_tokens), len(path) - 1).
They agree on an honest engine; a gap is a metrics bug, live.

Inline rules: the cheap per-step rules of the invariant catalog, evaluated on every
row of every step with numpy over the Arrow buffers (no Python loop over rows). Their
codes are the checker's (specaudit.invariants), so a live violation and `specaudit check`
on the same trace name the same rule (`specaudit rules CODE` explains it). The rules that
need more than one row (continuity across steps, losslessness, aggregates) stay in the
offline checker.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from specaudit.trace.schema import tree_depths

# `sink` label values of specaudit_sink_errors_total (bounded)
SINK_NAMES = ("parquet", "otel", "prometheus", "tracer", "other")

# --------------------------------------------------------------------- inline rules

# The step-scope rules of specaudit.invariants that need nothing but the row itself, by
# the checker's own codes: the only thing the sink says about a rule (`code` label values).
# Their names, messages and docs live in the catalog alone, where each is marked
# live = ("prom", ...); the sink may not import the catalog (the trace layer never
# imports readers), so tests/test_one_verdict.py fails when this list and the catalog's
# live rules drift, and tests/test_rule_homes.py runs each one's catalog fixtures through
# inline_violations (invariants/homes.py lists this as a home). Rows whose structure is
# unsound (any SA1xx but SA105/SA106) are skipped by the SA2xx/SA3xx rules, as the
# checker does. Left to the offline checker: SA107 (nulls), SA108 (partition), SA109
# (diagnostic ranges), SA311 and SA4xx (need the request's earlier steps), SA5xx (run
# aggregates).
INLINE_CODES = ("SA101", "SA102", "SA103", "SA104", "SA105", "SA106", "SA201", "SA202",
                "SA301", "SA302", "SA303", "SA304", "SA305", "SA306", "SA307", "SA308", "SA309", "SA310")
_CHAIN_HASH: dict[int, int] = {}


def _lists(arr) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def _col(batch, name) -> np.ndarray:
    return batch.column(batch.schema.get_field_index(name)).to_numpy(zero_copy_only=False)


def _padded(flat, lens, starts, n_max: int, fill: int = -1) -> np.ndarray:
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
    tok, n, tok_s = _lists(col("node_tokens"))
    par, n_par, par_s = _lists(col("parents"))
    pos, n_pos, pos_s = _lists(col("positions"))
    am, n_am, am_s = _lists(col("target_argmax"))
    path, n_path, path_s = _lists(col("accepted_path"))
    com, n_com, com_s = _lists(col("committed_tokens"))
    n = np.maximum(n, 0)
    n_path, n_com = np.maximum(n_path, 0), np.maximum(n_com, 0)
    depth = _col(batch, "accepted_depth").astype(np.int64)
    commit = _col(batch, "commit_len").astype(np.int64)
    fin = _col(batch, "finished").astype(bool)
    seq = _col(batch, "seq_len").astype(np.int64)
    topk = _col(batch, "topk").astype(np.int64)
    chain_algo = pc.equal(col("algo"), "chain").to_numpy(zero_copy_only=False).astype(bool)
    bud = (np.full(B, budget, dtype=np.int64) if budget is not None
           else _col(batch, "budget").astype(np.int64))
    out: dict[str, np.ndarray] = {}
    rows = np.arange(B)
    R = rows[:, None]

    # ---- SA1xx: shapes and tree structure
    lens_bad = (n_par != n) | (n_pos != n) | (n_am != n)
    for name in ("draft_logprob", "target_margin"):
        _, nl, _ = _lists(col(name))
        lens_bad |= (nl != -1) & (nl != n)
    out["SA101"] = lens_bad
    out["SA102"] = (n < 1) | (n > bud + 1)
    shapes_ok = ~lens_bad & (n >= 1) & (n_path >= 1)
    n_max = max(int(n.max()) if B else 1, 1)
    P = _padded(par, n_par, par_s, n_max)
    T = _padded(tok, n, tok_s, n_max)
    A = _padded(am, n_am, am_s, n_max)
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
    Pos = _padded(pos, n_pos, pos_s, n_max)
    out["SA201"] = ok & (okn & (Pos != seq[:, None] + D)).any(axis=1)
    mh = _col(batch, "mask_hash").astype(np.uint64)
    want = _mask_hashes(P, n, rows[ok]) if ok.any() else np.zeros(B, dtype=np.uint64)
    out["SA202"] = ok & (mh != want)

    # ---- SA3xx: counters
    out["SA301"] = ok & np.where(fin, commit > depth + 1, commit != depth + 1)
    out["SA302"] = ok & (n_path >= 1) & (depth != n_path - 1)
    out["SA306"] = ok & (commit != n_com)
    out["SA310"] = ok & ((depth < 0) | (commit < 1) | (n_com < 1))

    # ---- SA3xx: the path: [B, Pmax] node indices, -1 padded
    p_max = max(int(n_path.max()) if B else 1, 1)
    Q = _padded(path, n_path, path_s, p_max)
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
    C = _padded(com, n_com, com_s, c_max)
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


# ------------------------------------------------------------------------ the sink

DURATION_BUCKETS = tuple(0.00025 * 2 ** i for i in range(15))  # 0.25 ms .. 4.1 s
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)
FINISH_REASONS = ("eos", "length", "abort")


def _observe(h: Histogram, values: np.ndarray) -> None:
    """h.observe(v) for every v, in one increment per distinct bucket.

    prometheus_client's Histogram keeps per-bucket (non-cumulative) counts in `_buckets`
    beside `_upper_bounds` and `_sum`; when those are there (every release since 0.4),
    add each bucket's count at once, else fall back to one observe per value.
    """
    values = np.asarray(values, dtype=float)
    if not len(values):
        return
    ub = getattr(h, "_upper_bounds", None)
    if ub is None or not hasattr(h, "_buckets") or not hasattr(h, "_sum"):
        for v in values:
            h.observe(float(v))
        return
    idx = np.searchsorted(np.asarray(ub, dtype=float), values, side="left")  # first bound >= v
    for i, k in zip(*np.unique(idx, return_counts=True)):
        h._buckets[int(i)].inc(int(k))
    h._sum.inc(float(values.sum()))


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
        self._gen = [0, 0]               # bumped after every change: [trace writes, server gauges]
        self._families: list = []
        self._load = None
        # FastExposition reuses our lines between changes (weak: the registry outlives no sink)
        _SOURCES.setdefault(self.registry, []).append(weakref.ref(self))
        if max_depth is not None:
            self._build(max_depth)

    def generation(self, group: int = 0) -> int:
        """A number that changes after every update of this sink's series in `group` (0: what
        the tracer writes, 1: the gauges the server sets every step); FastExposition re-reads
        a group's series only then. Every write goes through the methods below, each bumping
        it after its last change, so a render that read the old number formats anew."""
        return self._gen[group]

    def families(self) -> list:
        """[(collector, group)] of this sink's families."""
        gauges = {id(g) for g in (getattr(self, n, None) for n in _GAUGE_FAMILIES) if g is not None}
        return [(c, 1 if id(c) in gauges else 0) for c in self._families]

    # ------------------------------------------------------------- families
    def _build(self, max_depth: int) -> None:
        if self._built:
            return
        D = self.max_depth = max(1, min(int(max_depth), 64))
        r = self.registry
        before = set(getattr(r, "_collector_to_names", {}))
        self.verify_steps = Counter("specaudit_verify_steps", "Step rows: one per request per verify forward",
                                    registry=r)
        self.verify_forwards = Counter("specaudit_verify_forwards", "Batched verify forwards of the target", registry=r)
        self.drafted = Counter("specaudit_drafted_tokens", "Draft nodes verified (N - 1 per step)", registry=r)
        self.accepted = Counter("specaudit_accepted_tokens",
                                "Accepted draft tokens as the engine reported them (sum of accepted_depth)", registry=r)
        self.committed = Counter("specaudit_committed_tokens",
                                 "Committed tokens as the engine reported them (sum of commit_len)", registry=r)
        self.d_accepted = Counter("specaudit_derived_accepted_tokens",
                                  "Accepted draft tokens derived from the path (sum of len(accepted_path) - 1)",
                                  registry=r)
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
        int_buckets = tuple(float(i) for i in range(D + 2))    # one bucket per integer
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
        se = Counter("specaudit_sink_errors", "Failed writes of a trace sink (disk full, permission); "
                     "the tracer retries with backoff and /health turns non-ok", ["sink"], registry=r)
        self._sink_errors = {k: se.labels(sink=k) for k in SINK_NAMES}
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
        self._families = [c for c in getattr(r, "_collector_to_names", {}) if c not in before]
        self._built = True
        self._gen[0] += 1
        self._gen[1] += 1

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
        self._gen[0] += 1

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
            P = _padded(par, n_par, par_s, max(int(n.max()), 1))
            reach = np.maximum(tree_depths(P, n).max(axis=1), 0)
        # at-least-d counts for d = 1..D from one bincount each (deeper values land in D)
        reach_ge = np.cumsum(np.bincount(np.clip(reach, 0, D), minlength=D + 1)[::-1])[::-1]
        depth_ge = np.cumsum(np.bincount(np.clip(depth, 0, D), minlength=D + 1)[::-1])[::-1]
        viol = inline_violations(batch, eos_id=self.eos_id) if self.rules else {}
        # The tracer hands over many forwards at once; a forward's rows are consecutive
        # and share t_start and its timings: observe each forward once, at its first row.
        ts = _col(batch, "t_start")
        first = np.flatnonzero(np.concatenate(([True], ts[1:] != ts[:-1])))
        t = {name: _col(batch, name)[first].astype(float) for name in ("draft_s", "verify_s", "step_s")}
        bs = _col(batch, "batch_size")[first].astype(float)
        with self._lock:
            self.verify_steps.inc(B)
            self.verify_forwards.inc(len(first))
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
            _observe(self.commit_hist, commit)
            _observe(self.depth_hist, depth)
            _observe(self.draft_s, t["draft_s"])
            _observe(self.verify_s, t["verify_s"])
            _observe(self.step_s, t["step_s"])
            _observe(self.batch_size, bs)
            self._gen[0] += 1

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
            self._gen[0] += 1

    def close_run(self, manifest: dict) -> None:
        pass

    sink_name = "prometheus"
    live = True   # scraped while the run goes on: the tracer hands batches over every 0.25 s

    def sink_error(self, name: str) -> None:
        """Count one failure of a sink (called by the tracer; names outside SINK_NAMES
        count as "other": the label stays bounded)."""
        if self._built:
            self._sink_errors.get(name, self._sink_errors["other"]).inc()
            self._gen[0] += 1

    # ----------------------------------------------------------- server gauges
    def set_load(self, running: int, queued: int) -> None:
        if self._built and (running, queued) != self._load:   # called every step: count changes only
            self.running.set(running)
            self.queued.set(queued)
            self._load = (running, queued)
            self._gen[1] += 1

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
        self._gen[1] += 1


# ------------------------------------------------------------------- fast /metrics

def _go_float(v: float) -> str:
    """A sample value as Prometheus text: repr, with Go's spellings of inf and nan."""
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


class FastExposition:
    """Prometheus text for a registry of plain Counters, Gauges and Histograms, ~10x
    cheaper than prometheus_client.generate_latest, and cheaper again between updates.

    A 10 Hz scrape must not slow the decode loop (it shares the GIL): the label and
    name part of every line is formatted once into a plan, and a render reads the raw
    values (one attribute read each, no lock: a float read is atomic under the GIL and
    the tracer's inc() is never made to wait) and reuses a series' formatted line (a
    histogram's whole block) while its values are the very objects it was formatted
    from, so an idle series costs a read and an identity test. The plan is rebuilt
    when a family gains a labelled child. Families this class does not know (another
    collector type, or a prometheus_client without the private fields used here)
    make it fall back to generate_latest, so the output is always complete. Same
    samples, same values, same HELP/TYPE lines as generate_latest (tested).
    """

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self._plan = None
        self._key = None
        self._sources: list = []   # PromSinks on this registry: their series are re-read only after a change
        self._gens: list = []
        self._segments: list = []

    @staticmethod
    def _labels(names, values, extra=()) -> str:
        pairs = sorted([(n, v) for n, v in zip(names, values)] + list(extra))   # as generate_latest
        if not pairs:
            return ""
        esc = lambda v: str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
        return "{" + ",".join(f'{n}="{esc(v)}"' for n, v in pairs) + "}"

    def _wrappers(self):
        return list(getattr(self.registry, "_collector_to_names", {}).keys())

    def _children(self, w):
        if w._labelnames:
            with w._lock:
                return list(w._metrics.items())
        return [((), w)]

    @staticmethod
    def _plain(v) -> bool:
        """A value object whose float sits in `_value` (prometheus_client's MutexValue):
        read directly. Anything else (multiprocess values) is read with get()."""
        try:
            from prometheus_client.values import MutexValue
        except ImportError:
            return False
        return type(v) is MutexValue and hasattr(v, "_value")

    def _build(self, wrappers):
        # parts: [_STATIC, text, owner] | [_VALUE, prefix, value, plain, last, line, owner]
        #        | [_HIST, bucket prefixes, count prefix, sum prefix, values, plain, last, block, owner]
        # owner: index into self._sources of the sink whose generation() covers the series
        sinks = [s for s in (r() for r in _SOURCES.get(self.registry, ())) if s is not None]
        fams = [(src, c, g) for src in sinks for c, g in src.families()]
        self._sources = sorted({(id(src), g): (src, g) for src, _, g in fams}.values(), key=lambda e: (id(e[0]), e[1]))
        index = {(id(src), g): k for k, (src, g) in enumerate(self._sources)}
        owners = {id(c): index[(id(src), g)] for src, c, g in fams}
        self._gens = [None] * len(self._sources)
        parts = []
        for w in wrappers:
            owner = owners.get(id(w))
            typ = getattr(w, "_type", None)
            if typ not in ("counter", "gauge", "histogram") or not hasattr(w, "_name"):
                return None
            name = w._name
            doc = w._documentation.replace("\\", "\\\\").replace("\n", "\\n")
            fam = name + ("_total" if typ == "counter" else "")   # text format 0.0.4 names counters so
            parts.append([_STATIC, f"# HELP {fam} {doc}\n# TYPE {fam} {typ}\n", owner])
            for lv, child in self._children(w):
                lab = self._labels(w._labelnames, lv)
                if typ in ("counter", "gauge"):
                    if not hasattr(child, "_value"):
                        return None
                    if typ == "gauge" and getattr(child, "_multiprocess_mode", "all") not in (
                            "all", "liveall", "max", "min", "sum", "mostrecent", "livesum", "livemax", "livemin",
                            "livemostrecent"):
                        return None
                    v = child._value
                    prefix = f"{name}_total{lab} " if typ == "counter" else f"{name}{lab} "
                    parts.append([_VALUE, prefix, v, self._plain(v), _UNSET, "", owner])
                else:
                    if not (hasattr(child, "_buckets") and hasattr(child, "_sum") and hasattr(child, "_upper_bounds")):
                        return None
                    les = [self._labels(w._labelnames, lv, [("le", _go_float(b))]) for b in child._upper_bounds]
                    vals = list(child._buckets) + [child._sum]
                    parts.append([_HIST, [f"{name}_bucket{le} " for le in les], f"{name}_count{lab} ",
                                  f"{name}_sum{lab} ", vals, all(self._plain(v) for v in vals), None, "",
                                  owner])
        return parts

    def render(self) -> bytes:
        from prometheus_client import generate_latest
        wrappers = self._wrappers()
        key = tuple((id(w), len(w._metrics) if getattr(w, "_labelnames", None) else 0) for w in wrappers) \
            if all(hasattr(w, "_labelnames") for w in wrappers) else None
        if key is None:
            return generate_latest(self.registry)
        if key != self._key:
            self._plan, self._key = self._build(wrappers), key
            self._segments = _segments(self._plan) if self._plan is not None else []
        if self._plan is None:
            return generate_latest(self.registry)
        gens = [src.generation(g) for src, g in self._sources]   # read before any value
        same = [g == old for g, old in zip(gens, self._gens)]
        self._gens = gens
        out = []
        for seg in self._segments:     # [owner, parts, text]: a run of one sink's families
            owner = seg[0]
            if owner is not None and same[owner] and seg[2] is not None:
                out.append(seg[2])     # its sink has not written since the last render
                continue
            text = "".join(self._lines(seg[1]))
            if owner is not None:
                seg[2] = text
            out.append(text)
        return "".join(out).encode()

    @staticmethod
    def _lines(plan) -> list:
        out = []
        for p in plan:
            kind = p[0]
            if kind is _STATIC:
                out.append(p[1])
            elif kind is _VALUE:
                v = p[2]._value if p[3] else p[2].get()
                if v is not p[4]:            # a new float object: the series moved (or a reread)
                    p[4], p[5] = v, p[1] + _go_float(v) + "\n"
                out.append(p[5])
            else:
                cur = [b._value for b in p[4]] if p[5] else [b.get() for b in p[4]]
                if cur != p[6]:              # list compare: identity first, so an idle block is reused
                    _, bucket_prefixes, count_prefix, sum_prefix = p[:4]
                    lines, acc = [], 0.0
                    for prefix, b in zip(bucket_prefixes, cur):
                        acc += b
                        lines.append(prefix + _go_float(acc) + "\n")
                    lines.append(count_prefix + _go_float(acc) + "\n")
                    lines.append(sum_prefix + _go_float(cur[-1]) + "\n")
                    p[6], p[7] = cur, "".join(lines)
                out.append(p[7])
        return out


def _segments(plan) -> list:
    """The plan cut into runs of parts with one owner: [owner, parts, cached text]."""
    out = []
    for p in plan:
        if out and out[-1][0] == p[-1]:
            out[-1][1].append(p)
        else:
            out.append([p[-1], [p], None])
    return out


_STATIC, _VALUE, _HIST = "static", "value", "hist"
# PromSink attributes of the gauges the server sets every step (generation group 1)
_GAUGE_FAMILIES = ("running", "queued", "reported_cl", "estimated_cl", "estimated_lo", "estimated_hi")
_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # registry -> weak refs to its PromSinks
_UNSET = object()   # no value read yet: the first render formats every line
