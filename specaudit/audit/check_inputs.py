"""`specaudit check` as a library call: which checker each input goes to, and the report.

    res, text = run_check(["traces/", "server.log"], select=("SA3",), output_format="json")

Each PATH goes to one reader: a folder, a .parquet or a run.json is a trace (the
checker, specaudit.audit.check); any other file is engine output (specaudit.audit.sources:
a log, a Prometheus scrape, JSON records), or all of them are when `source` names the
kind; an AIPerf export given beside a trace is compared with it (client_vs_trace,
SA590/SA591), llama-server responses a client saved with the server's log and scrapes
(llamacpp_client, SA592-SA596). `prometheus` adds the series of a live Prometheus server. Every reader
adds into one CheckResult, so the formats and exit codes are the same for all. The
engine internals live in audit/check/; this module only routes and renders.
"""
from __future__ import annotations

from pathlib import Path


def parse_codes(parts) -> tuple[str, ...]:
    """['SA3,SA501', 'sa7'] -> ('SA3', 'SA501', 'SA7'): the --select / --ignore lists."""
    out = []
    for part in parts or ():
        out += [c.strip().upper() for c in part.split(",") if c.strip()]
    return tuple(out)


def is_trace_path(p: Path, st=None) -> bool:
    """A folder, a .parquet or a run.json. `st`: the path's os.stat result when the caller
    has one (classification stats each input once)."""
    import stat as _stat
    is_dir = _stat.S_ISDIR(st.st_mode) if st is not None else p.is_dir()
    return is_dir or p.suffix == ".parquet" or p.name == "run.json"


SETTLE_S = 0.5   # how long a missing input is looked for again before it is called missing


def _stat_settled(p: Path, settle_s: float = SETTLE_S):
    """os.stat(p), or None when it is missing for `settle_s`: a writer that replaces its file
    without an atomic rename (log rotation: rename, then create) leaves a moment with no
    file at all, and a check started right then must not answer "no such file"."""
    import os
    import time
    end = time.monotonic() + settle_s
    while True:
        try:
            return os.stat(p)
        except FileNotFoundError:
            if time.monotonic() >= end:
                return None
            time.sleep(0.05)
        except OSError:
            return None


def split_inputs(paths, source: str | None = None) -> tuple[list[Path], list[Path]]:
    """-> (trace paths, engine-output paths). A path that does not exist goes with the traces
    (the checker names it) unless `source` says every path is engine output.

    One stat per path: the kind is decided once and the reader opens the path itself, so
    a log that a server renames or rewrites at exit is either read or named with the
    reader's own error, never classified as present and then dropped as missing."""
    traces, logs = [], []
    for p in map(Path, paths):
        if source is not None:
            logs.append(p)
            continue
        st = _stat_settled(p)
        if st is None:
            traces.append(p)   # missing: the checker names it
            continue
        (traces if is_trace_path(p, st) else logs).append(p)
    return traces, logs


def audit_sources(files, source, select, ignore, result) -> None:
    """Engine logs / metrics text through specaudit.audit.sources, into the same result."""
    from specaudit.audit.check.result import result_bad
    try:
        from specaudit.audit.sources import audit_file_account
    except ImportError as e:
        for f in files:
            result_bad(result, f, f"not a trace file, and the engine-log readers (specaudit.sources) "
                                  f"are not available: {e}")
        return
    from specaudit.trace.safe_io import InputError
    for f in files:
        try:
            found, account = audit_file_account(f, source=source, select=select, ignore=ignore)
        except InputError as e:
            result_bad(result, e.path or f, e.reason)
            continue
        except ValueError as e:
            result_bad(result, f, str(e))
            continue
        except OSError as e:   # gone or unreadable between the listing and the read
            result_bad(result, f, "no such file" if isinstance(e, FileNotFoundError) else
                       f"cannot read: {e.strerror or e}")
            continue
        result.files_checked.append(str(f))
        result.readings.append(account)   # what was read and checked (printed before the findings)
        for fd in found:
            result.add(fd)
    if result.readings:
        _count_source_rules(result, select, ignore)


def _count_source_rules(result, select, ignore) -> None:
    """The SA7xx rules that ran on the readings join the trace rules in result.rules."""
    from specaudit.audit.sources.rules import source_rule_codes
    result.rules += [c for c in source_rule_codes(select, ignore) if c not in result.rules]


def audit_live(url, select, ignore, result, *, range="6h", step="30s", timeout="30s", match=(), headers=(),
               insecure=False, ca_file=None) -> None:
    """A Prometheus server's spec-decoding series through specaudit.audit.sources.prom_http."""
    from specaudit.audit.check.result import result_bad
    from specaudit.audit.sources.prom_http import parse_duration, read_prometheus
    from specaudit.trace.safe_io import InputError
    try:
        kw = dict(range_s=parse_duration(range, "--range"), step_s=parse_duration(step, "--step"),
                  timeout=parse_duration(timeout, "--timeout"))
        readings = read_prometheus(url, match=list(match), headers=list(headers), insecure=insecure,
                                   ca_file=ca_file, **kw)
    except (InputError, ValueError) as e:
        result_bad(result, url, getattr(e, "reason", None) or str(e))
        return
    if not readings:   # series exist, but none gave a window: say so about this URL
        result_bad(result, url, "Prometheus holds spec-decoding series, but none has two samples in the "
                                "range to make a window; give a longer --range (or check --match)")
        return
    result.files_checked += [r.path for r in readings]
    from specaudit.audit.sources.account import Account
    from specaudit.audit.sources.rules import audit_into
    for r in readings:   # each series group through the rules, with its account: read, checked, not checkable
        acc = Account(r.path, "prometheus", engine=r.engine, what=f"Prometheus range query ({r.engine} series)")
        found = audit_into(r, acc, select=select, ignore=ignore)
        result.readings.append(acc.finish(found))
        for fd in found:
            result.add(fd)
    _count_source_rules(result, select, ignore)


def run_check(paths=(), *, select=(), ignore=(), invariants=(), entry_points=True, source=None,
              max_per_code=1000, output_format="text", statistics=False, examples=3, engine="local",
              spark_master=None, out=None, prometheus=None, live=None, config=None, progress=None):
    """-> (CheckResult, the rendered report). select / ignore: code prefixes (validated:
    ValueError names an unknown one); live: keyword arguments of audit_live (range, step,
    timeout, match, headers, insecure, ca_file); progress: callable(rows), told the trace
    step rows as they are checked (local engine)."""
    from specaudit.audit.check import CheckResult, check_paths
    from specaudit.audit.formats import format_findings
    from specaudit.invariants import load_rules
    from specaudit.invariants.registry import check_selectors
    select, ignore = tuple(select), tuple(ignore)
    load_rules(dirs=invariants, entry_points=entry_points)   # user rules count as known
    for label, codes in (config.code_lists() if config is not None else ()):   # named by file and key
        check_selectors(label, codes)
    check_selectors("--select", select)
    check_selectors("--ignore", ignore)
    # config: a specaudit.config.CheckConfig, its per-path ignores, severities and tolerances
    # (select / ignore / output format come merged with the flags by the caller)
    cap = max_per_code
    if config is not None and config.per_path_ignores:
        max_per_code = 0   # per-path ignores drop findings after the check: it keeps them all (exact counts)
    set_tolerances(config.tolerances if config is not None else {})
    if engine == "spark":
        res = run_check_spark(paths, select, ignore, invariants=invariants, entry_points=entry_points,
                              max_per_code=max_per_code, spark_master=spark_master, out=out)
    else:
        traces, logs = split_inputs(paths, source)
        if traces:
            res = check_paths(traces, select=select, ignore=ignore, invariants_dirs=invariants,
                              entry_points=entry_points, max_per_code=max_per_code, progress=progress)
        else:
            res = CheckResult(max_per_code=max_per_code)
        if logs:   # each reader opens its file once and names what is wrong with it (missing included)
            # llama-server responses a client saved: against the server's log and scrapes (SA592-SA596)
            from specaudit.audit import llamacpp_client
            responses, rest = llamacpp_client.split(logs) if source is None else ([], list(logs))
            audit_sources(rest, source, select, ignore, res)
            if responses:
                llamacpp_client.cross_check(responses, rest, select, ignore, res)
            if traces:   # a benchmark client's per-request figures against the same run's trace
                from specaudit.audit.client_vs_trace import cross_check
                cross_check(traces, logs, select, ignore, res)
        if prometheus:
            audit_live(prometheus, select, ignore, res, **(live or {}))
    restore_tolerances()
    if config is not None:
        apply_config(res, config, cap)
    summary = res.summary()
    if res.readings:   # engine inputs: each reading's account (text: printed first; json: summary.readings)
        summary["readings"] = res.readings
    text = format_findings(res.findings, output_format, counts=res.counts, summary=summary,
                           statistics=statistics, examples=examples, checked=res.rules)
    return res, text


def run_check_spark(paths, select, ignore, *, invariants=(), entry_points=True, max_per_code=1000,
                    spark_master=None, out=None):
    """engine="spark": every path (folder or URI) is a trace dataset, checked on Spark -> CheckResult."""
    from specaudit.audit.spark import check_spark
    from specaudit.audit.spark_session import session
    if not paths:
        raise ValueError("--engine spark needs PATHs or URIs of trace datasets")
    spark = session(spark_master)
    return check_spark(spark, list(paths), select=select, ignore=ignore, out=out, invariants_dirs=invariants,
                       entry_points=entry_points, max_per_code=max_per_code)


def apply_config(res, config, max_per_code: int) -> None:
    """The file's per-path ignores and severity overrides on a finished CheckResult. With
    per-path ignores the check kept every finding (max_per_code=0), so the counts rebuilt
    from the findings left are exact; the cap is applied here."""
    from collections import Counter
    if config.per_path_ignores:
        kept = [f for f in res.findings if not config.path_ignored(f.code, f.file)]
        res.counts = Counter(f.code for f in kept)
        shown: Counter = Counter()
        res.findings = []
        for f in kept:
            shown[f.code] += 1
            if max_per_code <= 0 or shown[f.code] <= max_per_code:
                res.findings.append(f)
        res.max_per_code = max_per_code
    if config.severity:
        for f in res.findings:
            f.severity = config.severity_of(f.code, f.severity)
        res.severities = {c: config.severity_of(c, s) for c, s in res.severities.items()}


_TOLERANCES_SET: list = []   # (rule module, constant, its value before) for each tolerance a check set


def set_tolerances(values: dict) -> None:
    """Set the rule modules' tolerance constants (specaudit.config.TOLERANCES) for one check;
    restore_tolerances() puts them back. A check that raised left them set: put back first."""
    import importlib

    from specaudit.config import TOLERANCES
    restore_tolerances()
    for name, x in values.items():
        mod = importlib.import_module(f"specaudit.invariants.{TOLERANCES[name][0]}")
        attr = TOLERANCES[name][1]
        _TOLERANCES_SET.append((mod, attr, getattr(mod, attr)))
        setattr(mod, attr, x)


def restore_tolerances() -> None:
    while _TOLERANCES_SET:
        mod, attr, x = _TOLERANCES_SET.pop()
        setattr(mod, attr, x)
