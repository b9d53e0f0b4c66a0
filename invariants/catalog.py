"""The catalog as text: what `specaudit rules` prints (one rule's documentation, a family
table, or JSON). Rules come from registry.load_rules; this module only selects and renders.

    print(render(load_rules(), "SA3"))
"""
from __future__ import annotations

import json

FAMILIES = {
    "SA0": "input", "SA1": "shapes and tree structure", "SA2": "positions and attention mask",
    "SA3": "accepted path and per-step counters", "SA4": "continuity, requests table, lossless",
    "SA5": "aggregates against run.json reported", "SA6": "conventions of other engines",
    "SA7": "engine logs and Prometheus text", "SA8": "speculative sampling (contract v2)", "SA9": "user rules",
}


def describe(rule) -> str:
    """One rule: head line, What / Why / Example, the message template."""
    head = f"{rule.code} {rule.name} ({rule.severity}, scope {rule.scope})"
    return "\n".join([head, "=" * len(head), "", rule.doc(), "", f"Message: {rule.message}"]) + "\n"


def select(rules, code: str | None) -> tuple[list, bool]:
    """-> (the rules a code or prefix names, whether it named one rule exactly); all rules
    for no code. ValueError when nothing matches."""
    code = (code or "").strip().upper()
    if not code:
        return list(rules), False
    exact = [r for r in rules if r.code == code]
    chosen = exact or [r for r in rules if r.code.startswith(code)]
    if not chosen:
        raise ValueError(f"no rule {code!r}; `specaudit rules` lists them")
    return chosen, bool(exact)


def render(rules, code: str | None = None, output_format: str = "text") -> str:
    """The text `specaudit rules [CODE]` prints."""
    chosen, exact = select(rules, code)
    if output_format == "json":
        return json.dumps([{"code": r.code, "name": r.name, "severity": r.severity, "scope": r.scope,
                            "message": r.message, "summary": r.summary(), "doc": r.doc()} for r in chosen],
                          indent=1) + "\n"
    if exact:
        return describe(chosen[0])
    lines, fam = [], None
    w = max(len(r.name) for r in chosen)
    for r in chosen:
        if r.code[:3] != fam:
            fam = r.code[:3]
            if fam != chosen[0].code[:3]:
                lines.append("")
            lines.append(f"{fam}xx  {FAMILIES.get(fam, '')}")
        summ = r.summary()
        summ = summ if len(summ) <= 90 else summ[:87].rstrip() + "..."
        lines.append(f"  {r.code}  {r.name:<{w}}  {r.severity:<7}  {summ}")
    lines.append(f"\n{len(chosen)} rules; `specaudit rules CODE` explains one.")
    return "\n".join(lines) + "\n"
