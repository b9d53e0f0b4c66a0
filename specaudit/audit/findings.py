"""What every auditing reader reports: a Finding with a stable code and the numbers.

Shared by the trace checker, the engine-log/metrics readers and the estimator, so all
of them print the same output formats and use the same exit codes:
    0 clean, 1 violations (error findings), 2 usage or input error.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

SEVERITIES = ("error", "warning", "info")


@dataclass
class Finding:
    code: str                    # stable rule code, e.g. "SA301"
    name: str                    # rule name, e.g. "commit-len-vs-depth"
    severity: str                # error | warning | info
    message: str                 # one line, names where and shows the numbers
    run_id: str | None = None
    request_id: str | None = None
    step: int | None = None
    file: str | None = None      # the file the finding is about (trace file, log file)
    line: int | None = None      # line number in a log file
    values: dict = field(default_factory=dict)  # the numbers, machine-readable

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


LOCATION = ("run_id", "request_id", "step", "file", "line")


def rule_findings(rule, out, **where) -> list[Finding]:
    """A catalog rule's check() result as Findings: the one conversion for the readers
    that call rules on inputs of their own (engine outputs, a client's export).

    out: None (nothing applies), or an iterable of Finding (kept as they are) or of dicts
    of the message's values, optionally with location keys (run_id, request_id, step,
    file, line). where: the location a dict gets when it names none (e.g. file=...).
    Each dict goes through rule.finding(), so a rule family's own finding() (the SA7xx
    rules print no location in front of the message) is honoured."""
    if out is None:
        return []
    found = []
    for item in out:
        if isinstance(item, Finding):
            found.append(item)
            continue
        d = dict(item)
        loc = {k: d.pop(k) for k in LOCATION if k in d}
        for k, v in where.items():
            loc.setdefault(k, v)
        found.append(rule.finding(**loc, **d))
    return found
