"""The interactive `specaudit query PATH`: the duckdb CLI over the same views, in safe mode."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path


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
