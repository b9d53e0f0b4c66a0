"""Writes never touch evidence: the one guard every `-o` / `--out` goes through.

    from specaudit.outfile import write_output, guard_output_dir
    write_output(args.output, text, inputs=args.paths)   # refuses, or writes atomically

Words:
    evidence   every file a command reads: the input paths themselves, and for an
               input that is (or holds) a trace dataset, every file of every run
               folder in it (run.json, steps-*.parquet, requests.parquet, anything else
               there) and the run folders themselves. A file that is not a trace file
               (an engine log, a Prometheus scrape, JSON records) is evidence alone:
               its folder is not a run folder, so `-o` may write beside it
    atomic     written under a hidden temporary name in the same folder, fsync'ed,
               then renamed over the target: a reader sees the old file or the whole
               new one, never half (a failed write leaves no temporary behind)

A refused path raises InputError (one line, exit 2) before anything is written.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from specaudit.trace.safe_io import InputError, atomic_write_bytes, target_problem
from specaudit.trace.schema import discover

TRACE_FILE_RE = r"^(run\.json|(steps|requests)(-.*)?\.parquet)$"


def _is_trace_file(p: Path) -> bool:
    """run.json or a steps/requests Parquet part: reading it reads its run folder."""
    return re.match(TRACE_FILE_RE, p.name) is not None


def evidence(inputs) -> tuple[set[Path], set[Path]]:
    """(files, run folders) read from the inputs, resolved. Inputs that do not exist
    or hold no trace add only themselves (a log file, a Prometheus text file)."""
    files: set[Path] = set()
    dirs: set[Path] = set()
    for raw in inputs or ():
        if raw is None or "://" in str(raw):
            continue
        p = Path(raw)
        if not p.exists():
            continue
        if p.is_file():
            files.add(p.resolve())
            if not _is_trace_file(p):
                continue  # a log / scrape / records file: only itself is read
        try:
            runs = discover([p])
        except (InputError, OSError, ValueError):
            continue
        for rf in runs:
            d = Path(rf.run_dir).resolve()
            dirs.add(d)
            try:
                files.update(f.resolve() for f in d.iterdir())
            except OSError:
                pass
    return files, dirs


def guard_output(path, inputs, flag: str = "-o") -> Path:
    """The output path, or InputError when writing it would overwrite evidence, write
    into a run folder, or cannot work (a folder, a missing parent folder)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(path, f"{flag}: is a folder; give a file name")
    why = target_problem(path)   # /dev/null, a FIFO, a socket: never renamed over
    if why:
        raise InputError(path, f"{flag}: {why}")
    if not path.parent.exists():
        raise InputError(path, f"{flag}: folder {path.parent} does not exist")
    rp = path.resolve()
    files, dirs = evidence(inputs)
    if rp in files:
        raise InputError(path, f"{flag}: that is one of the files this command reads; refusing to overwrite it")
    if rp.parent in dirs:
        raise InputError(path, f"{flag}: inside the run folder {rp.parent}; write results elsewhere")
    return path


def guard_output_dir(path, inputs, flag: str = "--out") -> Path:
    """An output folder, or InputError when it is (or is inside) a run folder read."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(path, f"{flag}: exists and is not a folder")
    rp = path.resolve()
    _, dirs = evidence(inputs)
    for d in dirs:
        if rp == d or d in rp.parents:
            raise InputError(path, f"{flag}: is the run folder {d} (or inside it); write results elsewhere")
    return path


def _is_run_folder(d: Path) -> bool:
    """A folder a trace run lives in: hive-named, or holding run.json or a steps part."""
    if d.name.startswith("run_id="):
        return True
    try:
        return any(_is_trace_file(Path(n)) for n in os.listdir(d))
    except OSError:
        return False


def guard_not_in_run_folder(path, flag: str = "--out") -> Path:
    """An output folder for a command that reads no trace (dashboards): InputError when it
    is, or is inside, a run folder (its files would sit among a run's evidence)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(path, f"{flag}: exists and is not a folder")
    rp = path.resolve()
    for d in (rp, *rp.parents):
        if d.is_dir() and _is_run_folder(d):
            raise InputError(path, f"{flag}: is the run folder {d} (or inside it); write results elsewhere")
    return path


def atomic_write(path, data: bytes | str) -> None:
    """Temporary name in the same folder, fsync, rename; the temporary never stays."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    try:
        atomic_write_bytes(path, data)  # the contract's one atomic writer (trace/schema.py)
    except OSError as e:
        raise InputError(path, f"cannot write: {e.strerror or e}") from None


def write_output(path, data: bytes | str, inputs=(), flag: str = "-o", announce: bool = True) -> Path:
    """guard_output, then atomic_write; says what it wrote on stderr (every writer does)."""
    path = guard_output(path, inputs, flag)
    atomic_write(path, data)
    if announce:
        say_wrote(path)
    return path


def say_wrote(path) -> None:
    """`wrote PATH (N bytes)` on stderr: stdout stays the command's answer."""
    import sys
    try:
        size = f" ({Path(path).stat().st_size:,} bytes)"
    except OSError:
        size = ""
    print(f"wrote {path}{size}", file=sys.stderr)
