"""The suite's own scheduling (tests/conftest.py): a module sharing a module-scoped fixture
runs on one worker under --dist loadgroup, and a pytest/pytest-xdist pair that loses the
groups stops the run instead of building every fleet on every worker (pytest-xdist#1386)."""
from __future__ import annotations

import os
from types import SimpleNamespace

import conftest
import pytest


@pytest.fixture(scope="module")
def shared():
    return object()


def test_a_module_fixture_keeps_its_module_on_one_worker(shared, request):
    if "PYTEST_XDIST_WORKER" not in os.environ or not request.config.getvalue("loadgroup"):
        pytest.skip("checks xdist's grouping: runs under scripts/test.sh (-n 4 --dist loadgroup)")
    # the scheduler groups by the id's suffix alone: without it the module's tests scatter
    assert request.node.nodeid.endswith("@tests/test_suite_groups.py"), request.node.nodeid


class _Item:
    def __init__(self, nodeid, group):
        self.nodeid, self.group = nodeid, group

    def iter_markers(self, name):
        return iter([pytest.mark.xdist_group(self.group).mark] if self.group and name == "xdist_group" else [])


def test_lost_groups_stop_the_run(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    config = SimpleNamespace(getvalue=lambda name: name == "loadgroup")
    held = [_Item("tests/a.py::t@tests/a.py", "tests/a.py"), _Item("tests/b.py::t", None)]
    conftest._check_groups_held(config, held)               # grouped, or never grouped: fine
    lost = held + [_Item("tests/c.py::t", "tests/c.py")]
    with pytest.raises(pytest.exit.Exception, match=r"did not group 1 tests \(first: tests/c.py::t\)"):
        conftest._check_groups_held(config, lost)


def test_groups_are_not_checked_outside_loadgroup(monkeypatch):
    lost = [_Item("tests/c.py::t", "tests/c.py")]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    conftest._check_groups_held(SimpleNamespace(getvalue=lambda name: False), lost)
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    conftest._check_groups_held(SimpleNamespace(getvalue=lambda name: True), lost)
