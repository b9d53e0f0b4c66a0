"""What a check returns: CheckResult (findings capped per code, counts uncapped, the
files, runs and rows checked), how an unreadable input is recorded (result_bad), and
how one run's result is added to a dataset's (merge_result)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from specaudit.audit.findings import Finding


@dataclass
class CheckResult:
    findings: list = field(default_factory=list)      # capped per code (see max_per_code)
    counts: Counter = field(default_factory=Counter)  # code -> all findings, uncapped
    severities: dict = field(default_factory=dict)    # code -> severity
    names: dict = field(default_factory=dict)         # code -> rule name
    files_checked: list = field(default_factory=list)
    bad_files: list = field(default_factory=list)     # (path, reason)
    incomplete_runs: list = field(default_factory=list)  # (run_id, reason)
    runs: list = field(default_factory=list)          # run ids checked
    readings: list = field(default_factory=list)      # engine inputs: their accounts (sources.account)
    steps: int = 0
    requests: int = 0
    rules: list = field(default_factory=list)         # codes run
    max_per_code: int = 1000
    # told the step rows as they are checked: callable(rows) (the CLI's progress), or None.
    # Called per batch of a run checked into this result, and with a run's steps when a
    # result checked elsewhere (a pool, a worker) is merged in: each row once
    on_rows: object = field(default=None, repr=False, compare=False)

    def bad_input(self, path, reason: str, run_id=None) -> None:
        """An input that could not be read: in bad_files and as one SA000 finding (path and
        reason on one line). A method, so readers handed a result record it without importing
        this module."""
        from specaudit.invariants import get_rule
        self.bad_files.append((str(path), reason))
        self.add(get_rule("SA000").finding(run_id=run_id, file=str(path), where=str(path), reason=reason))

    @property
    def errors(self) -> int:
        return sum(n for c, n in self.counts.items() if self.severities.get(c) == "error")

    @property
    def violations(self) -> int:
        return self.errors

    @property
    def checked_anything(self) -> bool:
        return bool(self.files_checked or self.runs)

    @property
    def exit_code(self) -> int:
        if not self.checked_anything:
            return 2
        return 1 if self.errors else 0

    def add(self, f: Finding) -> None:
        self.counts[f.code] += 1
        self.severities.setdefault(f.code, f.severity)
        self.names.setdefault(f.code, f.name)
        if self.max_per_code <= 0 or self.counts[f.code] <= self.max_per_code:
            self.findings.append(f)

    def summary(self) -> dict:
        return {
            "runs": len(self.runs), "steps": self.steps, "requests": self.requests,
            "files_checked": len(self.files_checked), "bad_files": len(self.bad_files),
            "incomplete_runs": len(self.incomplete_runs), "violations": self.errors,
            "findings": sum(self.counts.values()), "rules": len(self.rules),
        }


def result_bad(result: CheckResult, path, reason: str, run_id=None) -> None:
    result.bad_input(path, reason, run_id)


def merge_result(into: CheckResult, part: CheckResult) -> None:
    """Add one run's result (checked on its own, same cap) to `into`, as if its findings
    had been added to `into` one by one: the same findings shown, the same counts."""
    shown: Counter = Counter()
    for fd in part.findings:
        into.add(fd)
        shown[fd.code] += 1
    for code, n in part.counts.items():
        extra = n - shown[code]
        if extra:
            into.counts[code] += extra
            into.severities.setdefault(code, part.severities.get(code))
            into.names.setdefault(code, part.names.get(code))
    into.files_checked.extend(part.files_checked)
    into.bad_files.extend(part.bad_files)
    into.incomplete_runs.extend(part.incomplete_runs)
    into.runs.extend(part.runs)
    into.steps += part.steps
    into.requests += part.requests
    if into.on_rows is not None and part.steps:
        into.on_rows(part.steps)
