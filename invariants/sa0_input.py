"""SA0xx: the input itself (emitted by the engine, not by a check over rows)."""
from __future__ import annotations

from .base import Rule


class UnreadableInput(Rule):
    """What: a trace file could not be read: not Parquet, truncated, a required column
    missing or of the wrong type, a run.json that is not JSON or names an unknown
    schema_version.

    Why: a file the checker cannot read is a file nobody checked; the other files of
    the dataset are still checked, and the bad one is named with its reason.

    Example: `traces/run_id=r1/steps-000003.parquet: cannot read as Parquet: Parquet
    magic bytes not found in footer` (the writer was killed mid-file without the
    atomic rename).
    """

    code = "SA000"
    name = "unreadable-input"
    severity = "error"
    scope = "run"
    message = "{reason}"

    def check(self, ctx):
        return None  # emitted by specaudit.check when a file fails to load

    def fail(self, run):
        for s in run.steps:  # the step column written as strings: wrong type
            s["step"] = str(s["step"])


class IncompleteRun(Rule):
    """What: a run has no `finished_at` in run.json or no requests table: it was killed
    (or is still running). Its step rows are checked for what they hold; request and
    aggregate rules that need the end of the run are skipped.

    Why: a run killed at any moment must stay readable (the contract); it is
    reported, not failed.

    Example: `run r7: incomplete: no finished_at in run.json; no requests table`.
    """

    code = "SA001"
    name = "incomplete-run"
    severity = "info"
    scope = "run"
    message = "incomplete: {reason}"

    def check(self, ctx):
        return None  # emitted by specaudit.check

    def fail(self, run):
        run.requests = None
        run.manifest.pop("finished_at", None)


class DuplicateRun(Rule):
    """What: one run id appears in two folders of the checked paths (a run copied into
    a second folder of the dataset, or the same trace passed twice under two names).

    Why: readers that sum over runs (query, report, the views) would count it twice;
    each copy is still checked, and readers that aggregate keep the first folder only.

    Example: `traces/run_id=r1/` and `traces/backup/run_id=r1/` both hold run r1.
    """

    code = "SA002"
    name = "duplicate-run"
    severity = "warning"
    scope = "run"
    message = "run {run_id_again} is also in {first}: a copy, counted once by readers that sum over runs"

    def check(self, ctx):
        return None  # emitted by specaudit.check, which sees every folder

    def fail(self, run):
        run.copies = 2
