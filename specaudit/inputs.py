"""The one way a file given by a user is opened: regular files only, decided on the open file.

    from specaudit.inputs import open_input, read_input_bytes, read_input_text
    with open_input(path) as f:            # a binary file object, or InputError (one line, exit 2)
        ...
    text = read_input_text(path, limit=4 << 20, what="--prompts")

Why one helper: a named pipe, a character device (/dev/zero, /dev/tty) or a socket given
where a file is read either blocks the reader forever (a FIFO with no writer) or never
ends (/dev/zero). Every reader of a user-named file (an engine log, --profile, --prompts,
query -f, --ca-file, a rule file in --invariants DIR, a run.json reached by diff) goes
through open_input.

How: the path is opened once, non-blocking (a FIFO opens at once instead of waiting for a
writer), links followed; the decision is taken from fstat of that open descriptor, so
nothing can be swapped in between a check and the open (no stat-then-open race). A
regular file then gets its blocking mode back and is returned; anything else is closed
and refused, naming what it is.
"""
from __future__ import annotations

import errno
import os
import stat

from specaudit.trace.safe_io import InputError


def kind_of(mode: int) -> str:
    """What a non-regular st_mode is, in words."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _why(e: OSError) -> str:
    if e.errno == errno.ENOENT:
        return "no such file"
    if e.errno == errno.ENXIO:   # a socket path or a FIFO opened for writing: not a file
        return "not a regular file (a socket); refused"
    return f"cannot read: {e.strerror or e}"


def open_input(path, what: str = ""):
    """A binary file object over the regular file at `path` (after links), or InputError.

    `what` (e.g. "--prompts") prefixes the reason so the one-line error names the flag."""
    pre = f"{what}: " if what else ""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.EISDIR:
            raise InputError(path, f"{pre}is a folder; give a file") from None
        raise InputError(path, pre + _why(e)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            k = kind_of(mode)
            tail = "; give a file" if k == "a folder" else "; refused (only regular files are read)"
            raise InputError(path, f"{pre}not a regular file ({k}){tail}")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_input(path, what: str = "") -> None:
    """open_input and close: the path is a readable regular file, or InputError."""
    open_input(path, what).close()


def read_input_bytes(path, limit: int, what: str = "") -> bytes:
    """The whole regular file, refusing anything over `limit` bytes as actually read."""
    pre = f"{what}: " if what else ""
    with open_input(path, what) as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise InputError(path, pre + _why(e)) from None
    if len(data) > limit:
        raise InputError(path, f"{pre}larger than {limit} bytes; refused")
    return data


def read_input_text(path, limit: int, what: str = "", encoding: str = "utf-8", errors: str = "strict") -> str:
    """read_input_bytes decoded; bytes that are not `encoding` are one InputError line."""
    data = read_input_bytes(path, limit, what)
    try:
        return data.decode(encoding, errors)
    except UnicodeDecodeError as e:
        pre = f"{what}: " if what else ""
        raise InputError(path, f"{pre}not {encoding.upper()} text (byte {e.start})") from None


MAX_JSONL_BYTES = 1 << 30   # a per-request export (AIPerf, llama-server responses, greedy outputs) read whole


def iter_jsonl(path, what: str, limit: int = MAX_JSONL_BYTES):
    """(line number, record) for each non-blank line of a JSONL input, opened by read_input_text
    (regular files only, bounded); a line that is not JSON is one InputError naming it."""
    import json
    for i, line in enumerate(read_input_text(path, limit, what).splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except (ValueError, RecursionError):
            raise InputError(path, f"line {i} is not JSON") from None
