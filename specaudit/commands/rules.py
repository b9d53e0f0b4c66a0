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

import json

HELP = "list the invariant catalog, or explain one rule (specaudit rules SA301)"
ORDER = 21

FAMILIES = {
    "SA0": "input", "SA1": "shapes and tree structure", "SA2": "positions and attention mask",
    "SA3": "accepted path and per-step counters", "SA4": "continuity, requests table, lossless",
    "SA5": "aggregates against run.json reported", "SA6": "conventions of other engines",
    "SA7": "engine logs and Prometheus text", "SA9": "user rules",
}


def add_arguments(p) -> None:
    p.add_argument("code", nargs="?", help="a rule code (SA301) or a prefix (SA3)")
    p.add_argument("--output-format", choices=["text", "json"], default="text")
    p.add_argument("--invariants", action="append", metavar="DIR", default=[],
                   help="also load the rules in this folder")
    p.add_argument("--no-entry-points", action="store_true", help="skip rules from installed packages")


def describe(rule) -> str:
    head = f"{rule.code} {rule.name} ({rule.severity}, scope {rule.scope})"
    return "\n".join([head, "=" * len(head), "", rule.doc(), "", f"Message: {rule.message}"]) + "\n"


def main(args) -> int:
    from specaudit.invariants import load_rules
    rules = load_rules(dirs=args.invariants, entry_points=not args.no_entry_points)
    code = (args.code or "").strip().upper()
    if code:
        exact = [r for r in rules if r.code == code]
        chosen = exact or [r for r in rules if r.code.startswith(code)]
        if not chosen:
            raise ValueError(f"no rule {code!r}; `specaudit rules` lists them")
    else:
        chosen, exact = rules, []
    if args.output_format == "json":
        print(json.dumps([{"code": r.code, "name": r.name, "severity": r.severity, "scope": r.scope,
                           "message": r.message, "summary": r.summary(), "doc": r.doc()} for r in chosen],
                         indent=1))
        return 0
    if exact:
        print(describe(exact[0]), end="")
        return 0
    fam = None
    w = max(len(r.name) for r in chosen)
    for r in chosen:
        if r.code[:3] != fam:
            fam = r.code[:3]
            if fam != chosen[0].code[:3]:
                print()
            print(f"{fam}xx  {FAMILIES.get(fam, '')}")
        summ = r.summary()
        summ = summ if len(summ) <= 90 else summ[:87].rstrip() + "..."
        print(f"  {r.code}  {r.name:<{w}}  {r.severity:<7}  {summ}")
    print(f"\n{len(chosen)} rules; `specaudit rules CODE` explains one.")
    return 0
