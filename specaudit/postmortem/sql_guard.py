"""The SQL guard: every DuckDB session of the post-mortem is read-only and offline.

Read-only and offline, also when the SQL asks otherwise. Two layers:
  1. statements that touch files or extensions are refused before DuckDB sees them:
     COPY, EXPORT, ATTACH, INSTALL/LOAD, PREPARE/EXECUTE, UPDATE EXTENSIONS;
  2. DuckDB itself is locked: enable_external_access=false with only the trace's Parquet
     files on allowed_paths, extension autoinstall/autoload off, community extensions
     and extension repositories off, no temp directory (no spill files), Python
     replacement scans off, then lock_configuration=true so no SET can undo any of it.
Layer 1 matters because DuckDB lets a statement *write* to a path on allowed_paths
(COPY ... TO a trace file with USE_TMP_FILE false overwrote it in a test).

Here: the refusals (check_statements), DuckDB's errors as one line (translate_error), the
locked connection (guarded_connection, then lock), and the only way a statement runs
(execute, fetch_arrow, fetch_batches: the refusal check first).
"""
from __future__ import annotations

import os
import re

import pyarrow as pa

from specaudit.trace.safe_io import InputError


class QueryRefused(ValueError):
    """A statement or an access that the read-only, offline session refuses."""


# statement type -> why it is refused (one line each)
REFUSED = {
    "COPY": "COPY reads or writes files; this session is read-only (save a result with -o FILE)",
    "COPY_DATABASE": "COPY FROM DATABASE writes a database; this session is read-only",
    "EXPORT": "EXPORT DATABASE writes files; this session is read-only (save a result with -o FILE)",
    "ATTACH": "ATTACH opens database files; this session only reads the trace views",
    "DETACH": "DETACH is not needed: this session has no attached databases",
    "LOAD": "INSTALL/LOAD of DuckDB extensions is disabled (offline, no extensions)",
    "EXTENSION": "extension management is disabled (offline, no extensions)",
    "PREPARE": "PREPARE/EXECUTE are not supported here (pass parameters with --param KEY=VALUE)",
    "EXECUTE": "PREPARE/EXECUTE are not supported here (pass parameters with --param KEY=VALUE)",
    "LOGICAL_PLAN": "this statement type is not allowed here",
    "RELATION": "this statement type is not allowed here",
    "INVALID": "this statement type is not allowed here",
}

# SQL prefixes that parse but whose StatementType is not one of the above or fails to map
_REFUSED_PREFIX = re.compile(r"^\s*(install|force\s+install|load|update\s+extensions|attach|copy|export)\b",
                             re.IGNORECASE)


def one_line(msg: str) -> str:
    """DuckDB's multi-line error (message, LINE n: context, caret line) as one line."""
    lines = [ln.strip() for ln in str(msg).splitlines()]
    lines = [ln for ln in lines if ln and not set(ln) <= {"^", " "}]
    return " | ".join(lines)


def check_statements(con, sql: str) -> list:
    """Parse sql into statements and refuse those that could touch files or extensions.

    Raises QueryRefused (one line naming the statement) or ValueError (a parse error in
    DuckDB's words). Returns the parsed statements.
    """
    import duckdb
    try:
        stmts = con.extract_statements(sql)
    except duckdb.Error as e:
        raise ValueError(f"SQL error: {one_line(e)}") from None
    except ValueError:
        # a statement type this duckdb build cannot name (e.g. UPDATE EXTENSIONS)
        raise QueryRefused("refused: this statement type is not allowed in a read-only session") from None
    if not stmts:
        raise ValueError("SQL error: no statement in the query")
    for st in stmts:
        try:
            kind = st.type.name
        except ValueError:  # a statement type this duckdb build cannot name (UPDATE EXTENSIONS)
            raise QueryRefused(f"refused: this statement type is not allowed in a read-only session: "
                               f"{_snippet(getattr(st, 'query', '') or sql)}") from None
        text = getattr(st, "query", "") or ""
        if kind in REFUSED:
            raise QueryRefused(f"refused: {REFUSED[kind]}: {_snippet(text)}")
        if kind == "PRAGMA" and re.match(r"^\s*copy\b", text, re.IGNORECASE):
            raise QueryRefused(f"refused: {REFUSED['COPY_DATABASE']}: {_snippet(text)}")
        if _REFUSED_PREFIX.match(text):
            raise QueryRefused(f"refused: this statement touches files or extensions: {_snippet(text)}")
    return stmts


def _snippet(text: str, n: int = 60) -> str:
    t = " ".join(text.split())
    return t if len(t) <= n else t[: n - 3] + "..."


def translate_error(e: Exception) -> Exception:
    """A duckdb.Error as a one-line ValueError/QueryRefused the CLI prints with exit 2."""
    import duckdb
    msg = one_line(e)
    if isinstance(e, duckdb.PermissionException) or "disabled by configuration" in msg:
        return QueryRefused(f"refused (read-only, offline session): {msg}")
    m = re.search(r"in the (\w+) extension|extension \"?(\w+)\"? (?:is not loaded|not found)", msg)
    if m or "autoinstall_known_extensions" in msg or "autoload_known_extensions" in msg:
        first = one_line(str(e).splitlines()[0]) if str(e).strip() else msg
        return QueryRefused(f"refused (offline, no extensions: nothing is installed or loaded): {first}")
    if "configuration has been locked" in msg:
        return QueryRefused(f"refused (settings are locked in a read-only session): {msg}")
    return ValueError(f"SQL error: {msg}")


def sql_str(s) -> str:
    """A SQL string literal."""
    return "'" + str(s).replace("'", "''") + "'"


# settings applied before the views exist (order matters: allowed_paths, then the switch)
HARDEN = [
    ("autoinstall_known_extensions", "false"),
    ("autoload_known_extensions", "false"),
    ("allow_community_extensions", "false"),
    ("allow_unsigned_extensions", "false"),
    ("allow_extension_repositories", "'forbidden'"),   # duckdb >= 2.0
    ("python_enable_replacements", "false"),
    ("temp_directory", "''"),                          # no spill files
    ("allow_persistent_secrets", "false"),
    ("parquet_metadata_cache", "true"),                # each file's footer parsed once per session
]
REQUIRED_SETTINGS = ("enable_external_access", "lock_configuration", "autoinstall_known_extensions",
                     "autoload_known_extensions")


def set_option(con, name: str, value: str, required: bool) -> None:
    """SET name = value; a setting this duckdb build lacks is skipped unless required."""
    import duckdb
    try:
        con.execute(f"SET {name} = {value}")
    except duckdb.Error:
        if required or name in REQUIRED_SETTINGS:
            raise


def check_threads(threads) -> None:
    """--threads: None (all) or 1 .. 4 x the cores; InputError otherwise."""
    most = 4 * (os.cpu_count() or 1)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or not 1 <= threads <= most):
        # 100000 spawned 31k threads and hung; -1 was a traceback
        raise InputError(None, f"--threads must be between 1 and {most} (4 x this machine's cores), got {threads}")


def set_variables(con, variables) -> None:
    """SET VARIABLE for each --param (names checked: they are spliced into the SQL)."""
    for k, v in (variables or {}).items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
            raise ValueError(f"--param {k!r}: names are letters, digits and '_'")
        con.execute(f"SET VARIABLE {k} = $v", {"v": v})


def guarded_connection(threads: int | None, files):
    """An in-memory DuckDB connection with every HARDEN setting and external access off,
    the given files (the trace's Parquet files; none for engine outputs) the only ones it
    may read. Not locked yet: the caller adds its views, then lock()."""
    import duckdb

    config = {"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    if threads:
        config["threads"] = str(int(threads))
    con = duckdb.connect(":memory:", config=config)
    try:
        for name, value in HARDEN:
            set_option(con, name, value, required=False)
        allowed = ", ".join(sql_str(f) for f in files)
        con.execute(f"SET allowed_paths = [{allowed}]")
        con.execute("SET allowed_directories = []")
        con.execute("SET enable_external_access = false")
    except BaseException:
        con.close()
        raise
    return con


def lock(con, variables) -> None:
    """Set the query's variables (getvariable() in canned queries), then lock the
    configuration: no SET can undo the hardening after this."""
    set_variables(con, variables)
    con.execute("SET lock_configuration = true")


# statement types whose result is rows worth printing; others run and print nothing
ROW_TYPES = {"SELECT", "EXPLAIN", "PRAGMA", "CALL", "MULTI"}


def execute(con, sql: str):
    """Run (possibly several) statements after the refusal check.

    Returns a DuckDB relation for the last statement when it yields rows, else None.
    Errors come back as one-line ValueError / QueryRefused.
    """
    import duckdb
    stmts = check_statements(con, sql)
    try:
        for st in stmts[:-1]:
            con.execute(st.query)
        last = stmts[-1]
        if last.type.name not in ROW_TYPES:
            con.execute(last.query)
            return None
        return con.sql(last.query)
    except duckdb.Error as e:
        raise translate_error(e) from None


def fetch_arrow(con, sql: str) -> pa.Table:
    """execute() and fetch the last statement's rows as an Arrow table (empty when none)."""
    import duckdb
    rel = execute(con, sql)
    if rel is None:
        return pa.table({})
    try:
        return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
    except duckdb.Error as e:
        raise translate_error(e) from None


def fetch_batches(con, sql: str, rows_per_batch: int = 65536):
    """execute() and stream the result: (schema, iterator of RecordBatch), or (None, empty)."""
    import duckdb
    rel = execute(con, sql)
    if rel is None:
        return None, iter(())
    try:
        reader = (rel.to_arrow_reader(rows_per_batch) if hasattr(rel, "to_arrow_reader")
                  else rel.record_batch(rows_per_batch))
    except duckdb.Error as e:
        raise translate_error(e) from None

    def _batches():
        try:
            yield from reader
        except duckdb.Error as e:
            raise translate_error(e) from None
        except OSError as e:  # pyarrow wraps errors raised inside the stream
            raise ValueError(f"SQL error: {one_line(e)}") from None
    return reader.schema, _batches()
