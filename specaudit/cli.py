"""The `specaudit` command line: thin wrappers over library functions.

Each subcommand lives in specaudit/commands/<name>.py and defines
    HELP: one line for the command list
    def add_arguments(parser) -> None
    def main(args) -> int        # exit code: 0 clean, 1 findings, 2 usage or input error
Heavy imports (torch, duckdb) happen inside main(), so `specaudit check` starts fast.

Bad input never prints a traceback: library code raises InputError (file + reason) or
ValueError, and this module prints one line and exits 2. Any other exception is a bug
in specaudit: one line naming it and the last input a reader noted, exit 3 (never 1,
which means findings).
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from specaudit import __version__
from specaudit.audit.formats import printable
from specaudit.trace.schema import InputError

EPILOG = """\
exit codes: 0 clean, 1 violations or findings, 2 usage or input error,
            3 internal error (a bug in specaudit: one line names the input; please report it)
start with:  specaudit demo        (runs, checks and reports on the embedded models)
docs:        specaudit COMMAND --help;  specaudit rules (the invariant catalog)
"""


def command_modules():
    from specaudit import commands
    mods = []
    for info in pkgutil.iter_modules(commands.__path__):
        if info.name.startswith("_"):
            continue
        mods.append(importlib.import_module(f"{commands.__name__}.{info.name}"))
    mods.sort(key=lambda m: (getattr(m, "ORDER", 50), m.__name__))
    return mods


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="specaudit", description="Audit the metrics of speculative decoding from evidence.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"specaudit {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for mod in command_modules():
        name = getattr(mod, "NAME", mod.__name__.rsplit(".", 1)[-1].replace("_", "-"))
        p = sub.add_parser(name, help=mod.HELP, description=(mod.__doc__ or mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not getattr(args, "_main", None):
        ap.print_help()
        return 2
    try:
        return int(args._main(args) or 0)
    except InputError as e:
        print(f"specaudit {args.command}: error: {printable(e)}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, PermissionError, IsADirectoryError) as e:
        print(f"specaudit {args.command}: error: {printable(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specaudit {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - a bug: never a traceback, never exit 1 (findings)
        return internal_error(args.command, e)


EXIT_INTERNAL = 3


def internal_error(command: str, e: BaseException) -> int:
    """One line naming the bug and the input that triggered it; exit 3.

    SPECAUDIT_DEBUG=1 prints the traceback as well (for the bug report)."""
    import os
    from specaudit.trace.schema import last_input
    if os.environ.get("SPECAUDIT_DEBUG"):
        import traceback
        traceback.print_exc()
    where = last_input()
    msg = printable(" ".join(str(e).split())[:200])
    print(f"specaudit {command}: internal error (a bug in specaudit, please report it)"
          f"{' while reading ' + printable(where) if where else ''}: {type(e).__name__}{': ' + msg if msg else ''}",
          file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
