"""Ask a trace dataset anything in SQL: DuckDB views, read-only and offline.

Examples:
  specaudit query --list                                   # the canned queries
  specaudit query traces/ acceptance_by_depth              # run one by name
  specaudit query traces/ a_vs_b --param a="chain b7 k1 c1" --param b="tree b15 k4 c1"
  specaudit query traces/ "SELECT config, run_id, reported_mean_commit_len FROM runs"
  specaudit query traces/ "SELECT * FROM nodes WHERE NOT accepted AND parent_accepted LIMIT 20"
  specaudit query traces/ throughput_over_time --output-format csv -o over_time.csv
  specaudit query traces/ violations_by_code               # runs the checker first
  specaudit query traces/                                  # interactive duckdb shell

Views: steps (the contract's step rows), requests, runs (one row per run: config label,
models, reported_* counters, the manifest as JSON), nodes (one row per node: node,
depth from parents, token, parent, position, draft_logprob, target_argmax,
target_margin, accepted, parent_accepted) and violations (the checker's findings:
code, name, severity, message, run_id, request_id, step, file, line, values as JSON).
The checker runs only when the SQL names `violations` (and for the shell); --no-check
skips it.

Read-only and offline, also when the SQL asks otherwise: COPY, EXPORT, ATTACH,
INSTALL/LOAD and friends are refused with one line (exit 2), DuckDB can read nothing
but the trace's own Parquet files, extensions cannot be installed or loaded, and SET
cannot undo any of it. The only file written is -o FILE. The interactive shell (needs
the `duckdb` CLI: pip install duckdb-cli) gets the same views and settings plus the
CLI's safe mode; DuckDB there still lets COPY ... TO name a trace file itself, so use
the shell on a copy when that matters.

Output: --output-format table (default; at most --max-rows rows), csv, json (an array
of objects) or parquet (needs -o). SQL errors: DuckDB's message on one line, exit 2.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HELP = "SQL over traces (DuckDB views steps/requests/runs/nodes/violations) and canned queries"
ORDER = 60
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def add_arguments(p) -> None:
    _intermixed(p)
    p.add_argument("args", nargs="*", metavar="PATH... [SQL|NAME]",
                   help="dataset folders, run folders or files, then SQL or a canned query name")
    p.add_argument("--list", action="store_true", help="list the canned queries and exit")
    p.add_argument("--show", metavar="NAME", help="print a canned query's SQL (with its documentation) and exit")
    p.add_argument("-f", "--file", metavar="SQLFILE", help="read the SQL from a file")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="set a variable for getvariable('KEY') (canned queries list theirs)")
    p.add_argument("--output-format", choices=["table", "csv", "json", "parquet"], default="table",
                   help="table (default), csv, json or parquet (parquet needs -o)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the result here (atomically) instead of stdout")
    p.add_argument("--max-rows", type=int, default=1000,
                   help="table format: rows to print (default 1000; 0 = all)")
    p.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all cores)")
    p.add_argument("--no-check", action="store_true",
                   help="do not run the checker: the violations view stays empty")


# --------------------------------------------------------------------- arguments

def _intermixed(p) -> None:
    """Let options and positionals mix (`query PATH --no-check "SQL"`): argparse's
    subcommand dispatch calls parse_known_args, which stops collecting PATH... at the
    first option; the intermixed variant does not."""
    plain = p.parse_known_args

    def intermixed(args=None, namespace=None):
        p.parse_known_args = plain           # the intermixed parser calls it twice inside
        try:
            return p.parse_known_intermixed_args(args, namespace)
        finally:
            p.parse_known_args = intermixed
    p.parse_known_args = intermixed


def split_args(args: list[str], sql_file: str | None):
    """PATH... [SQL|NAME] -> (paths, sql or None, canned name or None)."""
    if not args:
        raise ValueError("give a dataset path (specaudit query PATH [SQL|NAME]; --list for canned queries)")
    if sql_file:
        try:
            return args, Path(sql_file).read_text(encoding="utf-8"), None
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{sql_file}: cannot read the SQL file: {e}") from None
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
        from specaudit.trace.schema import InputError
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


# ----------------------------------------------------------------------- checker

def run_checker(paths):
    """The checker's findings and summary for these paths (the command layer composes
    the two readers: query never imports check)."""
    from specaudit.audit.check import check_paths
    res = check_paths([str(p) for p in paths])
    summary = res.summary() if hasattr(res, "summary") else {}
    return list(res.findings), summary


def needs_violations(sql: str) -> bool:
    return re.search(r"\bviolations\b", sql, re.IGNORECASE) is not None


# ------------------------------------------------------------------------ output

def _cell(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.6g}"
    if isinstance(v, (list, dict, tuple)):
        return json.dumps(_jsonable(v), separators=(",", ":"))
    return str(v)


def _jsonable(v):
    """Python values from Arrow -> JSON-safe (NaN/inf -> null, bytes -> hex, times -> ISO)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if hasattr(v, "isoformat"):
        return v.isoformat()
    try:
        return float(v)             # Decimal
    except (TypeError, ValueError):
        return str(v)


def write_table(schema, batches, out, max_rows: int, max_width: int = 60) -> None:
    """Aligned text table: numbers right, text left; cells cut at max_width."""
    import pyarrow as pa
    names = schema.names
    rows, more = [], 0
    for b in batches:
        for r in pa.Table.from_batches([b]).to_pylist():
            if max_rows and len(rows) >= max_rows:
                more += 1
                continue
            rows.append([_cell(r[n]) for n in names])
    cut = [[c if len(c) <= max_width else c[: max_width - 1] + "…" for c in r] for r in rows]
    num = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
           for f in schema]
    widths = [max([len(n)] + [len(r[i]) for r in cut]) for i, n in enumerate(names)]

    def fmt(cells):
        return "  ".join(c.rjust(w) if isn else c.ljust(w) for c, w, isn in zip(cells, widths, num)).rstrip()
    out.write(fmt(names) + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for r in cut:
        out.write(fmt(r) + "\n")
    n = len(rows) + more
    tail = f"({n} row{'s' if n != 1 else ''}"
    if more:
        tail += f"; {more} not shown: --max-rows 0 for all, or --output-format csv -o FILE"
    out.write(tail + ")\n")


def write_csv(schema, batches, out) -> None:
    import csv
    w = csv.writer(out, lineterminator="\n")
    w.writerow(schema.names)
    for b in batches:
        cols = [c.to_pylist() for c in b.columns]
        for r in zip(*cols):
            w.writerow(["" if v is None else (json.dumps(_jsonable(v)) if isinstance(v, (list, dict))
                                               else _csv_scalar(v)) for v in r])


def _csv_scalar(v):
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    return v


def write_json(schema, batches, out) -> None:
    """A JSON array of row objects, one per line (streams; NaN/inf become null)."""
    out.write("[")
    first = True
    for b in batches:
        for r in b.to_pylist():
            out.write(("\n" if first else ",\n") + json.dumps(_jsonable(r), ensure_ascii=False))
            first = False
    out.write("\n]\n" if not first else "]\n")


def _check_output_path(path: Path, ds) -> Path:
    from specaudit.outfile import guard_output
    return guard_output(path, [str(rf.run_dir) for rf in ds.runs])


def emit(schema, batches, fmt: str, output: str | None, max_rows: int, ds) -> None:
    """Write the result in fmt to output (atomic: temporary name then rename) or stdout."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    if fmt == "parquet" and not output:
        raise ValueError("--output-format parquet needs -o FILE")
    if schema is None:
        schema, batches = pa.schema([]), iter(())
    if not output:
        {"table": lambda: write_table(schema, batches, sys.stdout, max_rows),
         "csv": lambda: write_csv(schema, batches, sys.stdout),
         "json": lambda: write_json(schema, batches, sys.stdout)}[fmt]()
        return
    path = _check_output_path(Path(output), ds)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        if fmt == "parquet":
            with pq.ParquetWriter(tmp, schema, compression="zstd") as w:
                for b in batches:
                    w.write_batch(b)
        else:
            with open(tmp, "w", encoding="utf-8", newline="") as f:
                {"table": lambda: write_table(schema, batches, f, 0),
                 "csv": lambda: write_csv(schema, batches, f),
                 "json": lambda: write_json(schema, batches, f)}[fmt]()
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    print(f"wrote {path}", file=sys.stderr)


# ------------------------------------------------------------------------- shell

def find_cli() -> str:
    """The duckdb CLI on PATH, checked to lock itself in safe mode; ValueError otherwise."""
    cli = shutil.which("duckdb")
    if not cli:
        raise ValueError("no SQL given and the duckdb CLI is not installed (pip install duckdb-cli); "
                         "pass SQL or a canned query name instead (specaudit query --list)")
    _probe_safe_mode(cli)
    return cli


def open_shell(cli: str, paths, findings, ds) -> int:
    """The duckdb CLI with the same views and settings, then its safe mode (which switches
    external access off and locks the configuration)."""
    from specaudit.postmortem import views as Q
    setup = Q.shell_setup_sql(paths, findings, dataset=ds, lock=False, duckdb_major=_cli_major(cli))
    banner = ("specaudit query: views steps, requests, runs, nodes, violations; read-only, offline "
              "(safe mode). .quit to leave.")
    try:
        if len(setup.encode()) <= SETUP_ARG_MAX:
            # the usual case: the setup travels as an argument; nothing is written
            print(banner, file=sys.stderr)
            return subprocess.call([cli, "-no-init", "-cmd", setup, "-cmd", ".safe_mode"])
        # many files or findings: past the argument-size limit, hand the setup over as the
        # CLI's init file, private to this user and removed when the shell exits
        import tempfile
        with tempfile.TemporaryDirectory(prefix="specaudit-shell-") as tmp:
            init = Path(tmp) / "setup.sql"
            init.write_text(setup, encoding="utf-8")
            print(banner, file=sys.stderr)
            return subprocess.call([cli, "-init", str(init), "-cmd", ".safe_mode"])
    except OSError as e:
        raise ValueError(f"cannot start the duckdb CLI at {cli}: {e}") from None


SETUP_ARG_MAX = 100_000   # Linux refuses a single argument over 128 KiB


def _cli_major(cli: str) -> int:
    """The CLI's major version ('v1.5.6 (Variegata) ...' -> 1); 1 when it cannot say."""
    try:
        r = subprocess.run([cli, "-version"], capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL)
        m = re.match(r"\s*v?(\d+)\.", r.stdout)
        return int(m.group(1)) if m else 1
    except (OSError, subprocess.TimeoutExpired):
        return 1


def _probe_safe_mode(cli: str) -> None:
    """Refuse a CLI whose .safe_mode does not switch external access off and lock."""
    try:
        r = subprocess.run([cli, "-no-init", "-csv", "-noheader", "-cmd", ".safe_mode", "-c",
                            "SELECT current_setting('enable_external_access'), "
                            "current_setting('lock_configuration')"],
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ValueError(f"cannot start the duckdb CLI at {cli}: {e}") from None
    if r.stdout.strip().lower().replace(" ", "") != "false,true":
        raise ValueError(f"the duckdb CLI at {cli} cannot lock itself (.safe_mode); "
                         "upgrade it (pip install -U duckdb-cli) or pass SQL instead")


# -------------------------------------------------------------------------- main

def main(args) -> int:
    from specaudit.postmortem import views as Q

    if args.list:
        print(Q.describe_canned())
        return 0
    if args.show:
        print(Q.canned(args.show.replace("-", "_")).sql.rstrip())
        return 0
    paths, sql, name = split_args(args.args, args.file)
    params = parse_params(args.param)
    if name:
        q = Q.canned(name)
        unknown = sorted(set(params) - set(q.params))
        if unknown:
            known = ", ".join(q.params) or "none"
            raise ValueError(f"canned query {name!r} has no parameter {unknown[0]!r} (its parameters: {known})")
        sql = q.sql
    if args.max_rows < 0:
        raise ValueError("--max-rows must be 0 (all) or more")
    if args.output and sql is None:
        raise ValueError("-o needs SQL or a canned query name")
    ds = Q.find_dataset(paths)
    for e in ds.skipped:
        print(f"specaudit query: warning: left out of the views: {e}", file=sys.stderr)
    cli = find_cli() if sql is None else None
    findings = None
    if not args.no_check and (sql is None or needs_violations(sql)):
        print("specaudit query: running the checker for the violations view (--no-check skips it)",
              file=sys.stderr, flush=True)
        findings, _ = run_checker(paths)
    if sql is None:
        return open_shell(cli, paths, findings, ds)
    con = Q.connect(paths, findings, threads=args.threads, variables=params, dataset=ds)
    try:
        schema, batches = Q.fetch_batches(con, sql)
        emit(schema, batches, args.output_format, args.output, args.max_rows, ds)
    finally:
        con.close()
    return 0
