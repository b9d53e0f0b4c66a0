"""The lines of an engine's file, streamed in bounded memory (Lines), and what a paste wraps
around them (unwrap).

Lines reads READ_CHUNK binary blocks and yields (line number, text); with a reader's
markers it decodes only the lines that hold one. check_path refuses what is no text file
(a folder, a FIFO, binary data) before anything is read. The parallel audit
(sources/parallel.py) reads byte ranges of the same file through the same class.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from specaudit.audit.sources.reading import note
from specaudit.trace.safe_io import InputError

MAX_LINE = 1024 * 1024          # a longer line is not a log line: skipped with a note
READ_CHUNK = 4 * 1024 * 1024    # Lines reads the file in blocks of this size


_MD_QUOTE = re.compile(r"^[ \t]{0,3}(?:>[ \t]?)+")
_MD_BULLET = re.compile(r"^[ \t]{0,3}[-*+][ \t]+(?=\S)")
_MD_FENCE = re.compile(r"^[ \t]{0,3}(?:```|~~~)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def unwrap(text: str) -> str:
    """A pasted line without what was wrapped around it: Markdown `>` quotes and a leading
    `- ` / `* ` bullet, a code fence (the fence line itself reads as blank), terminal colour
    codes and a Windows line end. The engine's own text is left as printed."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    c = text[:1]
    if c and c in " \t>-*+`~":
        if _MD_FENCE.match(text):
            return ""
        text = _MD_QUOTE.sub("", text, count=1)
        text = _MD_BULLET.sub("", text, count=1)
    return text.rstrip("\r")


def check_path(path) -> Path:
    from specaudit.inputs import open_input
    p = Path(path)
    if os.path.isdir(p):
        raise InputError(p, "is a folder; an engine log or a metrics scrape is one file")
    try:
        with open_input(p) as f:   # regular files only: a FIFO or a device would block or never end
            head = f.read(4096)
    except OSError as e:
        raise InputError(p, f"cannot read: {e.strerror or e}") from None
    if b"\x00" in head:
        raise InputError(p, "binary file, not a log or Prometheus text (a trace dataset? use the folder)")
    return p


def progress_bar(p: Path):
    """A tqdm byte counter on a terminal (stderr), None otherwise."""
    import sys
    try:
        size = p.stat().st_size
    except OSError:
        return None
    if size < 64 * 1024 * 1024 or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {p.name}", leave=False, file=sys.stderr)


class Lines:
    """The lines of a file, streamed: (line number, text) with bounded memory.

    Read in READ_CHUNK binary blocks and split in C (no per-line readline). With
    `markers` (a tuple of byte strings, or a compiled bytes regex) only the lines holding
    one of them are decoded and yielded, numbered as in the file: a reader's prefilter. For
    a block of plain ASCII lines the markers are found with bytes.find over the whole block
    and only the lines around the hits are touched, so the noise of a server log costs no
    Python work per line; other blocks are filtered line by line. Bytes that are not UTF-8 are replaced
    (and noted once, whether or not that line is yielded); a line over MAX_LINE bytes is
    skipped with a note; a file cut mid-line yields its last partial line like any other
    (the parsers note it as truncated when it does not parse). `notes` collects these.
    Memory: one block plus one line (at most MAX_LINE), whatever the file size.
    """

    def __init__(self, path, progress: bool = True, markers=None, start: int = 0, end: int | None = None,
                 first_line: int = 1, counter=None):
        self.path = check_path(path)
        self.notes: list[dict] = []
        self.progress = progress
        self.markers = markers
        self.unterminated = None   # number of a last line with no newline (cut mid-write?)
        # a byte range [start, end) that begins at a line start, numbered from first_line
        # (the parallel audit); counter: a shared multiprocessing.Value of bytes read
        self.start, self.end, self.first_line, self.counter = start, end, first_line, counter
        self.marks = tuple(markers) if isinstance(markers, (tuple, list)) else None
        if self.marks is not None:
            import re
            self.markers = re.compile(b"|".join(re.escape(m) for m in self.marks))

    def __iter__(self):
        bar = progress_bar(self.path) if self.progress and self.counter is None else None
        search = self.markers.search if self.markers is not None else None
        bad_utf8 = False
        i = self.first_line - 1
        left = self.end - self.start if self.end is not None else None
        try:
            from specaudit.inputs import open_input
            with open_input(self.path) as f:
                if self.start:
                    f.seek(self.start)
                rest = b""            # the unfinished last line of the previous block
                skipping = 0          # bytes of an over-long line being drained (0: none)
                while True:
                    if left is None:
                        block = f.read(READ_CHUNK)
                    else:
                        block = f.read(min(READ_CHUNK, left)) if left > 0 else b""
                        left -= len(block)
                    if bar is not None and block:
                        bar.update(len(block))
                    if self.counter is not None and block:
                        with self.counter.get_lock():
                            self.counter.value += len(block)
                    if not block:
                        raws = [rest] if rest and not skipping else []
                        if raws:
                            self.unterminated = i + 1
                        if skipping:  # an over-long last line without a newline
                            i += 1
                            self.notes.append(note(self.path, i, f"line of {skipping + len(rest)} bytes skipped "
                                                                 "(not a log line)"))
                        rest = b""
                    else:
                        raws = (rest + block).split(b"\n") if rest else block.split(b"\n")
                        rest = raws.pop()
                        if skipping:
                            if not raws:      # still inside the long line
                                skipping += len(rest)
                                rest = b""
                                continue
                            i += 1
                            self.notes.append(note(self.path, i, f"line of {skipping + len(raws[0]) + 1} bytes "
                                                                 "skipped (not a log line)"))
                            skipping = 0
                            raws = raws[1:]
                        if len(rest) > MAX_LINE:
                            skipping, rest = len(rest), b""
                    if self.marks is not None and raws and max(map(len, raws)) <= MAX_LINE \
                            and all(map(bytes.isascii, raws)):
                        yield from self._hits(raws, i)
                        i += len(raws)
                        if not block:
                            break
                        continue
                    for raw in raws:
                        i += 1
                        if len(raw) > MAX_LINE:
                            self.notes.append(note(self.path, i, f"line of {len(raw) + 1} bytes skipped (not a log "
                                                                 "line)"))
                            continue
                        if search is not None and search(raw) is None:
                            if not bad_utf8 and not raw.isascii():
                                try:
                                    raw.decode("utf-8")
                                except UnicodeDecodeError:
                                    bad_utf8 = True
                                    self.notes.append(note(self.path, i, "bytes that are not UTF-8 (replaced; first "
                                                                         "such line shown)",
                                                           raw.decode("utf-8", errors="replace")))
                            continue
                        try:
                            text = raw.decode("utf-8")
                        except UnicodeDecodeError:
                            text = raw.decode("utf-8", errors="replace")
                            if not bad_utf8:
                                bad_utf8 = True
                                self.notes.append(note(self.path, i, "bytes that are not UTF-8 (replaced; first such "
                                                                     "line shown)", text))
                        yield i, unwrap(text)
                    if not block:
                        break
        except OSError as e:
            raise InputError(self.path, f"cannot read: {e.strerror or e}") from None
        finally:
            if bar is not None:
                bar.close()


    def _hits(self, raws: list, i: int):
        """The lines of raws (plain ASCII, none over-long; line i + 1 first) that hold a
        marker, found by bytes.find over the joined block, in file order."""
        buf = b"\n".join(raws)
        spans: dict = {}
        for m in self.marks:
            p = buf.find(m)
            while p >= 0:
                ls = buf.rfind(b"\n", 0, p) + 1
                le = buf.find(b"\n", p)
                if le < 0:
                    le = len(buf)
                spans[ls] = le
                p = buf.find(m, le + 1)
        newlines, prev = 0, 0   # newlines before ls: the line number is i + 1 + newlines
        for ls in sorted(spans):
            newlines += buf.count(b"\n", prev, ls)
            prev = ls
            yield i + 1 + newlines, unwrap(buf[ls:spans[ls]].decode("ascii"))

