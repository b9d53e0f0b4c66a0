"""tests/ci.py: a missing tool skips on a developer's machine and fails under CI."""
from __future__ import annotations

import ci
import pytest


def test_missing_tool_skips_without_ci_and_fails_with_it(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        ci.missing("frobnicator is not installed")
    with pytest.raises(pytest.skip.Exception):
        ci.import_or_fail("no_such_module_specaudit")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="frobnicator is not installed, and CI is set"):
        ci.missing("frobnicator is not installed")
    with pytest.raises(pytest.fail.Exception, match="cannot import no_such_module_specaudit"):
        ci.import_or_fail("no_such_module_specaudit")
    assert ci.import_or_fail("json").dumps([1]) == "[1]"


def test_need_marks_skip_or_wraps_a_failing_test(monkeypatch):
    def body(tmp_path, capsys):
        return "ran"
    assert ci.need(True, "x")(body) is body
    monkeypatch.delenv("CI", raising=False)
    marked = ci.need(False, "tool missing")(body)
    assert [m.name for m in marked.pytestmark] == ["skip"] and "tool missing" in marked.pytestmark[0].kwargs["reason"]
    monkeypatch.setenv("CI", "1")
    failing = ci.need(False, "tool missing")(body)
    import inspect
    assert list(inspect.signature(failing).parameters) == ["tmp_path", "capsys"]    # the same fixtures
    with pytest.raises(pytest.fail.Exception, match="tool missing"):
        failing(None, None)


def test_module_needs_skips_the_module_without_ci_and_fails_with_it(monkeypatch):
    assert ci.module_needs(True, "AIPerf not installed at /x") is None
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="AIPerf not installed at /x"):
        ci.module_needs(False, "AIPerf not installed at /x")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="AIPerf not installed at /x, and CI is set"):
        ci.module_needs(False, "AIPerf not installed at /x")
