"""Dataset discovery: which trace runs and Parquet files the views read, and which rollups
stand in for them.

find_dataset() discovers the runs under the paths (schema.discover), leaves out a copied
run and any file that is not readable Parquet with the contract's columns (named in its
run's `problems` and in Dataset.skipped), and pairs each data file with its rollup when the
fingerprint matches (trace/rollup.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from specaudit.postmortem.sql_guard import one_line
from specaudit.trace.rollup import RUN_ROLLUP, rollup_problem, run_rollup_covers
from specaudit.trace.rollup import rollup_path as _rollup_path
from specaudit.trace.safe_io import InputError
from specaudit.trace.schema import REQUESTS_SCHEMA, STEPS_SCHEMA, check_table_schema, declared_size_problem, discover


@dataclass
class Dataset:
    """What connect() found: the run partitions and their files."""

    runs: list
    step_files: list[Path] = field(default_factory=list)
    request_files: list[Path] = field(default_factory=list)
    skipped: list = field(default_factory=list)      # InputError per file left out
    # data file -> its rollup, for the rollups whose fingerprint matches (trace/rollup.py)
    rollups: dict = field(default_factory=dict)
    rollup_notes: dict = field(default_factory=dict)  # run_dir -> what was used, in words
    schemas: dict = field(default_factory=dict)       # data file -> its Arrow schema (as read)

    def same_columns(self, files) -> bool:
        """Every file's schema known and equal (names, order, types)."""
        got = [self.schemas.get(f) for f in files]
        return bool(got) and got[0] is not None and all(g is not None and g.equals(got[0]) for g in got[1:])

    @property
    def files(self) -> list[Path]:
        return self.step_files + self.request_files + list(dict.fromkeys(self.rollups.values()))


def find_dataset(paths, rollups: bool = True) -> Dataset:
    """discover() the runs under paths (InputError when there are none).

    A file that is not readable Parquet, or lacks a required column or has it with the
    wrong type, is left out of the views and named in its run's `problems` (and in
    Dataset.skipped): the rest of the trace stays queryable; `specaudit check` reports
    such files as SA000. rollups=False reads every figure from the raw rows; otherwise
    a data file's rollup stands in for it when its fingerprint (name, rows, bytes)
    matches, and the run's `rollups` column says which were used and why others were not.
    """
    runs = discover([str(p) for p in paths])
    if not runs:
        raise InputError(None, "no trace runs found")
    # a run copied into a second folder (same run id) is counted once: the first folder
    dups = [rf for rf in runs if rf.duplicate_of is not None]
    runs = [rf for rf in runs if rf.duplicate_of is None]
    ds = Dataset(runs=runs)
    ds.skipped += [InputError(rf.run_dir, f"run {rf.run_id} is also in {rf.duplicate_of}: left out "
                                          "(a copy; specaudit check warns SA002)") for rf in dups]
    for rf in runs:
        used, files, why = 0, 0, []
        usable = []
        for f, expected, out in [(f, STEPS_SCHEMA, ds.step_files) for f in rf.step_files] + \
                                [(f, REQUESTS_SCHEMA, ds.request_files) for f in rf.request_files]:
            rows = _usable(rf, f, expected, ds)
            if rows is not None:
                usable.append((f, rows, out))
        # the run's step rollup (written at close) stands in for the step files it names
        covered: set = set()
        if rollups and rf.step_files:
            names, problem = run_rollup_covers(rf.run_dir, {f.name: r for f, r, o in usable if o is ds.step_files})
            covered = set(names)
            if problem not in (None, "absent"):
                why.append(f"{RUN_ROLLUP}: {problem}")
        for f, rows, out in usable:
            out.append(f.resolve())
            files += 1
            if not rollups:
                continue
            if out is ds.step_files and f.name in covered:
                ds.rollups[f.resolve()] = (Path(rf.run_dir) / RUN_ROLLUP).resolve()
                used += 1
                continue
            problem = rollup_problem(f, rows)
            if problem is None:
                ds.rollups[f.resolve()] = _rollup_path(f).resolve()
                used += 1
            elif problem != "absent":
                why.append(f"{f.name}: {problem}")
        if files:
            note = ("raw rows (rollups not used)" if not rollups else "no rollups: raw rows" if not used
                    else f"rollups for {used} of {files} files" + (", the rest from raw rows" if used < files else ""))
            if why:
                note += "; ignored: " + "; ".join(why[:5]) + (f" (and {len(why) - 5} more)" if len(why) > 5 else "")
            ds.rollup_notes[str(rf.run_dir)] = note
    if not ds.step_files and not ds.request_files and all(rf.manifest is None for rf in runs):
        # no readable step or request file and no manifest: nothing here is a trace, and
        # empty views would read as "all clean"
        errs = ds.skipped + [p for rf in runs for p in rf.problems]
        e = errs[0] if errs else InputError(runs[0].run_dir, "no step files")
        more = f" (and {len(errs) - 1} more problems)" if len(errs) > 1 else ""
        raise InputError(getattr(e, "path", None), f"not a trace run: {getattr(e, 'reason', e)}{more}")
    return ds


def _usable(rf, path: Path, expected: pa.Schema, ds: Dataset) -> int | None:
    """The file's row count when it can be read with the expected columns, else None
    (the problem recorded on the run and in ds.skipped)."""
    import pyarrow.parquet as pq
    try:
        md = pq.read_metadata(path)
        schema = md.schema.to_arrow_schema()
        check_table_schema(path, schema, expected)
        too_big = declared_size_problem(md)   # a row declared above MAX_NODES: never given to DuckDB
        if too_big:
            raise InputError(path, too_big)
        ds.schemas[path.resolve()] = schema.remove_metadata()
        return md.num_rows
    except InputError as e:
        err = e
    except Exception as e:
        err = InputError(path, f"not readable Parquet ({type(e).__name__}: {one_line(e)})")
    rf.problems.append(err)
    ds.skipped.append(err)
    return None
