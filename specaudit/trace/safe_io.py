"""Reading and writing a user's files safely: the one bad-input error and its bounded reads.

Every reader raises InputError (a file and a one-line reason, exit 2 at the CLI) for input a
user can fix. The helpers here refuse what would hang, exhaust memory or replace a device
node before anything is read or written:

    read_limited(path, limit)      a regular file's bytes, at most `limit` (a FIFO never blocks)
    parse_json_bounded(data)       json.loads with NaN, huge numbers and deep nesting refused
    atomic_write_bytes(path, data) write to a temporary name, then rename (never over a device)
"""
from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path


class InputError(Exception):
    """Bad input a user can fix: carries the file and a one-line reason."""

    def __init__(self, path, reason: str):
        self.path = str(path) if path is not None else None
        self.reason = reason
        super().__init__(f"{self.path}: {reason}" if self.path else reason)

    def __reduce__(self):
        # an error raised in a process-pool worker (the parallel log audit, the checker's
        # pools of tiny runs) comes back pickled by concurrent.futures; Exception's default
        # would call __init__ with the message alone, and the pool would break
        # (BrokenProcessPool) instead of giving the one-line error. A subclass's own
        # attributes travel as its state. (Spark tasks get a run's problems as JSON:
        # specaudit.audit.spark_runs.)
        return (type(self), (self.path, self.reason), dict(self.__dict__))


_LAST_INPUT: list = [None]


def note_input(path) -> None:
    """Record the file or folder a reader is working on: when a bug in specaudit
    raises, the CLI names it (`last_input`) in its one-line internal-error message."""
    _LAST_INPUT[0] = str(path) if path is not None else None


def last_input() -> str | None:
    return _LAST_INPUT[0]


MAX_JSON_DEPTH = 64            # nesting a manifest may have (deeper is hostile, not a run)


def regular_file_problem(path) -> str | None:
    """None for a regular file (after symlinks); else why it is refused, in words.

    Devices (a symlink to /dev/zero), FIFOs and sockets are refused before any read:
    a size read from them means nothing, and a FIFO blocks the reader forever."""
    return regular_file_and_size(path)[0]


def regular_file_and_size(path) -> tuple[str | None, int]:
    """(regular_file_problem's answer, the file's size in bytes: -1 when refused)."""
    import stat
    try:
        st = os.stat(path)
    except OSError as e:
        return f"cannot read: {e.strerror or e}", -1
    if stat.S_ISREG(st.st_mode):
        return None, st.st_size
    kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
            else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device" if
            (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)) else "not a regular file")
    return f"not a regular file ({kind}); refused", -1


def read_limited(path, limit: int) -> bytes:
    """The bytes of a regular file, refusing anything else and anything over `limit`
    bytes as actually read (not as stat reports it). Raises InputError.

    Opened non-blocking so a FIFO put in a file's place cannot hang the reader."""
    import stat
    why = regular_file_problem(path)
    if why:
        raise InputError(path, why)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):    # replaced between stat and open
            raise InputError(path, "not a regular file; refused")
        chunks, n = [], 0
        while n <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if n > limit:
        raise InputError(path, f"larger than {limit} bytes; refused")
    return b"".join(chunks)


def _reject_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def parse_json_bounded(data: bytes, path=None, max_depth: int = MAX_JSON_DEPTH):
    """json.loads with every failure as one InputError line: not UTF-8, not JSON,
    NaN/Infinity, numbers too long or beyond float range, nesting deeper than max_depth."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(path, f"not UTF-8 (byte {e.start})") from None
    cur = 0
    in_str = esc = False
    # refuse deep nesting before the recursive decoder sees it: a scan, run only when
    # there are enough brackets for it to matter
    scan = text.count("[") + text.count("{") > max_depth
    for ch in (text if scan else ""):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            cur += 1
            if cur > max_depth:
                raise InputError(path, f"JSON nested deeper than {max_depth} levels; refused")
        elif ch in "]}":
            cur -= 1

    def big_float(s):
        v = float(s)
        if not math.isfinite(v):
            raise ValueError(f"number {s[:20]} is beyond float range")
        return v

    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=big_float)
    except json.JSONDecodeError as e:
        raise InputError(path, f"not JSON ({e.msg} at line {e.lineno})") from None
    except (ValueError, RecursionError) as e:  # NaN, 1e400, a 5000-digit integer
        raise InputError(path, f"not usable JSON ({str(e).splitlines()[0][:120]})") from None


def target_problem(path) -> str | None:
    """None when a file may be written at `path` by rename (nothing there, or a regular file,
    after links); else why not, in words."""
    import stat
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot write: {e.strerror or e}"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder; give a file name"
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) else "not a regular file")
    return f"exists and is not a regular file ({kind}); refusing to replace it (write to a regular file)"


def temporary_beside(path: Path) -> Path:
    """The temporary name a writer fills before renaming it over `path`: hidden, in the
    same folder (a rename within one file system is atomic), one per writer (process and
    thread): two threads writing one path never share it (the vLLM plugin's race wrote a
    part from two threads); the last rename wins."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary name then rename: readers see nothing or the whole file.

    An existing target that is not a regular file (a device such as /dev/null, a FIFO, a
    socket; after links) is refused with InputError: renaming over it would replace the
    device node itself (as root, `--out /dev/null` replaced the system's null device)."""
    path = Path(path)
    why = target_problem(path)
    if why:
        raise InputError(path, why)
    tmp = temporary_beside(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:  # a failed write (disk full) leaves no temporary behind
        if os.path.lexists(tmp):
            os.unlink(tmp)
