"""Parquet sink: the trace record, one hive partition per run.

    traces/run_id=<id>/run.json           manifest (rewritten at the end with finished_at)
    traces/run_id=<id>/steps-<seq>.parquet   zstd, row groups; one file per flush
    traces/run_id=<id>/requests.parquet   written when the run ends

Every file is written under a hidden temporary name and renamed when complete, so a
reader (pyarrow and DuckDB skip dot-files) sees whole files only. Steps are flushed
every `flush_steps` rows or `flush_s` seconds, whichever comes first; a run killed at
any moment loses at most the rows not yet flushed.
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

from specaudit.trace.schema import REQUESTS_SCHEMA, InputError, atomic_write_bytes

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


def write_parquet_atomic(path: Path, table: pa.Table, row_group_size: int = 65536) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", row_group_size=row_group_size)
    atomic_write_bytes(path, buf.getvalue())


class ParquetSink:
    """Writes a run's steps, requests and manifest into a dataset folder."""

    def __init__(self, dataset, run_id: str, flush_steps: int = 4096, flush_s: float = 5.0,
                 row_group_size: int = 65536):
        self.run_dir = prepare_run_dir(Path(dataset), run_id)
        self.run_id = run_id
        self.flush_steps, self.flush_s = flush_steps, flush_s
        self.row_group_size = row_group_size
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._last_flush = time.monotonic()
        self._seq = 0
        self._requests: list[dict] = []

    def open_run(self, manifest: dict) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=False)
        self._write_manifest(manifest)

    def _write_manifest(self, manifest: dict) -> None:
        atomic_write_bytes(self.run_dir / "run.json",
                           (json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n").encode())

    def write_steps(self, batch: pa.RecordBatch) -> None:
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        if (self._pending_rows >= self.flush_steps
                or time.monotonic() - self._last_flush >= self.flush_s):
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        # a sampled run's batches carry the contract v2 columns (STEPS_SCHEMA_V2)
        table = pa.Table.from_batches(self._pending, schema=self._pending[0].schema)
        write_parquet_atomic(self.run_dir / f"steps-{self._seq:06d}.parquet", table, self.row_group_size)
        self._seq += 1
        self._pending, self._pending_rows = [], 0

    def write_request(self, row: dict) -> None:
        self._requests.append(row)

    def close_run(self, manifest: dict) -> None:
        self.flush()
        cols = {f.name: [r.get(f.name) for r in self._requests] for f in REQUESTS_SCHEMA_EXT}
        table = pa.table(cols, schema=REQUESTS_SCHEMA_EXT)
        write_parquet_atomic(self.run_dir / "requests.parquet", table)
        self._write_manifest(manifest)
