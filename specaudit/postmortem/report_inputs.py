"""`specaudit report` as a library call: which PATHs are traces and which an A/B result,
the checker's verdict beside the page, and the page.

    path, summary, rc = run_report(["traces/", "ab.json"], "report/", checker=check)

checker: paths -> (findings, summary, exit code), passed by the caller (the post-mortem
never imports the checker: readers never import each other); None skips it (exit 0).
"""
from __future__ import annotations

from pathlib import Path


def load_ab_result(path) -> dict | None:
    """An A/B result (specaudit ab ... JSON) at path, None when path is no JSON file or is a
    run.json; ValueError for a JSON file that is neither."""
    p = Path(path)
    if p.suffix != ".json" or p.name == "run.json" or not p.is_file():
        return None
    from specaudit.inputs import read_input_bytes
    from specaudit.trace.safe_io import InputError, parse_json_bounded
    try:
        d = parse_json_bounded(read_input_bytes(p, 256 << 20), p)
    except InputError as e:
        raise ValueError(f"{p}: not an A/B result: {e.reason}") from None
    if isinstance(d, dict) and (d.get("kind") == "specaudit-ab-evidence"
                                or {"a", "b", "metrics", "verdict"} <= set(d)):
        return d
    raise ValueError(f"{p}: a JSON file that is neither a run.json nor an A/B result (specaudit ab)")


def run_report(paths, out, *, checker=None, title=None, threads=None) -> tuple[Path, dict | None, int]:
    """-> (the page, the checker's summary or None, exit code: the checker's, 0 without it).
    Bad input raises (InputError / ValueError) before anything is written."""
    from specaudit.outfile import guard_output_dir
    from specaudit.postmortem.report import build_ab_report, build_report
    from specaudit.trace.schema import discover
    guard_output_dir(out, paths)   # never into a run folder it reads
    abs_ = [(p, load_ab_result(p)) for p in paths]
    if sum(d is not None for _, d in abs_) > 1:
        raise ValueError("give one A/B result per report")
    ab = next((d for _, d in abs_ if d is not None), None)
    rest = [p for p, d in abs_ if d is None]
    if not rest and ab is not None:
        return build_ab_report(ab, out, title=title), None, 0
    traces, engines, extra, rc = engine_part(rest, checker is not None)
    if not traces:
        from specaudit.postmortem.engine_report import build_engine_report
        return build_engine_report(*extra, out, title=title, sources=", ".join(map(str, engines))), None, rc
    discover(traces)                 # bad paths fail here, before the checker runs
    findings = summary = None
    if checker is not None:
        findings, summary, rc_t = checker(traces)
        rc = max(rc, rc_t)
    section = None
    if engines:
        from specaudit.postmortem.engine_report import engine_section
        section = engine_section(*extra)
    path = build_report(traces, out, findings=findings, summary=summary, threads=threads, title=title, ab=ab,
                        extra=section)
    return path, summary, rc


def engine_part(paths, check: bool):
    """-> (trace paths, engine-output paths, (windows table, findings or None), exit code
    of the engine findings: 1 when one is an error). Reads every engine output before
    anything is written (a file that is no engine's output: InputError, exit 2)."""
    from specaudit.postmortem import engine_views as E
    traces, engines = E.split_paths(paths)
    if not engines:
        return traces, engines, None, 0
    windows = E.windows_table(engines)
    findings = E.engine_findings(engines) if check else None
    rc = 1 if any(f.severity == "error" for f in findings or ()) else 0
    return traces, engines, (windows, findings), rc
