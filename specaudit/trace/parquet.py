"""Parquet sink: the trace record, one hive partition per run.

    traces/run_id=<id>/run.json                   manifest (rewritten at the end with finished_at)
    traces/run_id=<id>/steps-<seq>.parquet        zstd, row groups; one file per flush
    traces/run_id=<id>/requests-<seq>.parquet     the requests finished since the last flush
    traces/run_id=<id>/requests.parquet           at close: every request (the parts merged)
    traces/run_id=<id>/rollup-steps.parquet       at close: optional summary of the step files (trace/rollup.py)
    traces/run_id=<id>/rollup-requests.parquet    at close: optional summary of requests.parquet

Every file is written under a hidden temporary name and renamed when complete, so a
reader (pyarrow and DuckDB skip dot-files) sees whole files only. Steps are flushed
every `flush_steps` rows or `flush_s` seconds, whichever comes first, with the requests
finished since the last flush (appended as a new part, never rewritten: a flush costs
its own rows, not the run's); a run killed at any moment loses at most the rows not yet
flushed. At close the parts are merged into requests.parquet and then removed; readers
take requests.parquet as the whole table when it exists (a crash between the merge and
the removal leaves both, counted once) and the parts otherwise.
"""
from __future__ import annotations

import io
import json
import os
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from specaudit.trace.rollup import rollup_path
from specaudit.trace.rollup_writer import RollupAccumulator, rollup_bytes
from specaudit.trace.safe_io import InputError, atomic_write_bytes
from specaudit.trace.schema import REQUESTS_SCHEMA

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
REQUESTS_SCHEMA_EXT = REQUESTS_SCHEMA.append(pa.field("t_arrive", pa.float64()))


def prepare_run_dir(dataset: Path, run_id: str) -> Path:
    """Create dataset/run_id=<id>/, refusing an existing run or an unwritable folder."""
    if not RUN_ID_RE.match(run_id):
        raise InputError(None, f"run id {run_id!r} must be letters, digits, '.', '_' or '-'")
    dataset = Path(dataset)
    if dataset.exists() and not dataset.is_dir():
        raise InputError(dataset, "--out exists and is not a folder")
    try:
        dataset.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(dataset, f"cannot create the dataset folder: {e.strerror or e}") from None
    if not os.access(dataset, os.W_OK | os.X_OK):
        raise InputError(dataset, "the dataset folder is not writable")
    run_dir = dataset / f"run_id={run_id}"
    if run_dir.exists():
        raise InputError(run_dir, f"run {run_id!r} already exists in this dataset; "
                                  "pick another --run-id or --out")
    return run_dir


# How the sink and synth write a data file: writer options only, so the contract (schema,
# types, statistics) is unchanged and every reader (DuckDB views, Spark, older releases)
# reads it as before. Chosen by scripts/bench_layout.py (docs/benchmarks.md, #layout).
STEP_WRITE_OPTIONS = {"compression": "zstd", "use_dictionary": True}


def write_parquet_atomic(path: Path, table: pa.Table, row_group_size: int = 65536) -> int:
    """Write table to path atomically; returns the file's size in bytes."""
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=row_group_size, **STEP_WRITE_OPTIONS)
    data = buf.getvalue()
    atomic_write_bytes(path, data)
    return len(data)


def write_with_rollup(path: Path, table: pa.Table, row_group_size: int = 65536, what: str = "steps",
                      rollups: bool = True) -> bool:
    """Write a data file (steps or requests) and then its rollup (trace/rollup.py), both
    atomically. The data file is the record: it is written first, and a rollup that cannot
    be computed or written is left out (readers then read the raw rows), never an error.
    Returns whether the rollup was written. The sink and synth both write through here."""
    from specaudit.trace.rollup_writer import compute_rollup
    size = write_parquet_atomic(path, table, row_group_size)
    if not rollups:
        return False
    rp = rollup_path(path)
    try:
        data = rollup_bytes(compute_rollup(table, what), path.name, table.num_rows, size)
        atomic_write_bytes(rp, data)
    except Exception:   # an optional summary: any failure means "absent" (readers fall back)
        try:
            if rp.exists():
                rp.unlink()    # an older rollup for a rewritten file would only be ignored as stale
        except OSError:
            pass
        return False
    return True


def _with_sampling_columns(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A v1 step batch with the contract v2 columns added, all null (greedy rows)."""
    from specaudit.trace.schema import SAMPLING_FIELDS, STEPS_SCHEMA_V2
    if batch.schema.equals(STEPS_SCHEMA_V2):
        return batch
    cols = list(batch.columns) + [pa.nulls(batch.num_rows, f.type) for f in SAMPLING_FIELDS]
    return pa.RecordBatch.from_arrays(cols, schema=STEPS_SCHEMA_V2)


class SinkError(InputError):
    """A sink could not keep the record (disk full, permission): one line, exit 2."""


class ParquetSink:
    """Writes a run's steps, requests and manifest into a dataset folder.

    Crash-safe: steps are flushed every `flush_steps` rows or `flush_s` seconds, and
    the requests that finished since the last flush are written with them as a new part
    (requests-<seq>.parquet; nothing already on disk is rewritten), so a killed process
    loses at most one flush interval of either. close_run merges the parts into
    requests.parquet. Unless `rollups=False`, each flush keeps the partial sums of its
    step rows (trace/rollup_writer.RollupAccumulator, in memory) and close_run writes them as one
    rollup-steps.parquet, and requests.parquet gets its rollup: a flush writes no rollup
    file, and a killed run has none (readers compute the same rows from the raw files;
    its steps check as before). A failed write (disk full, permission) keeps the rows
    pending, raises once to the tracer (which counts and logs it), and is retried after
    a backoff that doubles from `retry_s` up to `retry_max_s`; above `max_pending_rows`
    pending step rows the oldest are dropped and counted (health()["dropped_rows"])."""

    def __init__(self, dataset, run_id: str, flush_steps: int = 4096, flush_s: float = 5.0,
                 row_group_size: int = 65536, retry_s: float = 1.0, retry_max_s: float = 60.0,
                 max_pending_rows: int = 1_000_000, rollups: bool = True):
        self.run_dir = prepare_run_dir(Path(dataset), run_id)
        self.run_id = run_id
        self.flush_steps, self.flush_s = flush_steps, flush_s
        self.row_group_size = row_group_size
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._last_flush = time.monotonic()
        self._seq = 0
        self.rollups = rollups
        self._acc = RollupAccumulator() if rollups else None
        self._requests: list[dict] = []     # finished, not yet in a part on disk
        self._request_parts: list[Path] = []
        self._requests_at = time.monotonic()
        self.retry_s, self.retry_max_s = retry_s, retry_max_s
        self.max_pending_rows = max_pending_rows
        self._backoff = 0.0
        self._retry_at = 0.0
        self.errors = 0
        self.last_error: str | None = None
        self.dropped_rows = 0

    sink_name = "parquet"

    def health(self) -> dict:
        """ok: the last write succeeded (or none failed yet); the rest for /health."""
        return {"ok": self._backoff == 0.0, "errors": self.errors, "last_error": self.last_error,
                "pending_rows": self._pending_rows, "dropped_rows": self.dropped_rows,
                "retry_in_s": max(0.0, round(self._retry_at - time.monotonic(), 3)) if self._backoff else 0.0}

    def open_run(self, manifest: dict) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=False)
        self._write_manifest(manifest)

    def _write_manifest(self, manifest: dict) -> None:
        atomic_write_bytes(self.run_dir / "run.json",
                           (json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n").encode())

    def write_steps(self, batch: pa.RecordBatch) -> None:
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        while self._pending_rows > self.max_pending_rows and len(self._pending) > 1:
            old = self._pending.pop(0)          # the disk has been failing for long
            self._pending_rows -= old.num_rows
            self.dropped_rows += old.num_rows
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        due = self._pending_rows >= self.flush_steps or time.monotonic() - self._last_flush >= self.flush_s
        if due and time.monotonic() >= self._retry_at:
            self.flush()

    def flush(self, force: bool = False) -> None:
        """Write pending steps (one new steps file) and the requests finished so far.
        Raises OSError when the disk refuses (rows stay pending, retried later)."""
        if not force and time.monotonic() < self._retry_at:
            return
        self._last_flush = time.monotonic()
        try:
            if self._pending:
                # a sampled run's batches carry the contract v2 columns (STEPS_SCHEMA_V2); a
                # run mixing greedy and sampled requests (vLLM) may flush both kinds at once
                batches = self._pending
                if len({b.schema for b in batches}) > 1:
                    batches = [_with_sampling_columns(b) for b in batches]
                table = pa.Table.from_batches(batches, schema=batches[0].schema)
                path = self.run_dir / f"steps-{self._seq:06d}.parquet"
                size = write_parquet_atomic(path, table, self.row_group_size)
                self._seq += 1
                self._add_to_rollup(path, table, size)
                self._pending, self._pending_rows = [], 0
            # a new part with the requests finished since the last one: at most once per flush_s
            if self._requests and (force or time.monotonic() - self._requests_at >= self.flush_s):
                self._write_request_part()
        except OSError as e:
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e.strerror or e}"
            self._backoff = min(max(self._backoff * 2, self.retry_s), self.retry_max_s)
            self._retry_at = time.monotonic() + self._backoff
            raise
        self._backoff, self._retry_at = 0.0, 0.0

    def _requests_table(self, rows: list[dict]) -> pa.Table:
        cols = {f.name: [r.get(f.name) for r in rows] for f in REQUESTS_SCHEMA_EXT}
        return pa.table(cols, schema=REQUESTS_SCHEMA_EXT)

    def _write_request_part(self) -> None:
        path = self.run_dir / f"requests-{len(self._request_parts):06d}.parquet"
        write_parquet_atomic(path, self._requests_table(self._requests))   # no rollup: removed at close
        self._request_parts.append(path)
        self._requests = []
        self._requests_at = time.monotonic()

    def _merge_requests(self) -> None:
        """requests.parquet = every part (or an empty table), then the parts are removed.
        Readers take requests.parquet as the whole table when it exists, so a crash
        between the write and the removals counts no request twice."""
        tables = [pq.read_table(p, schema=REQUESTS_SCHEMA_EXT) for p in self._request_parts]
        table = pa.concat_tables(tables) if tables else self._requests_table([])
        write_with_rollup(self.run_dir / "requests.parquet", table, what="requests", rollups=self.rollups)
        for p in self._request_parts:
            for f in (rollup_path(p), p):
                try:
                    f.unlink()
                except FileNotFoundError:
                    pass
        self._request_parts = []

    def _add_to_rollup(self, path: Path, table: pa.Table, size: int) -> None:
        """The step file's partial sums into the run's rollup; an optional summary, so a
        failure drops the run's rollup (readers fall back to the rows), never the steps."""
        if self._acc is None:
            return
        try:
            self._acc.add(path, table, size)
        except Exception:   # an optional summary: any failure means "no rollup"
            self._acc = None

    def _write_run_rollup(self) -> None:
        if self._acc is None:
            return
        try:
            self._acc.write(self.run_dir)
        except Exception:   # an optional summary: any failure means "no rollup"
            pass
        self._acc = None

    def tick(self, _=None) -> None:
        """The tracer's worker calls this on every wake (at least every flush_s): rows and
        finished requests waiting for a flush are written by the clock, so an idle server
        keeps nothing in memory longer than flush_s (a kill then loses at most that)."""
        now = time.monotonic()
        if (self._pending or self._requests) and now - self._last_flush >= self.flush_s and now >= self._retry_at:
            self.flush()

    def write_request(self, row: dict) -> None:
        self._requests.append(row)
        if time.monotonic() - self._last_flush >= self.flush_s and time.monotonic() >= self._retry_at:
            self.flush()

    def close_run(self, manifest: dict) -> None:
        """Last flush (no backoff), the requests table (even empty) and the final
        manifest; SinkError (one line) when the disk still refuses."""
        try:
            self.flush(force=True)
            self._merge_requests()
            self._write_run_rollup()
            self._write_manifest(manifest)
        except OSError as e:
            raise SinkError(self.run_dir, f"could not finish the trace ({e.strerror or e}); "
                                          f"{self._pending_rows} step rows not written, the files "
                                          "on disk stay readable") from None
        if self.dropped_rows:
            raise SinkError(self.run_dir, f"{self.dropped_rows} step rows were dropped while the disk "
                                          "refused writes; the rest is on disk")
