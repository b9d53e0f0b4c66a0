"""The SA7xx rules of the catalog (scope "source") run on one Reading, each finding labelled
with the engine, the format version recognised and the conventions of its figures."""
from __future__ import annotations

from specaudit.audit.findings import Finding, rule_findings
from specaudit.audit.sources.reading import Reading


def audit_reading(reading: Reading, select=(), ignore=()) -> list[Finding]:
    """Run every SA7xx (scope "source") rule on a Reading. Each finding carries the engine,
    the format version recognised and the conventions of the figures it is about."""
    from specaudit.invariants import load_rules
    findings = []
    for rule in load_rules(select=select, ignore=ignore, entry_points=False):
        if rule.scope != "source":
            continue
        findings += rule_findings(rule, rule.check(reading), file=reading.path)
    by_line = {w.line: w for w in reading.windows if w.line is not None}
    for f in findings:
        w = by_line.get(f.line)
        f.values.setdefault("engine", (w.engine if w is not None and w.engine else reading.engine))
        version = (w.version if w is not None and w.version else reading.version)
        f.values.setdefault("version", version or "not inferable from this output")
        conv = dict(reading.conventions)
        if w is not None:
            conv.update(w.conventions)
        if conv:
            f.values.setdefault("conventions", conv)
    findings.sort(key=lambda f: (f.line if f.line is not None else -1, f.code))
    return findings


def source_rule_codes(select=(), ignore=()) -> list:
    """The codes audit_reading runs under select / ignore: the rules a check of engine
    output ran (its summary's "rules"; JUnit lists the ones that found nothing as passing)."""
    from specaudit.invariants import load_rules
    # rules over gathered evidence (a client's export beside a trace, SA59x) take no Reading: they ran on none
    return [r.code for r in load_rules(select=select, ignore=ignore, entry_points=False)
            if r.scope == "source" and not hasattr(r, "evidence")]


def audit_into(reading: Reading, acc, select=(), ignore=()) -> list[Finding]:
    """audit_reading, with the reading added to its account (sources.account.Account)
    together with what the rules looked at and left unflagged (reading.remarks)."""
    acc.add(reading)
    found = audit_reading(reading, select=select, ignore=ignore)
    for text in reading.remarks:
        acc.remark(text)
    return found


def rule_findings_of_notes(path, notes, select=(), ignore=()) -> list[Finding]:
    """SA700 findings for the skipped lines of a file that gave no windows."""
    if not notes:
        return []
    return audit_reading(Reading(source="", engine="", path=str(path), notes=list(notes)), select=select,
                         ignore=ignore)
