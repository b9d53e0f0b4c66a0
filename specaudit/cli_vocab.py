"""One vocabulary across commands: the shared spellings, hidden old ones, --list-faults.

The same thing has the same flag in every command:
    --out DIR          a folder a command writes into (run, serve, ab, report, dashboards, demo)
    -o / --output FILE a report a command writes instead of stdout (check, query, ab)
    --output-format    machine output; every command's default is `text`
    --branching N      most children per tree node (the draft tree's shape)
    --top-k K          speculative sampling's top-k filter (a different thing)
    --profile FILE     a cost profile from `specaudit calibrate`
    --list-faults      beside every --inject

Old spellings (`--topk`, `serve --trace-dir`, `serve --calibration`, `query
--output-format table`) still parse for one release: hidden from --help, same dest.
"""
from __future__ import annotations

import argparse


def hidden_alias(g, old: str, dest: str, **kw) -> None:
    """An old spelling of an option: parses into `dest`, absent from --help."""
    g.add_argument(old, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kw)


def add_list_faults(g) -> None:
    """--list-faults beside --inject; specaudit.cli answers it before the command runs, so
    nothing else the command needs (--out, a model) has to be given."""
    g.add_argument("--list-faults", action="store_true", help="list the faults --inject knows and exit")


def list_faults() -> int:
    from specaudit.runtime.faults import describe_faults
    print(describe_faults())
    return 0
