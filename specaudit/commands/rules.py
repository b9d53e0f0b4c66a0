"""List the invariant catalog, or print one rule's documentation.

Examples:
  specaudit rules                      # every rule, grouped by family
  specaudit rules SA3                  # one family (any code prefix)
  specaudit rules SA301                # one rule: What / Why / Example, message, scope
  specaudit rules --output-format json # machine-readable catalog
  specaudit rules --invariants my_rules/  # include your own rules

Families: SA0 input, SA1 shapes and tree, SA2 positions and mask, SA3 accepted path
and per-step counters, SA4 continuity, requests table and lossless, SA5 aggregates
against run.json `reported` (SA59x: a benchmark client's export against the trace),
SA6 conventions of other engines, SA7 engine logs and Prometheus text.
"""
from __future__ import annotations

import sys

HELP = "list the invariant catalog, or explain one rule (specaudit rules SA301)"
ORDER = 21

def add_arguments(p) -> None:
    p.add_argument("code", nargs="?", help="a rule code (SA301) or a prefix (SA3)")
    p.add_argument("--output-format", choices=["text", "json"], default="text")
    p.add_argument("--invariants", action="append", metavar="DIR", default=[],
                   help="also load the rules in this folder")
    p.add_argument("--no-entry-points", action="store_true", help="skip rules from installed packages")


def main(args) -> int:
    from specaudit.invariants import load_rules
    from specaudit.invariants.catalog import render
    rules = load_rules(dirs=args.invariants, entry_points=not args.no_entry_points)
    sys.stdout.write(render(rules, args.code, args.output_format))
    return 0
