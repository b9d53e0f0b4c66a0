"""A file streamed into Readings of at most CHUNK_WINDOWS windows each, in bounded memory.

    for chunk in iter_readings("huge.log"): ...     # each: the windows of one chunk
    reading = read_source("metrics.txt")            # the whole file as one Reading

parse_chunks runs the lines (sources/lines.py) through a reader's Parser and hands over a
chunk whenever it holds `chunk` windows; config, conventions and reader state carry over.
A file that gives no window at all is NoFigures, naming what it was recognised as when its
own words say (a log detected by its lines, a record or series family the parser saw).
"""
from __future__ import annotations

from pathlib import Path

from specaudit.audit.sources.detection import SOURCES, log_markers, reader_modules, resolve
from specaudit.audit.sources.lines import Lines
from specaudit.audit.sources.reading import MAX_NOTES, NoFigures, Reading
from specaudit.trace.safe_io import InputError

CHUNK_WINDOWS = 10_000          # audit_file runs the rules per chunk of windows (bounded memory)


def parse_chunks(path, source: str, forced: bool, lines, parser, chunk: int, stats: dict):
    """Readings of at most `chunk` windows from `lines` through `parser`; stats gets the
    windows and notes counted and the last chunk's notes."""
    mods = reader_modules()
    # lines of another engine past the part detection read (a mixed file): noted, not read
    others = [] if forced or SOURCES[source][1] != "log" else \
        [(n, m.looks_like_line) for n, m in mods.items() if n != source and SOURCES[n][1] == "log"]
    mixed = 0
    total = 0
    notes_total = 0
    emitted = False
    for i, ln in lines:
        for name, looks in others:
            if looks(ln):
                if not mixed:
                    parser.skip(i, f"a {name} line in a {source} file (mixed engines: this and later such lines "
                                   "are not read; split the file per engine)", ln)
                mixed += 1
                break
        else:
            if i == lines.unterminated:
                parser.unterminated = i
            parser.feed(i, ln)
        if len(parser.reading.windows) >= chunk:
            r = parser.take()
            total += len(r.windows)
            r.notes = lines.notes + r.notes
            lines.notes = []
            notes_total += len(r.notes)
            emitted = True
            yield r
            del r   # (held here, the chunk would live on while the next one is read: two in memory)
    r = parser.finish()
    r.notes = lines.notes + r.notes
    total += len(r.windows)
    notes_total += len(r.notes)
    stats.update(windows=total, notes=notes_total, last_notes=r.notes[:1],
                 recognised=getattr(parser, "recognised", None), why=getattr(parser, "why_empty", None),
                 config=dict(parser.reading.config), all_notes=r.notes[:MAX_NOTES] if not total else ())
    if r.windows or not emitted or r.notes:
        yield r


def no_figures(path, source, stats, recognised=None) -> InputError:
    """The NoFigures error of a file read as `source` that gave no window (stats from
    parse_chunks: how many lines were skipped, and the first one's reason)."""
    last = stats.get("last_notes")
    return NoFigures(path, f"read as {source}, but no usable spec-decoding figures in it"
                     + (f" ({stats['notes']} lines skipped; line {last[0]['line']}: {last[0]['reason']})"
                        if last else ""), recognised=recognised, notes=stats.get("all_notes", ()),
                     why=stats.get("why"), config=stats.get("config"))


def iter_readings(path, source: str | None = None, chunk: int = CHUNK_WINDOWS):
    """Stream a file into Readings of at most `chunk` windows each (the last may be
    smaller); each carries the config and notes seen so far. Bounded memory for any size."""
    forced = source is not None
    p, source = resolve(path, source)
    yield from read_chunks(p, path, source, forced, chunk)


def recognised_as(source: str, forced: bool, stats: dict) -> str | None:
    """What a file without figures was recognised as by its own words: a log detected by
    its lines, or what the parser saw (a record or series family of an engine)."""
    if stats.get("recognised"):
        return stats["recognised"]
    if not forced and SOURCES[source][1] == "log":
        return SOURCES[source][2].split(":")[0]
    return None


def read_chunks(p: Path, path, source: str, forced: bool, chunk: int = CHUNK_WINDOWS):
    """The Readings of a checked path p read as `source` (iter_readings after resolve();
    `forced`: the source was given, not detected). NoFigures when no chunk has a window."""
    mods = reader_modules()
    lines = Lines(p, markers=log_markers(mods) if SOURCES[source][1] == "log" else None)
    parser = mods[source].Parser(str(path))
    stats: dict = {}
    try:
        for r in parse_chunks(path, source, forced, lines, parser, chunk, stats):
            if "windows" in stats and stats["windows"] == 0:
                raise no_figures(path, source, stats, recognised_as(source, forced, stats))
            yield r
            del r   # one chunk in memory at a time (see parse_chunks)
    except NoFigures:
        raise
    except InputError as e:   # a reader's own refusal (e.g. a scrape with no spec series)
        rec = getattr(parser, "recognised", None)
        if rec:
            raise NoFigures(e.path, e.reason, recognised=rec, notes=lines.notes) from None
        raise
    if stats.get("windows", 0) == 0:
        raise no_figures(path, source, stats, recognised_as(source, forced, stats))


def read_source(path, source: str | None = None) -> Reading:
    """Parse a whole file into one Reading. InputError when unrecognised or unreadable.
    (For any size use iter_readings or audit_file, which stream.)"""
    out = None
    for r in iter_readings(path, source, chunk=10**12):
        out = r
    return out

