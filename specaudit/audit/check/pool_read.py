"""Reading a pool's files: a task's tiny runs as one steps table and one requests table,
each member's rows in member order, and which members' rows are plain enough to pool.

    for idx, steps, st_n, reqs, rq_n in read_task(members, use_polars):
        idx, steps, st_n, reqs, rq_n = plain_rows(members, idx, steps, st_n, reqs, rq_n)

Workers read with one polars scan per table (read_with_polars); otherwise, or when that
scan fails, each file is read with Arrow (read_with_arrow). Also the Arrow arrays the
pool builds from buffers (pa.array() would import pandas).
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from specaudit.audit.check.stream import REQUEST_READ_COLUMNS, STEP_READ_COLUMNS, check_schema_once
from specaudit.invariants.arrow import valid_mask
from specaudit.invariants.frame import to_np
from specaudit.trace import schema as contract  # the trace contract: its schemas, RunFiles, InputError


def read_task(members: list, use_polars: bool):
    """A task's rows, per schema the contract accepts: (member indices, steps, per-member
    step rows, requests, per-member request rows). Workers read with one polars scan per
    table (read_with_polars, when use_polars); otherwise, or when that scan fails, each file
    is read with Arrow and the members are grouped by their files' schemas (each schema checked once). A
    member in none of them is checked alone, where whatever is odd gets reported."""
    batch = read_with_polars(members) if use_polars else None
    if batch is not None:
        yield batch
        return
    got = [read_with_arrow(rf) for rf in members]
    kinds: list = []                # distinct (steps schema, requests schema, member indices)
    for i, g in enumerate(got):
        if g is None:
            continue
        k = next((kind for kind in kinds if kind[0] == g[2] and kind[1] == g[3]), None)
        if k is None:
            k = (g[2], g[3], [])
            kinds.append(k)
        k[2].append(i)
    for schema, rschema, idx in kinds:
        if _schemas_poolable(members[idx[0]], schema, rschema):   # else check_run reports the schema
            yield (idx, pa.concat_tables([got[i][0] for i in idx]), np.array([got[i][0].num_rows for i in idx]),
                   pa.concat_tables([got[i][1] for i in idx]), np.array([got[i][1].num_rows for i in idx]))


def plain_rows(members: list, idx: list, steps: pa.Table, st_n, reqs: pa.Table, rq_n):
    """The read rows without the members whose rows are not plain (a null run or request
    id, a step row of another run: SA108), who are left to be checked alone."""
    ks = np.repeat(np.arange(len(idx)), st_n)    # [S] position in idx of each step row's member
    kq = np.repeat(np.arange(len(idx)), rq_n)    # [Q] the same for request rows
    bad = np.zeros(len(idx), dtype=bool)
    for t, k, cols in ((steps, ks, ("run_id", "request_id")), (reqs, kq, ("request_id",))):
        for c in cols:
            valid = valid_mask(t.column(c).combine_chunks())
            if valid is not None:
                bad[k[~valid]] = True
    want = string_array([str(members[i].run_id) for i in idx]).take(int32_array(ks))
    bad[ks[to_np(pc.not_equal(steps.column("run_id"), want), fill=True)]] = True   # (to_np: no pandas import)
    if not bad.any():
        return idx, steps, np.asarray(st_n), reqs, np.asarray(rq_n)
    keep = ~bad
    return ([i for i, ok in zip(idx, keep) if ok], steps.filter(_bool_array(keep[ks])), np.asarray(st_n)[keep],
            reqs.filter(_bool_array(keep[kq])), np.asarray(rq_n)[keep])


def _schemas_poolable(rf: contract.RunFiles, schema: pa.Schema, rschema: pa.Schema) -> bool:
    """The files' schemas are the contract's (else the run is checked alone, and told)."""
    try:
        check_schema_once(rf.step_files[0], schema, contract.STEPS_SCHEMA, contract.SAMPLING_FIELDS, plain=True)
        check_schema_once(rf.request_files[0], rschema, contract.REQUESTS_SCHEMA)
    except contract.InputError:
        return False
    names = schema.names   # (a property that builds a new list on every access)
    return "rank" not in names and not any(c in names for c in contract.SAMPLING_COLUMNS)   # per-rank, sampled: alone


def read_with_arrow(rf: contract.RunFiles):
    """(steps table, requests table, their files' schemas) of a tiny run read with Arrow,
    or None when its files read unusually (it is then checked alone, where whatever is odd
    gets reported)."""
    try:
        st, schema = _read_small_file(rf.step_files[0], STEP_READ_COLUMNS)
        if st is None:
            return None
        rq, rschema = _read_small_file(rf.request_files[0], REQUEST_READ_COLUMNS)
        if rq is None:
            return None
    except Exception:   # noqa: BLE001  (any trouble: check_run reads it again and reports it)
        return None
    return st, rq, schema, rschema


def _read_small_file(path, wanted):
    """(the columns of `wanted` the file has, its whole Arrow schema) of a small Parquet
    file, read with Arrow's file reader directly: ParquetFile's Python setup (filesystem
    resolution, nested-path maps) is a third of a tiny file's cost. Every column of a
    trace is a primitive or a list of primitives, so a field's index is its leaf's;
    (None, schema) when that does not hold (the file is then read the general way)."""
    try:
        from pyarrow._parquet import ParquetReader
        r = ParquetReader()
        r.open(pa.OSFile(str(path)), use_memory_map=False, pre_buffer=False)
    except (ImportError, TypeError):   # another pyarrow's private API: the public reader
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
        return pf.read(columns=[c for c in wanted if c in schema.names], use_threads=False), schema
    schema = r.schema_arrow
    if r.metadata.num_columns != len(schema) or contract.declared_size_problem(r.metadata):
        return None, schema   # read the general way, which reports the problem
    names = schema.names
    idx = [names.index(c) for c in wanted if c in names]
    return r.read_all(column_indices=idx, use_threads=False), schema


# Reading a task's files. Arrow's Parquet reader spends ~0.4 ms opening a file and
# ~60 us per column chunk, whatever the rows: ~2.5 ms for a tiny run's two files, most
# of a pool's time. Polars scans a list of files in one plan at ~1 ms per run (measured
# side by side: scripts/bench_tiny_runs.py), so worker processes read a task with it.
# Only forked workers do, and only when the parent has not loaded polars itself: its
# thread pool does not survive a fork. Polars is strict where it matters here: a file
# whose columns or types differ from the task's first file fails the scan (missing or
# extra column, another type; a large_string where the first has string is the same
# column to both readers), and any failure means the task is read file by file with
# Arrow (read_with_arrow), as before.
_PATH_COL = "\x1fpath"   # the scan's file-path column (no trace column holds \x1f)


def _import_polars():
    """polars, imported in this worker with one thread (a worker per core already)."""
    os.environ.setdefault("POLARS_MAX_THREADS", "1")
    import polars
    return polars


def read_with_polars(members: list):
    """(member indices, steps, per-member step rows, requests, per-member request rows)
    of a task's tiny runs, read by one polars scan per table; None when the scan cannot
    be made (then read_task reads file by file)."""
    try:
        pl = _import_polars()
        sf = [str(rf.step_files[0]) for rf in members]
        qf = [str(rf.request_files[0]) for rf in members]
        schema, rschema = pq.read_schema(sf[0]), pq.read_schema(qf[0])
        if (any(pa.types.is_dictionary(f.type) for f in (*schema, *rschema))
                or not _schemas_poolable(members[0], schema, rschema)):
            return None
        steps, ks = _scan_in_file_order(pl, sf, [c for c in STEP_READ_COLUMNS if c in schema.names])
        reqs, kq = _scan_in_file_order(pl, qf, [c for c in REQUEST_READ_COLUMNS if c in rschema.names])
        P = len(members)
        return list(range(P)), steps, np.bincount(ks, minlength=P), reqs, np.bincount(kq, minlength=P)
    except Exception:   # noqa: BLE001  (any trouble: the files are read one by one, as before)
        return None


def _scan_in_file_order(pl, files: list[str], cols: list[str]) -> tuple[pa.Table, np.ndarray]:
    """(the files' rows as one Arrow table with the Arrow reader's types, each row's file
    index), raising when a file's rows are not in file order."""
    df = pl.scan_parquet(files, hive_partitioning=False, glob=False, include_file_paths=_PATH_COL,
                         missing_columns="raise", extra_columns="raise", cast_options=None,
                         credential_provider=None).select([*cols, _PATH_COL]).collect().rechunk()
    t = df.to_arrow()
    enc = t.column(_PATH_COL).combine_chunks().dictionary_encode()
    where = {f: i for i, f in enumerate(files)}
    k = np.array([where[f] for f in enc.dictionary.to_pylist()], dtype=np.int64)[
        to_np(enc.indices)]
    if len(k) and (np.diff(k) < 0).any():
        raise ValueError("rows out of file order")
    t = t.drop_columns([_PATH_COL])
    return t.cast(pa.schema([pa.field(f.name, _arrow_type(f.type)) for f in t.schema])), k


def _arrow_type(t: pa.DataType) -> pa.DataType:
    """The type Arrow's Parquet reader gives a column polars hands back (large or view
    strings and lists -> the plain ones)."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.list_(pa.field("element", _arrow_type(t.value_type)))
    return t


def _bool_array(a: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(pa.bool_(), len(a), [None, pa.py_buffer(np.packbits(a, bitorder="little"))])


def unique_request_ids(t: pa.Table, counts) -> pa.Table:
    """A pool's table (its members' rows in member order, counts[k] rows of member k),
    request_id -> "<k>\\x1f<request_id>" for member k: distinct across the pool's runs."""
    t = t.combine_chunks()
    k = np.repeat(np.arange(len(counts), dtype=np.int32), np.asarray(counts, dtype=np.int64))
    prefix = string_array([str(j) for j in range(len(counts))]).take(int32_array(k))
    i = t.schema.get_field_index("request_id")
    return t.set_column(i, "request_id", pc.binary_join_element_wise(prefix, t.column(i),
                                                                     string_array(["\x1f"])[0]))


# Arrow arrays built from their buffers: pa.array() of Python or numpy values (and a
# Python str handed to a compute function) imports pandas on first use, half a second
# of a small check
def int32_array(a: np.ndarray) -> pa.Array:
    a = np.ascontiguousarray(a, dtype=np.int32)
    return pa.Array.from_buffers(pa.int32(), len(a), [None, pa.py_buffer(a)])


def string_array(xs: list[str]) -> pa.Array:
    b = [x.encode() for x in xs]
    off = np.zeros(len(b) + 1, dtype=np.int32)
    off[1:] = np.cumsum([len(x) for x in b])
    return pa.Array.from_buffers(pa.string(), len(b), [None, pa.py_buffer(off), pa.py_buffer(b"".join(b))])

