"""One run checked from its files: its step files streamed by row group (a read-ahead
thread for a big run), its requests table opened and streamed, each file's schema
checked, and whatever cannot be read recorded as SA000 while the other files are read.

    check_run(rf, rules, result)              # rf: a RunFiles (specaudit.trace.schema.discover)

iter_step_batches and open_requests are also the Spark driver's readers (one file at
a time); run_start and run_counts are the run's bookkeeping both drivers share.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from specaudit.audit.check.core import BATCH_ROWS, CLIENT_COLUMNS, REQUEST_BATCH_ROWS, check_batches
from specaudit.audit.check.result import CheckResult, result_bad
from specaudit.invariants.frame_diagnostics import DIAGNOSTIC_RANGES
from specaudit.trace.safe_io import InputError, note_input
from specaudit.trace.schema import (
    REQUESTS_SCHEMA,
    SAMPLING_COLUMNS,
    SAMPLING_FIELDS,
    STEPS_SCHEMA,
    RunFiles,
    check_table_schema,
    declared_size_problem,
)

STEP_READ_COLUMNS = [c for c in STEPS_SCHEMA.names if c not in ("t_start", "draft_s", "verify_s", "step_s")]
STEP_READ_COLUMNS += list(SAMPLING_COLUMNS)  # contract v2, read when present (SA8xx)
# the requests table's columns request_facts reads (the latencies ttft_s/e2e_s are no rule's)
REQUEST_READ_COLUMNS = [c for c in REQUESTS_SCHEMA.names if c not in ("ttft_s", "e2e_s")] + list(CLIENT_COLUMNS)


class _UnreadableFile:
    """A file that failed while streaming (recorded by the consuming thread)."""

    def __init__(self, path, reason):
        self.path, self.reason = path, reason


def iter_step_batches(rf: RunFiles, batch_rows: int, columns):
    """Stream (batch, file, partition) over a run's step files; a bad file yields _UnreadableFile
    (and the next file is still read); a file read to the end yields its path as str."""
    for path in rf.step_files:
        try:
            pf = pq.ParquetFile(path, read_dictionary=["run_id", "request_id", "algo"])
            schema = pf.schema_arrow                  # a property that rebuilds: read once
            check_schema_once(path, schema, STEPS_SCHEMA, SAMPLING_FIELDS, plain=True)
            too_big = declared_size_problem(pf.metadata)   # from the footer: nothing materialised
            if too_big:
                raise InputError(path, too_big)
        except InputError as e:
            yield _UnreadableFile(path, e.reason)
            continue
        except Exception as e:  # truncated, not Parquet, unreadable
            yield _UnreadableFile(path, _parquet_reason(e))
            continue
        have = set(schema.names)
        skip = proven_diagnostics(pf.metadata)
        cols = [c for c in columns if c in have and c not in skip]
        rank = "rank" in have
        if rank:
            cols.append("rank")
        n = 0
        try:
            # a small file is decoded on this thread: Arrow's pool costs more than it saves
            for b in _file_batches(pf, path, batch_rows, cols):
                if rank:
                    # one partition per rank: split the batch by rank value
                    rk = b.column(b.schema.get_field_index("rank")).to_numpy(zero_copy_only=False)
                    for v in np.unique(rk):
                        yield b.filter(pa.array(rk == v)), str(path), f"rank {int(v)}"
                else:
                    yield b, str(path), path.name
                n += b.num_rows
        except Exception as e:
            yield _UnreadableFile(path, f"unreadable after {n} rows: {_parquet_reason(e)}")
            continue
        yield str(path)


def _file_batches(pf, path, batch_rows: int, cols):
    """A file's record batches as iter_batches gives them. A small file of one row group
    that fits one batch is read whole (one batch either way): a third of the fixed cost."""
    md = pf.metadata
    if md.num_row_groups == 1 and 0 < md.num_rows <= batch_rows and not is_big_file(path):
        tbl = pf.read(columns=cols, use_threads=False)
        return tbl.combine_chunks().to_batches() if tbl.num_rows else []
    return pf.iter_batches(batch_size=batch_rows, columns=cols, use_threads=is_big_file(path))


# per-node diagnostic lists that no rule reads beyond their length (SA101)
DIAGNOSTIC_LISTS = ("draft_logprob", "target_margin")


def proven_diagnostics(md) -> set:
    """Diagnostic list columns whose shape the Parquet metadata already settles.

    In every row group: either no leaf slot is null (so no row's list is null or empty
    and no value is null) and the leaf count equals node_tokens' (so the lists hold
    N entries in total), or every row is null. Those columns are not decoded (they
    are a quarter of the bytes); when any row group is not settled the column is read
    and checked row by row. What this cannot see: per-row length errors that cancel
    exactly within one row group (SA101 docs)."""
    try:
        names = [md.schema.column(j).path for j in range(md.num_columns)]
        nt = names.index("node_tokens.list.element")
        idx = {c: names.index(f"{c}.list.element") for c in DIAGNOSTIC_LISTS if f"{c}.list.element" in names}
        out = set(idx)
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            ref = rg.column(nt)
            if not ref.is_stats_set or ref.statistics.null_count != 0:
                return set()
            for c, j in idx.items():
                col = rg.column(j)
                if c not in out:
                    continue
                if not col.is_stats_set or col.statistics.null_count is None:
                    out.discard(c)
                    continue
                nulls = col.statistics.null_count
                same = nulls == 0 and col.num_values == ref.num_values
                all_null = nulls == col.num_values == rg.num_rows
                if same:   # values present: the statistics must also prove their range (SA109)
                    lo, hi = DIAGNOSTIC_RANGES[c]
                    s = col.statistics
                    same = bool(s.has_min_max) and s.min >= lo and s.max <= hi
                if not (same or all_null):
                    out.discard(c)
        return out
    except (ValueError, AttributeError, IndexError):
        return set()


SMALL_RUN_BYTES = 8 << 20   # below this, a run's files are read without extra threads


def file_size(path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def is_big_file(path) -> bool:
    return file_size(path) >= SMALL_RUN_BYTES


def is_big_run(rf) -> bool:
    """Whether a run's files (steps and requests together) are big enough for read-ahead
    threads: the step reader and the requests table's decoder decide by this one figure (a
    requests table just under the size, of a run of hundreds of MB, had been decoded on the
    caller's thread while the steps were read ahead)."""
    return sum(file_size(p) for p in (*rf.step_files, *rf.request_files)) >= SMALL_RUN_BYTES




_SCHEMAS_OK: dict = {}   # (expected, optional, plain) -> schemas that passed check_table_schema


def check_schema_once(path, schema: pa.Schema, expected: pa.Schema, optional=(), *, plain=False) -> None:
    """check_table_schema, remembered: a schema seen to pass passes again (the check is
    a function of the schema alone), so a thousand runs written alike check it once.
    Compared with == (a schema's hash formats it: slower than the check it saves)."""
    seen = _SCHEMAS_OK.setdefault((id(expected), id(optional), plain), [])
    if any(schema == s for s in seen):
        return
    check_table_schema(path, _values_of_dictionaries(schema) if plain else schema, expected, optional)
    if len(seen) >= 16:
        seen.clear()
    seen.append(schema)


def _values_of_dictionaries(schema: pa.Schema) -> pa.Schema:
    """Dictionary-encoded string columns (read_dictionary) checked as their values."""
    return pa.schema([pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type) else f
                      for f in schema])


class _ReadAhead:
    """Run a generator in a thread, `depth` items ahead: Parquet decoding (C++, GIL
    released) overlaps the numpy work on the previous batch. The thread starts at
    once (a run's first step batches decode while its requests table is read on the
    caller's thread); dropping the iterator, read to the end or not, stops it."""

    _END = object()

    def __init__(self, gen, depth: int = 2):
        import queue
        import threading
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        q, stop, end = self._q, self._stop, self._END

        def work():   # holds the queue and the event, never the iterator (so it can be dropped)
            try:
                for item in gen:
                    while not stop.is_set():
                        try:
                            q.put(item, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                q.put(end)
            except BaseException as e:  # surfaced in the consumer
                q.put(e)

        threading.Thread(target=work, name="specaudit-check-read", daemon=True).start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        item = self._q.get()
        if item is self._END:
            self._finish()
            raise StopIteration
        if isinstance(item, BaseException):
            self._finish()
            raise item
        return item

    def _finish(self):
        self._done = True
        self._stop.set()

    def __del__(self):
        self._stop.set()


def _recorded_batches(items, result: CheckResult, run_id: str):
    """Record files and bad files as the stream reports them; pass batches on."""
    for item in items:
        if isinstance(item, _UnreadableFile):
            result_bad(result, item.path, item.reason, run_id)
        elif isinstance(item, str):
            result.files_checked.append(item)
        else:
            note_input(item[1])   # named by the CLI if a bug raises on this batch
            if result.on_rows is not None:
                result.on_rows(item[0].num_rows)
            yield item


def _parquet_reason(e: Exception) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "magic bytes" in msg or "Parquet magic" in msg:
        return f"not a Parquet file ({msg})"
    return f"cannot read as Parquet: {msg}"


def open_requests(rf: RunFiles, result: CheckResult, batch_rows: int):
    """The requests table (requests.parquet, or a running run's parts) as a stream of
    batches, or None when no file of it can be opened.

    A file that cannot be opened, or fails mid-stream, is recorded (SA000);
    `state["ok"]` tells whether the whole table was read."""
    opened, state = [], {"ok": True}
    for path in rf.request_files:
        try:
            pf = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering would hold the whole table
            check_table_schema(path, pf.schema_arrow, REQUESTS_SCHEMA)
        except InputError as e:
            result_bad(result, path, e.reason, rf.run_id)
            state["ok"] = False
            continue
        except Exception as e:
            result_bad(result, path, _parquet_reason(e), rf.run_id)
            state["ok"] = False
            continue
        opened.append((path, pf))
    if not opened:
        return None, {"ok": False}

    def gen():
        for path, pf in opened:
            have = set(pf.schema_arrow.names)
            cols = [c for c in REQUEST_READ_COLUMNS if c in have]
            n = 0
            note_input(path)
            try:
                for b in pf.iter_batches(batch_size=min(batch_rows, REQUEST_BATCH_ROWS), columns=cols,
                                         use_threads=is_big_file(path)):
                    n += b.num_rows
                    yield b
            except Exception as e:
                state["ok"] = False
                result_bad(result, path, f"unreadable after {n} rows: {_parquet_reason(e)}", rf.run_id)
                return
            result.files_checked.append(str(path))
    # the table of a big run decodes on a thread of its own, a few batches ahead of
    # request_facts (the caller's thread): Parquet decoding (GIL released) overlaps the
    # facts arithmetic
    if is_big_run(rf):
        return _ReadAhead(gen(), depth=4), state
    return gen(), state


def run_start(rf: RunFiles, result: CheckResult) -> list | None:
    """A run's own problems (SA000) and, when it did not end normally, SA001.

    Returns the reasons it is incomplete ([] when it ended normally), or None when
    the folder holds nothing to check. Shared by check_run and the Spark driver."""
    for prob in rf.problems:
        result_bad(result, prob.path, prob.reason, rf.run_id)
    manifest = rf.manifest
    if manifest is None and not rf.step_files and not rf.request_files:
        return None
    reasons = []
    if not manifest or not manifest.get("finished_at"):
        reasons.append("no finished_at in run.json")
    if not rf.request_files:
        reasons.append("no requests table")
    if reasons:
        why = "; ".join(reasons)
        result.incomplete_runs.append((rf.run_id, why))
        from specaudit.invariants import get_rule
        result.add(get_rule("SA001").finding(run_id=rf.run_id, file=str(rf.run_dir), reason=why))
    return reasons


def run_counts(files_read: bool, requests_opened: bool, manifest) -> bool:
    """Whether a run counts as checked (a killed run's lone run.json counts: SA001, not
    "nothing to check")."""
    return bool(files_read or requests_opened or manifest is not None)


def check_run(rf: RunFiles, rules, result: CheckResult, batch_rows: int = BATCH_ROWS) -> None:
    note_input(rf.run_dir)
    reasons = run_start(rf, result)
    if reasons is None:
        return
    manifest = rf.manifest
    requests, rq_state = (open_requests(rf, result, batch_rows) if rf.request_files
                          else (None, {"ok": False}))
    complete = not reasons
    n_before = len(result.files_checked)
    bad_before = len(result.bad_files)
    # a step file that could not be read makes the run's totals partial: request and
    # aggregate rules that compare with the steps are skipped for this run
    steps_whole = lambda: len(result.bad_files) == bad_before
    steps = iter_step_batches(rf, batch_rows, STEP_READ_COLUMNS)
    # the read-ahead thread pays off only when there is decoding to overlap: a small
    # run is read inline (thread start and hand-offs were most of a tiny run's fixed cost)
    stream = _recorded_batches(_ReadAhead(steps) if is_big_run(rf) else steps, result, rf.run_id)
    check_batches(stream, run_id=rf.run_id, manifest=manifest, rules=rules, result=result, requests=requests,
                  complete=lambda: complete and requests is not None and rq_state["ok"] and steps_whole(),
                  incomplete_reason="; ".join(reasons) or None)
    # a lone run.json counts (SA001); a run whose every data file is bad does not (exit 2)
    lone = manifest if not (rf.step_files or rf.request_files) else None
    if run_counts(len(result.files_checked) > n_before, requests is not None, lone):
        result.runs.append(rf.run_id)
