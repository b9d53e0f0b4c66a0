"""`specaudit query` as a library call: what the arguments ask, and the answer.

    rc = run_query(["traces/", "acceptance_by_depth"], output_format="json")

split_args tells the dataset paths from the SQL or the canned query's name; run_query
validates the parameters, builds the views (specaudit.postmortem.views), runs the SQL and
writes the rows (postmortem.output), or opens the interactive shell. The violations view
needs the checker's findings: the caller passes `checker` (paths -> (findings, summary));
the post-mortem never imports the checker (readers never import each other).
"""
from __future__ import annotations

import math
import os
import re
import sys

MAX_SQL_BYTES = 1 << 20   # a query file; more is not one
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def split_args(args: list[str], sql_file: str | None):
    """PATH... [SQL|NAME] -> (paths, sql or None, canned name or None)."""
    if not args:
        raise ValueError("give a dataset path (specaudit query PATH [SQL|NAME]; --list for canned queries)")
    if sql_file:
        from specaudit.inputs import read_input_text
        return args, read_input_text(sql_file, MAX_SQL_BYTES, "-f (the SQL file)"), None
    if len(args) == 1:
        only = args[0]
        if not os.path.exists(only) and (NAME_RE.match(only) is None or " " in only) and _looks_like_sql(only):
            raise ValueError("give the dataset path first: specaudit query PATH... \"SQL\"")
        return args, None, None
    *paths, last = args
    if os.path.exists(last):
        return args, None, None                      # all paths: the shell
    if NAME_RE.match(last):
        return paths, None, last.replace("-", "_")
    if not _looks_like_sql(last) and ("/" in last or last.endswith((".parquet", ".json"))):
        from specaudit.trace.safe_io import InputError
        raise InputError(last, "no such file or folder")
    return paths, last, None


def _looks_like_sql(s: str) -> bool:
    return bool(re.search(r"\s", s.strip())) or s.strip().upper() in ("SHOW", "SUMMARIZE")


def parse_params(items: list[str]) -> dict:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise ValueError(f"--param {it!r}: expected KEY=VALUE")
        out[k.strip()] = _typed(v)
    return out


def _typed(v: str):
    for conv in (int, float):
        try:
            x = conv(v)
            if isinstance(x, float) and not math.isfinite(x):
                break
            return x
        except ValueError:
            pass
    return v


def needs_violations(sql: str) -> bool:
    return re.search(r"\bviolations\b", sql, re.IGNORECASE) is not None


def run_query(args: list[str], *, sql_file: str | None = None, params=(), output_format: str = "table",
              output: str | None = None, max_rows: int = 1000, threads=None, checker=None, list_canned=False,
              show_canned: str | None = None) -> int:
    """args: PATH... [SQL|NAME] as typed; params: KEY=VALUE strings; checker: paths ->
    (findings, summary) for the violations view (None: no checker, the view is empty).
    Returns the exit code (errors raise ValueError / InputError: exit 2)."""
    from specaudit.postmortem.canned import canned, describe_canned
    from specaudit.postmortem.dataset import find_dataset
    from specaudit.postmortem.output import emit
    from specaudit.postmortem.shell import find_cli, open_shell
    from specaudit.postmortem.sql_guard import fetch_batches
    from specaudit.postmortem.views import connect, connect_tables

    if list_canned:
        print(describe_canned())
        return 0
    if show_canned:
        print(canned(show_canned.replace("-", "_")).sql.rstrip())
        return 0
    paths, sql, name = split_args(args, sql_file)
    params = parse_params(params)
    if name:
        q = canned(name)
        unknown = sorted(set(params) - set(q.params))
        if unknown:
            known = ", ".join(q.params) or "none"
            raise ValueError(f"canned query {name!r} has no parameter {unknown[0]!r} (its parameters: {known})")
        sql = q.sql
    if max_rows < 0:
        raise ValueError("--max-rows must be 0 (all) or more")
    if output and sql is None:
        raise ValueError("-o needs SQL or a canned query name")
    from specaudit.postmortem.engine_views import split_paths
    traces, engines = split_paths(paths)
    if engines and sql is None:
        from specaudit.audit.sources import detect
        from specaudit.trace.safe_io import InputError
        for e in engines:   # a file no engine wrote is named as such before the shell's own limit
            try:
                detect(e)
            except InputError as err:
                raise InputError(e, f"not a trace file (no run.json beside it) nor an engine's output: "
                                    f"{err.reason}") from None
        raise ValueError("the interactive shell opens trace datasets only; give SQL or a canned query to ask "
                         f"{engines[0]} (views windows, findings)")
    ds = find_dataset(traces) if traces or not engines else None
    for e in (ds.skipped if ds else ()):
        print(f"specaudit query: warning: left out of the views: {e}", file=sys.stderr)
    cli = find_cli() if sql is None else None
    findings = None
    if checker is not None and traces and (sql is None or needs_violations(sql) or needs_findings(sql)):
        print("specaudit query: running the checker for the violations view (--no-check skips it)",
              file=sys.stderr, flush=True)
        findings, _ = checker(traces)
    if sql is None:
        return open_shell(cli, paths, findings, ds)
    # the readers' rules run only when the SQL asks for findings (as the checker for violations)
    tables = engine_tables(engines, findings, with_findings=checker is not None and needs_findings(sql))
    if ds is None:
        con = connect_tables(tables, threads=threads, variables=params)
    else:
        con = connect(traces, findings, threads=threads, variables=params, dataset=ds, extra_tables=tables)
    try:
        schema, batches = fetch_batches(con, sql)
        emit(schema, batches, output_format, output, max_rows, ds, inputs=engines)
    finally:
        con.close()
    return 0


def needs_findings(sql: str) -> bool:
    return re.search(r"\bfindings\b", sql, re.IGNORECASE) is not None


def engine_tables(engines: list, trace_findings=None, with_findings: bool = True) -> dict:
    """The `windows` and `findings` tables (specaudit.postmortem.engine_views): every window
    of the engine outputs, and their SA7xx findings with the trace checker's (when it ran;
    with_findings=False: --no-check, empty). Empty tables when there are no engine outputs."""
    from specaudit.postmortem import engine_views as E
    from specaudit.postmortem.tables import findings_table
    windows = E.windows_table(engines)
    for p in engines:     # the account of each reading: what it was read as, how many windows
        rows = [r for r in windows.select(["file", "engine", "version"]).to_pylist() if r["file"] == str(p)]
        what = f"{rows[0]['engine']} {rows[0]['version'] or '(version not inferable)'}" if rows else "no windows"
        print(f"specaudit query: {p}: {what}, {len(rows)} windows (views windows, findings)", file=sys.stderr)
    found = (E.engine_findings(engines) if with_findings else []) + list(trace_findings or [])
    return {"windows": windows, "findings": findings_table(found)}
