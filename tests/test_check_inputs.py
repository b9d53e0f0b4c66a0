"""specaudit/audit/check_inputs: `specaudit check` as a library call (the command only parses)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from specaudit.invariants.fixtures import FixtureRun

from specaudit.audit.check_inputs import parse_codes, run_check, split_inputs

ENGINES = Path(__file__).parent / "fixtures" / "engines"


def test_codes_and_inputs_are_routed(tmp_path):
    assert parse_codes(["sa3, SA501", "SA7"]) == ("SA3", "SA501", "SA7") and parse_codes(None) == ()
    trace = FixtureRun.make("chain").write(tmp_path / "t")
    log = ENGINES / "sglang_accept_len_above_max.log"
    missing = tmp_path / "nowhere"
    assert split_inputs([trace, log, missing]) == ([Path(trace), missing], [log])
    assert split_inputs([trace, log], source="sglang-log") == ([], [Path(trace), log])


def test_a_trace_and_an_engine_log_in_one_result(tmp_path):
    bad = FixtureRun.make("chain")
    bad.steps[0]["accepted_depth"] = 99
    trace = bad.write(tmp_path / "t")
    res, text = run_check([trace, ENGINES / "sglang_accept_len_above_max.log"], output_format="json")
    codes = set(res.counts)
    assert any(c.startswith("SA3") for c in codes) and any(c.startswith("SA7") for c in codes)
    assert res.exit_code == 1 and {f["code"] for f in json.loads(text)["findings"]} <= codes
    only, _ = run_check([trace, ENGINES / "sglang_accept_len_above_max.log"], select=("SA7",))
    assert only.counts and all(c.startswith("SA7") for c in only.counts)


def test_unknown_code_and_nothing_to_check(tmp_path):
    with pytest.raises(ValueError, match="SA3"):
        run_check([tmp_path], select=("SA3999",))
    res, _ = run_check([tmp_path / "nowhere.log"], source="vllm-log")
    assert not res.checked_anything and res.bad_files
