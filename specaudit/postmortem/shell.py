"""The interactive `specaudit query PATH`: the duckdb CLI over the same views, in safe mode.

The CLI cannot call Python nor take Arrow tables from us, so shell_setup_sql gives it the
same views and settings as views.connect() in SQL alone: the small tables as VALUES, node
depths and the agreement rule as SQL (view_sql.py).
"""
from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from specaudit.postmortem.dataset import Dataset, find_dataset
from specaudit.postmortem.sql_guard import HARDEN, sql_str
from specaudit.postmortem.tables import findings_table, runs_table
from specaudit.postmortem.view_sql import (
    AGREES_MACRO_SQL,
    CHAIN_TEST,
    DEPTHS_REDUCE,
    FIGURES_VIEW_SQL,
    doubling_source,
    duck_type,
    nodes_view_sql,
    parquet_view,
    rollup_views_sql,
)
from specaudit.trace.schema import REQUESTS_SCHEMA, STEPS_SCHEMA


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
    setup = shell_setup_sql(paths, findings, dataset=ds, lock=False, duckdb_major=_cli_major(cli))
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


def _values_sql(name: str, table: pa.Table) -> str:
    """CREATE TABLE name AS VALUES ... for the duckdb CLI (it cannot take Arrow from us)."""
    cols = ", ".join(f"{f.name} {duck_type(f.type)}" for f in table.schema)
    out = [f"CREATE TABLE {name} ({cols});"]
    rows = table.to_pylist()
    for i in range(0, len(rows), 500):
        vals = []
        for r in rows[i:i + 500]:
            vals.append("(" + ", ".join(_literal(r[f.name]) for f in table.schema) + ")")
        out.append(f"INSERT INTO {name} VALUES {', '.join(vals)};")
    return "\n".join(out)


def _literal(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else "NULL"
    return sql_str(v)


def shell_setup_sql(paths, findings=None, dataset: Dataset | None = None, lock: bool = True,
                    duckdb_major: int = 2) -> str:
    """The SQL that gives the duckdb CLI the same views and settings as connect().

    lock=False leaves out the final `enable_external_access = false` and
    `lock_configuration = true`: the CLI's `.safe_mode`, run right after, does both (and
    a SET after it would fail as locked). allowed_paths is set before any view exists.
    """
    ds = dataset or find_dataset(paths)
    parts = [f"SET {k} = {v};" for k, v in HARDEN if k not in ("allow_extension_repositories",
                                                                "python_enable_replacements")]
    allowed = ", ".join(sql_str(f) for f in ds.files)
    parts.append(f"SET allowed_paths = [{allowed}];")
    if lock:
        parts.append("SET enable_external_access = false;")
    parts.append(parquet_view("steps", ds.step_files, STEPS_SCHEMA) + ";")
    parts.append(parquet_view("requests", ds.request_files, REQUESTS_SCHEMA) + ";")
    parts += [sql + ";" for sql in rollup_views_sql(ds, bins=0)]   # the shell may SET any bins
    parts.append(_values_sql("runs", runs_table(ds.runs, ds.rollup_notes)))
    parts.append(_values_sql("violations", findings_table(findings)))
    if duckdb_major >= 2:
        view = nodes_view_sql(DEPTHS_REDUCE)
    else:
        view = nodes_view_sql(f"CASE WHEN {CHAIN_TEST} THEN range(len(parents))::INTEGER[] ELSE _dep END",
                              source=doubling_source())
    parts.append(view.strip() + ";")
    parts.append(AGREES_MACRO_SQL.strip() + ";")
    parts.append(FIGURES_VIEW_SQL.strip() + ";")
    if lock:
        parts.append("SET lock_configuration = true;")
    return "\n".join(parts)
