"""specaudit/postmortem/report_inputs: `specaudit report` as a library call (the command only parses)."""
from __future__ import annotations

import json

import pytest
from specaudit.invariants.fixtures import FixtureRun

from specaudit.postmortem.report_inputs import load_ab_result, run_report


def test_ab_results_are_told_from_traces(tmp_path):
    (tmp_path / "run.json").write_text("{}")
    assert load_ab_result(tmp_path / "run.json") is None and load_ab_result(tmp_path) is None
    (tmp_path / "ab.json").write_text(json.dumps({"kind": "specaudit-ab-evidence"}))
    assert load_ab_result(tmp_path / "ab.json") == {"kind": "specaudit-ab-evidence"}
    (tmp_path / "other.json").write_text("[1]")
    with pytest.raises(ValueError, match="neither a run.json nor an A/B result"):
        load_ab_result(tmp_path / "other.json")


def test_the_checker_verdict_is_the_exit_code_and_the_page_is_written(tmp_path):
    d = FixtureRun.make("chain").write(tmp_path / "t")
    seen = []

    def checker(paths):
        seen.append(paths)
        return [], {"violations": 3}, 1
    path, summary, rc = run_report([d], tmp_path / "r", checker=checker)
    assert rc == 1 and summary == {"violations": 3} and seen == [[d]] and path.is_file()
    with pytest.raises(ValueError, match="one A/B result"):
        (tmp_path / "a.json").write_text(json.dumps({"kind": "specaudit-ab-evidence"}))
        run_report([tmp_path / "a.json", tmp_path / "a.json"], tmp_path / "r2")
