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
import os
import sys

from specaudit import __version__
from specaudit.audit.formats import printable
from specaudit.interrupts import Terminated

EPILOG = """\
exit codes: 0 clean, 1 violations or findings, 2 usage or input error,
            3 internal error (a bug in specaudit: one line names the input; please report it)
start with:  specaudit demo        (runs, checks and reports on the embedded models)
docs:        specaudit COMMAND --help;  specaudit rules (the invariant catalog)
"""


def command_modules():
    from specaudit import commands
    # the folder listed directly: pkgutil.iter_modules imports inspect (a third of the
    # start-up of `specaudit check --help` in a fresh venv)
    names = sorted({f[:-3] for d in commands.__path__ for f in os.listdir(d)
                    if f.endswith(".py") and not f.startswith("_")})
    mods = [importlib.import_module(f"{commands.__name__}.{name}") for name in names]
    mods.sort(key=lambda m: (getattr(m, "ORDER", 50), m.__name__))
    return mods


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="specaudit", description="Audit the metrics of speculative decoding from evidence.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"specaudit {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    ap.subparsers = {}
    for mod in command_modules():
        name = getattr(mod, "NAME", mod.__name__.rsplit(".", 1)[-1].replace("_", "-"))
        p = sub.add_parser(name, help=mod.HELP, description=(mod.__doc__ or mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_main=_entry(mod))
        ap.subparsers[name] = p
    return ap


def _entry(mod):
    """The command's main, preceded by the check that its extra (EXTRA, e.g. "runtime") is
    installed: a missing one is named in one line (exit 2) before anything runs."""
    extra = getattr(mod, "EXTRA", None)
    if extra is None:
        return mod.main

    def main(args):
        from specaudit.commands._extras import missing_for
        why = missing_for(extra)
        if why:
            print(f"specaudit {args.command}: error: {why}", file=sys.stderr)
            return 2
        return mod.main(args)
    return main


def _input_error():
    """InputError, imported when an exception is being handled: the contract module
    (numpy, pyarrow) stays out of `specaudit check --help`."""
    from specaudit.trace.safe_io import InputError
    return InputError


def _options(p: argparse.ArgumentParser) -> dict:
    """option string -> its action, of one (sub)parser."""
    return {o: a for a in p._actions for o in a.option_strings}


def unknown_hint(command: str | None, extras: list[str], ap: argparse.ArgumentParser, argv=None) -> str:
    """Why options were not recognised and where they go: the one machine-output spelling
    (--output-format), the arms of `ab`, or the closest option of the command."""
    import difflib
    sp = getattr(ap, "subparsers", {}).get(command)
    opts = _options(sp) if sp is not None else {}
    flags = [x.split("=", 1)[0] for x in extras if x.startswith("-")]
    for f in flags:
        if f in ("--format", "--json", "--output_format", "--outputformat", "-f"):
            fmt = opts.get("--output-format")
            if fmt is not None and fmt.choices:
                return f"machine output is spelled --output-format ({', '.join(fmt.choices)}) in every command"
            return f"`specaudit {command}` has no machine output option"
    if command == "ab":
        from specaudit.runtime.options import add_runtime_arguments
        arm = argparse.ArgumentParser(add_help=False)
        add_runtime_arguments(arm)
        arm_opts = [f for f in flags if f in _options(arm)]
        words = list(argv if argv is not None else sys.argv[1:])
        given = []
        for f in arm_opts:   # the option with the value the user gave it, for the example
            i = next((k for k, w in enumerate(words) if w.split("=", 1)[0] == f), None)
            val = words[i + 1] if i is not None and "=" not in words[i] and i + 1 < len(words) \
                and not words[i + 1].startswith("-") else None
            given.append(words[i] if i is not None and "=" in words[i] else f + (f" {val}" if val else ""))
        if arm_opts:
            return (f"{', '.join(arm_opts)} belong{'s' if len(arm_opts) == 1 else ''} to an arm: put "
                    f"{'it' if len(arm_opts) == 1 else 'them'} inside both --a=\"...\" and --b=\"...\" "
                    f"(e.g. --a=\"--algo chain {' '.join(given)}\")")
    for f in flags:
        close = difflib.get_close_matches(f, [o for o in opts if o.startswith("--")], n=1, cutoff=0.6)
        if close:
            return f"did you mean {close[0]}?"
    return ""


def main(argv=None) -> int:
    ap = build_parser()
    args, extras = ap.parse_known_args(argv)
    if extras:
        cmd = getattr(args, "command", None)
        sp = getattr(ap, "subparsers", {}).get(cmd, ap)
        hint = unknown_hint(cmd, extras, ap, argv)
        sp.print_usage(sys.stderr)
        print(f"{sp.prog}: error: unrecognized arguments: {' '.join(extras)}" + (f"; {hint}" if hint else ""),
              file=sys.stderr)
        return 2
    if not getattr(args, "_main", None):
        ap.print_help()
        return 2
    try:
        if getattr(args, "list_faults", False):     # beside every --inject (specaudit.cli_vocab)
            from specaudit.cli_vocab import list_faults
            return list_faults()
        from specaudit.bounds import check_args
        check_args(args.command, ap.subparsers.get(args.command), args)   # every typed size, up front
        return int(args._main(args) or 0)
    except _input_error() as e:
        print(f"specaudit {args.command}: error: {printable(e)}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, PermissionError, IsADirectoryError) as e:
        print(f"specaudit {args.command}: error: {printable(e)}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"specaudit {args.command}: terminated (SIGTERM); what was written so far is readable", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"specaudit {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:
        return internal_error(args.command, e)


EXIT_INTERNAL = 3


def internal_error(command: str, e: BaseException) -> int:
    """One line naming the bug and the input that triggered it; exit 3.

    SPECAUDIT_DEBUG=1 prints the traceback as well (for the bug report). A missing optional
    dependency is not a bug: one line names the extra that installs it, exit 2."""
    from specaudit.commands._extras import missing_module
    from specaudit.trace.safe_io import last_input
    why = missing_module(e)   # an extra's module reached on a path the command-level check misses
    if why:
        print(f"specaudit {command}: error: {why}", file=sys.stderr)
        return 2
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
