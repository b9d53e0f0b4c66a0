"""The parallel audit of a large log: one byte range per worker process.

A log of PARALLEL_MIN bytes or more is cut into one byte range per worker (each starting
at a line start, numbered from its true line number), and each worker reads, parses and
audits its range chunk by chunk exactly as the sequential path does: the rules already
run per chunk of CHUNK_WINDOWS windows, so a range boundary is one more chunk boundary.
Reader state that a range cannot see is seeded: the configuration lines of the file's
head (SGLang's server_args) through the reader's CONFIG_MARKERS. Findings come back in
file order; memory stays one block and one chunk per worker.
"""
from __future__ import annotations

from pathlib import Path

from specaudit.audit.findings import Finding
from specaudit.audit.sources.detection import HEAD_BYTES, SOURCES, log_markers, reader_modules
from specaudit.audit.sources.lines import MAX_LINE, READ_CHUNK, Lines, progress_bar
from specaudit.audit.sources.rules import audit_into
from specaudit.audit.sources.stream import CHUNK_WINDOWS, no_figures, parse_chunks, recognised_as

PARALLEL_MIN = 64 * 1024 * 1024


def workers() -> int:
    """Worker processes for a large log: SPECAUDIT_WORKERS, else the CPUs this process may
    use (at most 8); 1 = sequential."""
    import os
    env = os.environ.get("SPECAUDIT_WORKERS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 8))



def parallel_workers(p: Path, source: str) -> int:
    """The worker processes that audit p in byte ranges (workers()), or 0 when it is
    audited sequentially: one worker, not a log, or under PARALLEL_MIN bytes."""
    n = workers()
    return n if n > 1 and SOURCES[source][1] == "log" and p.stat().st_size >= PARALLEL_MIN else 0


_BYTES_READ = None


def _init_worker(bytes_read):
    global _BYTES_READ
    _BYTES_READ = bytes_read


def _audit_range(path, source, forced, start, end, first_line, seed, select, ignore, chunk):
    mods = reader_modules()
    parser = mods[source].Parser(str(path))
    parser.reading.config.update(seed)
    lines = Lines(path, markers=log_markers(mods), start=start, end=end, first_line=first_line, counter=_BYTES_READ)
    stats: dict = {}
    out: list = []
    from specaudit.audit.sources.account import Account
    acc = Account(path, source)
    for r in parse_chunks(path, source, forced, lines, parser, chunk, stats):
        out += audit_into(r, acc, select=select, ignore=ignore)
        del r   # audited: not kept while the next chunk is read
    stats["account"] = acc
    return out, stats


def byte_ranges(p: Path, n: int) -> list[tuple[int, int, int]]:
    """n byte ranges (start, end, first line number), each starting at a line start."""
    size = p.stat().st_size
    from specaudit.inputs import open_input
    cuts = [0]
    with open_input(p) as f:
        for j in range(1, n):
            f.seek(max(size * j // n, cuts[-1]))
            f.readline(MAX_LINE + 1)  # to the next line start (a long line: its part is noted by one range)
            pos = f.tell()
            if pos < size and pos > cuts[-1]:
                cuts.append(pos)
        cuts.append(size)
        # the first line number of each range: newlines before its start, counted in blocks
        firsts, count, pos = [1], 0, 0
        f.seek(0)
        for c in cuts[1:-1]:
            while pos < c:
                block = f.read(min(READ_CHUNK, c - pos))
                if not block:
                    break
                count += block.count(b"\n")
                pos += len(block)
            firsts.append(count + 1)
    return [(cuts[j], cuts[j + 1], firsts[j]) for j in range(len(cuts) - 1)]


def _seed_config(p: Path, source: str) -> dict:
    """The configuration a reader collects from the file's head (its CONFIG_MARKERS lines)."""
    mod = reader_modules()[source]
    marks = getattr(mod, "CONFIG_MARKERS", ())
    if not marks:
        return {}
    parser = mod.Parser(str(p))
    for i, ln in Lines(p, progress=False, markers=tuple(marks), end=min(p.stat().st_size, HEAD_BYTES)):
        parser.feed(i, ln)
    return dict(parser.reading.config)


def audit_parallel(p: Path, path, source: str, forced: bool, n: int, select, ignore, acc=None) -> list[Finding]:
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    ranges = byte_ranges(p, n)
    seed = _seed_config(p, source)
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    counter = ctx.Value("q", 0)
    bar = progress_bar(p)
    try:
        with ProcessPoolExecutor(max_workers=len(ranges), mp_context=ctx, initializer=_init_worker,
                                 initargs=(counter,)) as ex:
            futs = [ex.submit(_audit_range, str(path), source, forced, a, b, first, seed, tuple(select),
                              tuple(ignore), CHUNK_WINDOWS) for a, b, first in ranges]
            pending = set(futs)
            while pending:
                _done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                if bar is not None:
                    bar.update(counter.value - bar.n)
            results = [f.result() for f in futs]
    finally:
        if bar is not None:
            bar.close()
    out: list[Finding] = []
    for fs, stats in results:
        out += fs
        if acc is not None and stats.get("account") is not None:
            acc.merge(stats["account"])
    if sum(st.get("windows", 0) for _fs, st in results) == 0:
        stats = {"notes": sum(st.get("notes", 0) for _fs, st in results),
                 "last_notes": next((st["last_notes"] for _fs, st in results if st.get("last_notes")), [])}
        # start-up lines only when every range says so (a range that saw a stats line says None;
        # the others hold the start-up config only because it is seeded into every range)
        first = results[0][1]
        stats["config"] = first.get("config")   # the start-up config is seeded into every range
        if all(st.get("recognised") for _fs, st in results):
            stats.update(recognised=first["recognised"], why=first.get("why"))
        else:   # the why of a range that saw more than start-up lines, as the whole file's read would give it
            stats["why"] = next(st.get("why") for _fs, st in results if not st.get("recognised"))
        raise no_figures(path, source, stats, recognised_as(source, forced, stats))
    return out

