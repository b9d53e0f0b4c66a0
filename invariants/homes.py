"""Every home of a rule outside the catalog, in one list: what each implements, and where.

    for home in HOMES: print(home.name, sorted(home.codes()))
    print(render_matrix(load_rules()))         # the rule x home table of docs/rules/index.md

The catalog (invariants/sa*.py) is the one home of a rule's identity and its fixtures.
Some rules are computed again elsewhere, for speed or for a place the checker cannot go
(a live server, the GPU, a SQL shell). Each such home declares the codes it computes in
a name exported by its own module; this list only says where to read it and which rule
scopes the home can consume (a per-step sink never sees a run's aggregates).
tests/test_rule_homes.py runs every claimed rule's own pass/fail fixtures through every
home that claims it, and fails when a home claims a code the catalog lacks or a rule
whose scope it cannot see; scripts/render_docs.py writes the matrix below into
docs/rules/index.md, so a new rule shows at once which homes lack it.

The homes are imported only when their codes are asked for (the kernel's needs torch): the
catalog loads without them.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Home:
    """One place outside the catalog that computes catalog rules.

    name      short column name of the matrix
    path      the file that holds the implementation (and the declaration)
    module    the module to import for the declaration
    declares  the module's attribute that lists the codes it computes: a collection of
              codes, or a mapping whose values are codes (or tuples of codes)
    scopes    the rule scopes this home can consume (Rule.scope)
    what      one line: what the home is, and when it runs
    how       what a new rule needs there, when it belongs in this home too
    """

    name: str
    path: str
    module: str
    declares: str
    scopes: tuple
    what: str
    how: str

    def codes(self) -> frozenset:
        """The catalog codes this home says it computes, read from its own module."""
        decl = getattr(importlib.import_module(self.module), self.declares)
        if callable(decl):
            decl = decl()
        vals = decl.values() if isinstance(decl, dict) else decl
        out = set()
        for v in vals:
            out.update((v,) if isinstance(v, str) else v)
        return frozenset(out)


HOMES = (
    Home("oracle", "specaudit/audit/reference.py", "specaudit.audit.reference", "RULES_IMPLEMENTED",
         ("step", "request"),
         "the per-row Python oracle of the greedy contract; the property tests and the checker's "
         "benchmark baseline",
         "every step and request rule of SA1xx-SA4xx: its plain per-row `hit(\"SAnnn\")` in check_step_rows "
         "or check_request_rows, and the code in RULES_IMPLEMENTED (tests/test_check_props.py then checks "
         "the engine flags exactly the same rows)"),
    Home("prom", "specaudit/trace/inline_rules.py", "specaudit.trace.inline_rules", "INLINE_CODES", ("step",),
         "the live rules the Prometheus sink counts on every step batch a traced server writes "
         "(specaudit_invariant_violations_total{code})",
         "a step rule that needs only the row: computed in inline_violations, its code in INLINE_CODES "
         "and `live = (\"prom\",)` on the rule"),
    Home("kernel", "kernels/audit.py", "specaudit.kernels.audit", "rule_codes", ("step",),
         "the fused Triton audit of one verify step (audit_step; audit_step_ref in torch): each flag "
         "of RULES reports the codes whose `live` names `kernel:<flag>`",
         "a step rule the kernel's inputs show: a flag of RULES (audit_step_ref and the Triton kernel "
         "alike), or an existing flag, named on the rule as `live = (\"kernel:<flag>\",)`"),
    Home("sql", "specaudit/postmortem/view_sql.py", "specaudit.postmortem.view_sql", "FIGURE_RULES", ("run",),
         "the post-mortem `figures` view: a derived figure beside the reported one, with the "
         "comparison's verdict (`specaudit query`, `specaudit report`)",
         "a run rule comparing a reported figure with a derived one: a metric of FIGURES_VIEW_SQL "
         "(verdict by specaudit_agrees) and its entry in FIGURE_RULES"),
)


def claims() -> dict:
    """{home name: frozenset of codes} from each home's own declaration."""
    return {h.name: h.codes() for h in HOMES}


def matrix(rules) -> list[tuple]:
    """[(rule, [home names that compute it])] for the given rules, in their order."""
    cl = claims()
    return [(r, [h.name for h in HOMES if r.code in cl[h.name]]) for r in rules]


def render_matrix(rules) -> str:
    """Markdown: one row per rule whose scope some home consumes; x where a home computes it,
    blank where it could (its scope) but does not, - where it cannot (another scope)."""
    names = [h.name for h in HOMES]
    out = ["| rule | scope | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for r, homes in matrix(rules):
        can = [h for h in HOMES if r.scope in h.scopes]
        if not can:
            continue
        cells = ["x" if h.name in homes else ("" if h in can else "-") for h in HOMES]
        out.append(f"| [{r.code}]({r.code}.md) {r.name} | {r.scope} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"
