"""specaudit/postmortem/query_dataset: `specaudit query` as a library call (the command only parses)."""
from __future__ import annotations

import json

import pytest
from specaudit.invariants.fixtures import FixtureRun

from specaudit.audit.findings import Finding
from specaudit.postmortem.query_dataset import parse_params, run_query, split_args


def test_arguments_split_into_paths_sql_and_name(tmp_path):
    d = FixtureRun.make("chain").write(tmp_path / "t")
    assert split_args([str(d)], None) == ([str(d)], None, None)
    assert split_args([str(d), "acceptance-by-depth"], None) == ([str(d)], None, "acceptance_by_depth")
    assert split_args([str(d), "SELECT 1"], None) == ([str(d)], "SELECT 1", None)
    with pytest.raises(ValueError, match="dataset path first"):
        split_args(["SELECT count(*) FROM steps"], None)
    assert parse_params(["a=3", "b=0.5", "c=x y", "d=nan"]) == {"a": 3, "b": 0.5, "c": "x y", "d": "nan"}


def test_the_checker_is_called_only_for_the_violations_view(tmp_path, capsys):
    d = str(FixtureRun.make("chain").write(tmp_path / "t"))
    calls = []

    def checker(paths):
        calls.append(paths)
        return [Finding("SA301", "x", "error", "m", run_id="r")], {}
    assert run_query([d, "SELECT count(*) AS n FROM steps"], output_format="json", checker=checker) == 0
    assert not calls and json.loads(capsys.readouterr().out)[0]["n"] > 0
    assert run_query([d, "SELECT code FROM violations"], output_format="json", checker=checker) == 0
    assert len(calls) == 1 and json.loads(capsys.readouterr().out) == [{"code": "SA301"}]
    with pytest.raises(ValueError, match="no parameter"):
        run_query([d, "acceptance_by_depth"], params=["nope=1"])
