"""`specaudit check` as a library call: which checker each input goes to, and the report.

    res, text = run_check(["traces/", "server.log"], select=("SA3",), output_format="json")

Each PATH goes to one reader: a folder, a .parquet or a run.json is a trace (the
checker, specaudit.audit.check); any other file is engine output (specaudit.audit.sources:
a log, a Prometheus scrape, JSON records), or all of them are when `source` names the
kind; an AIPerf export given beside a trace is compared with it (client_vs_trace,
SA590/SA591), llama-server responses a client saved with the server's log and scrapes
(llamacpp_client, SA592-SA596). `prometheus` adds the series of a live Prometheus server. Every reader
adds into one CheckResult, so the formats and exit codes are the same for all. The
engine internals live in audit/check.py; this module only routes and renders.
"""
from __future__ import annotations

from pathlib import Path


def parse_codes(parts) -> tuple[str, ...]:
    """['SA3,SA501', 'sa7'] -> ('SA3', 'SA501', 'SA7'): the --select / --ignore lists."""
    out = []
    for part in parts or ():
        out += [c.strip().upper() for c in part.split(",") if c.strip()]
    return tuple(out)


def is_trace_path(p: Path) -> bool:
    return p.is_dir() or p.suffix == ".parquet" or p.name == "run.json"


def split_inputs(paths, source: str | None = None) -> tuple[list[Path], list[Path]]:
    """-> (trace paths, engine-output paths). A path that does not exist goes with the traces
    (the checker names it) unless `source` says every path is engine output."""
    traces, logs = [], []
    for p in map(Path, paths):
        if source is not None:
            logs.append(p)
        elif not p.exists() or is_trace_path(p):
            traces.append(p)
        else:
            logs.append(p)
    return traces, logs


def audit_sources(files, source, select, ignore, result) -> None:
    """Engine logs / metrics text through specaudit.audit.sources, into the same result."""
    from specaudit.audit.check import result_bad
    try:
        from specaudit.audit.sources import audit_file
    except ImportError as e:
        for f in files:
            result_bad(result, f, f"not a trace file, and the engine-log readers (specaudit.sources) "
                                  f"are not available: {e}")
        return
    from specaudit.trace.schema import InputError
    for f in files:
        try:
            found = audit_file(f, source=source, select=select, ignore=ignore)
        except InputError as e:
            result_bad(result, e.path or f, e.reason)
            continue
        except ValueError as e:
            result_bad(result, f, str(e))
            continue
        result.files_checked.append(str(f))
        for fd in found:
            result.add(fd)


def audit_live(url, select, ignore, result, *, range="6h", step="30s", timeout="30s", match=(), headers=(),
               insecure=False, ca_file=None) -> None:
    """A Prometheus server's spec-decoding series through specaudit.audit.sources.prom_http."""
    from specaudit.audit.check import result_bad
    from specaudit.audit.sources.prom_http import audit_prometheus, parse_duration
    from specaudit.trace.schema import InputError
    try:
        kw = dict(range_s=parse_duration(range, "--range"), step_s=parse_duration(step, "--step"),
                  timeout=parse_duration(timeout, "--timeout"))
        found, readings = audit_prometheus(url, select=select, ignore=ignore, match=list(match),
                                           headers=list(headers), insecure=insecure, ca_file=ca_file, **kw)
    except (InputError, ValueError) as e:
        result_bad(result, url, getattr(e, "reason", None) or str(e))
        return
    result.files_checked += [r.path for r in readings]
    for fd in found:
        result.add(fd)


def run_check(paths=(), *, select=(), ignore=(), invariants=(), entry_points=True, source=None,
              max_per_code=1000, output_format="text", statistics=False, examples=3, engine="local",
              spark_master=None, out=None, prometheus=None, live=None):
    """-> (CheckResult, the rendered report). select / ignore: code prefixes (validated:
    ValueError names an unknown one); live: keyword arguments of audit_live (range, step,
    timeout, match, headers, insecure, ca_file)."""
    from specaudit.audit.check import CheckResult, check_paths, result_bad
    from specaudit.audit.formats import format_findings
    from specaudit.invariants import load_rules
    from specaudit.invariants.registry import check_selectors
    select, ignore = tuple(select), tuple(ignore)
    load_rules(dirs=invariants, entry_points=entry_points)   # user rules count as known
    check_selectors("--select", select)
    check_selectors("--ignore", ignore)
    if engine == "spark":
        res = run_check_spark(paths, select, ignore, invariants=invariants, entry_points=entry_points,
                              max_per_code=max_per_code, spark_master=spark_master, out=out)
    else:
        traces, logs = split_inputs(paths, source)
        if traces:
            res = check_paths(traces, select=select, ignore=ignore, invariants_dirs=invariants,
                              entry_points=entry_points, max_per_code=max_per_code)
        else:
            res = CheckResult(max_per_code=max_per_code)
        if logs:
            for p in logs:
                if not p.exists():
                    result_bad(res, p, "no such file or folder")
            present = [p for p in logs if p.exists()]
            # llama-server responses a client saved: against the server's log and scrapes (SA592-SA596)
            from specaudit.audit import llamacpp_client
            responses, present = llamacpp_client.split(present) if source is None else ([], present)
            audit_sources(present, source, select, ignore, res)
            if responses:
                llamacpp_client.cross_check(responses, present, select, ignore, res)
            if traces:   # a benchmark client's per-request figures against the same run's trace
                from specaudit.audit.client_vs_trace import cross_check
                cross_check(traces, present, select, ignore, res)
        if prometheus:
            audit_live(prometheus, select, ignore, res, **(live or {}))
    text = format_findings(res.findings, output_format, counts=res.counts, summary=res.summary(),
                           statistics=statistics, examples=examples, checked=res.rules)
    return res, text


def run_check_spark(paths, select, ignore, *, invariants=(), entry_points=True, max_per_code=1000,
                    spark_master=None, out=None):
    """engine="spark": every path (folder or URI) is a trace dataset, checked on Spark -> CheckResult."""
    from specaudit.audit.spark import check_spark, session
    if not paths:
        raise ValueError("--engine spark needs PATHs or URIs of trace datasets")
    spark = session(spark_master)
    return check_spark(spark, list(paths), select=select, ignore=ignore, out=out, invariants_dirs=invariants,
                       entry_points=entry_points, max_per_code=max_per_code)
