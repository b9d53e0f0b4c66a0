"""scripts/benchutil.py: benchmarks read the load beside their figures and withhold ratios when busy."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import benchutil
import pytest

from specaudit import machine_load


@pytest.fixture(autouse=True)
def _default_rule(monkeypatch):
    monkeypatch.delenv(machine_load.ENV, raising=False)


def test_busy_machine_withholds_ratios(monkeypatch):
    monkeypatch.setattr(machine_load, "load_avg", lambda: 9.0)
    monkeypatch.setattr(machine_load, "cores", lambda: 2)
    out = {"trace_overhead": 0.003, "tokens_per_s": 900.0}
    out.update(benchutil.load_fields())
    assert out["machine_quiet"] is False and out["load_threshold"] == 1.5 and out["load_avg_1m"] == 9.0
    benchutil.guard_ratios(out, ["trace_overhead"])
    assert out["trace_overhead"] is None and "load average 9.0" in out["withheld"]
    assert out["tokens_per_s"] == 900.0  # only the named ratios are withheld


def test_quiet_machine_keeps_ratios_and_waits_for_quiet(monkeypatch):
    loads = iter([5.0, 4.0, 0.5, 0.5])
    monkeypatch.setattr(machine_load, "load_avg", lambda: next(loads))
    monkeypatch.setattr(machine_load, "cores", lambda: 2)
    monkeypatch.setattr(benchutil.time, "sleep", lambda s: None)
    assert benchutil.quiet_machine(wait_s=60, poll_s=0) == 0.5
    out = {"scrape_overhead": 0.001, **benchutil.load_fields()}
    assert benchutil.guard_ratios(out, ["scrape_overhead"])["scrape_overhead"] == 0.001 and "withheld" not in out


def test_the_override_is_honoured(monkeypatch):
    """SPECAUDIT_BENCH_LOAD moves the threshold, read at each call (tests/test_demo_busy.py: the demo alike)."""
    monkeypatch.setattr(machine_load, "load_avg", lambda: 3.0)
    monkeypatch.setattr(machine_load, "cores", lambda: 2)
    assert benchutil.load_fields()["machine_quiet"] is False
    monkeypatch.setenv(machine_load.ENV, "2")
    assert benchutil.load_fields() == {"load_avg_1m": 3.0, "cores": 2, "load_threshold": 4.0, "machine_quiet": True}
    assert benchutil.quiet_machine(wait_s=0) == 3.0
