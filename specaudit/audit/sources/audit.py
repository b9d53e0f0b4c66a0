"""Auditing one engine output: audit_file (its findings) and audit_file_account (the
findings with the reading's account), sequentially chunk by chunk or, for a large log, in
parallel byte ranges (sources/parallel.py): the same findings either way.
"""
from __future__ import annotations

from specaudit.audit.findings import Finding
from specaudit.audit.sources.detection import SOURCES, detect_lines, resolve
from specaudit.audit.sources.lines import Lines, check_path
from specaudit.audit.sources.parallel import audit_parallel, parallel_workers
from specaudit.audit.sources.reading import NoFigures, Reading
from specaudit.audit.sources.rules import audit_into, audit_reading, rule_findings_of_notes
from specaudit.audit.sources.stream import read_chunks
from specaudit.trace.safe_io import InputError


def audit_file_account(path, source: str | None = None, select=(), ignore=()) -> tuple[list[Finding], dict]:
    """audit_file plus the reading's account (sources.account): what was recognised and
    read, each identity checked with its numbers, what could not be checked and why. A file
    recognised by its own words but holding no spec-decoding figures gives no findings and
    an account that says so; NoFigures / InputError only for input that is no engine's."""
    from specaudit.audit.sources.account import Account
    try:
        p, src = resolve(path, source)
        mixed = ""
    except InputError as e:   # two engines' lines in one file: read the engine with most lines
        if source is not None or "mixed engines" not in e.reason:
            raise
        p, mixed = check_path(path), e.reason
        src = detect_lines(Lines(p, progress=False), majority=True)
    acc = Account(path, src, what=SOURCES[src][2].split(":")[0])
    if mixed:
        acc.note(f"{mixed.split(';')[0]}: read the {SOURCES[src][2].split(':')[0]} lines, the other engine's "
                 "lines are skipped (SA700 names the first)")
    out: list[Finding] = []
    n = parallel_workers(p, src)
    try:
        if n:
            out = audit_parallel(p, path, src, source is not None, n, select, ignore, acc)
        else:
            for r in read_chunks(p, path, src, source is not None):
                out += audit_into(r, acc, select=select, ignore=ignore)
                del r   # audited: not kept while the next chunk is read
    except NoFigures as e:
        if not e.recognised:
            raise
        acc.what = e.recognised
        acc.engine = next((eng for word, eng in (("TensorRT", "trtllm"), ("SGLang", "sglang"), ("vLLM", "vllm"),
                                                  ("llama", "llamacpp"), ("TokenSpeed", "tokenspeed"),
                                                  ("mlx", "mlx")) if word in e.recognised), None)
        acc.add(Reading(source=src, engine="", path=str(path), notes=e.notes, config=e.config))
        acc.note(f"{e.reason}; recognised as {e.recognised}: judged on what it holds")
        acc.empty_why = e.why
        return [f for f in rule_findings_of_notes(path, e.notes, select, ignore)], acc.finish([])
    return out, acc.finish(out)


def audit_file(path, source: str | None = None, select=(), ignore=()) -> list[Finding]:
    """Read an engine log, a metrics scrape or JSON records and audit them, streaming.

    Returns the findings (errors fail a check, warnings do not). Raises
    specaudit.trace.safe_io.InputError for a file that is none of these, empty, or mixed.
    """
    p, src = resolve(path, source)
    n = parallel_workers(p, src)
    if n:
        return audit_parallel(p, path, src, source is not None, n, select, ignore)
    out: list[Finding] = []
    for r in read_chunks(p, path, src, source is not None):
        out += audit_reading(r, select=select, ignore=ignore)
        del r   # audited: not kept while the next chunk is read
    return out

