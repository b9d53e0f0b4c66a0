"""Prometheus sink: live counters, histograms and the inline rules' counts.

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
deeper values count in the last one), `code` (the inline rules),
`finish_reason` (eos, length, abort) and `sink` (SINK_NAMES, on
specaudit_sink_errors_total: failed writes of the Parquet or OTel sink).

Reported against derived: `specaudit_committed_tokens_total` and
`specaudit_accepted_tokens_total` sum the engine's own counters (commit_len,
accepted_depth: the numbers under audit); the `specaudit_derived_*` twins count the
same thing from the recorded tokens and path (len(committed_tokens), len(path) - 1).
They agree on an honest engine; a gap is a metrics bug, live.

Inline rules: the cheap per-step rules of the invariant catalog, evaluated on every row of
every step (trace/inline_rules.py) and counted as specaudit_invariant_violations_total{code};
the fast /metrics text for this registry is trace/prom_exposition.py.
"""
from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from specaudit.trace.inline_rules import INLINE_CODES, column_np, inline_violations, list_parts, pad_rows
from specaudit.trace.prom_exposition import watch
from specaudit.trace.schema import tree_depths

# `sink` label values of specaudit_sink_errors_total (bounded)
SINK_NAMES = ("parquet", "otel", "prometheus", "tracer", "other")

# PromSink attributes of the gauges the server sets every step (generation group 1)
_GAUGE_FAMILIES = ("running", "queued", "reported_cl", "estimated_cl", "estimated_lo", "estimated_hi")

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
        watch(self.registry, self)   # FastExposition reuses our lines between changes
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
        depth = column_np(batch, "accepted_depth").astype(np.int64)
        commit = column_np(batch, "commit_len").astype(np.int64)
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
            par, n_par, par_s = list_parts(batch.column(batch.schema.get_field_index("parents")))
            P = pad_rows(par, n_par, par_s, max(int(n.max()), 1))
            reach = np.maximum(tree_depths(P, n).max(axis=1), 0)
        # at-least-d counts for d = 1..D from one bincount each (deeper values land in D)
        reach_ge = np.cumsum(np.bincount(np.clip(reach, 0, D), minlength=D + 1)[::-1])[::-1]
        depth_ge = np.cumsum(np.bincount(np.clip(depth, 0, D), minlength=D + 1)[::-1])[::-1]
        viol = inline_violations(batch, eos_id=self.eos_id) if self.rules else {}
        # The tracer hands over many forwards at once; a forward's rows are consecutive
        # and share t_start and its timings: observe each forward once, at its first row.
        ts = column_np(batch, "t_start")
        first = np.flatnonzero(np.concatenate(([True], ts[1:] != ts[:-1])))
        t = {name: column_np(batch, name)[first].astype(float) for name in ("draft_s", "verify_s", "step_s")}
        bs = column_np(batch, "batch_size")[first].astype(float)
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
