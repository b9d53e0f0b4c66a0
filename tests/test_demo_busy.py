"""The demo withholds its throughput verdict on a busy machine: the runs were timed
minutes before the calibration, so other jobs slow them by different amounts and a
healthy run would look broken (seen under CI's load: "contradicts both counters").
The rule is specaudit/machine_load.py's, the benchmarks' own (tests/test_benchutil.py)."""
from __future__ import annotations

import pytest

from specaudit import machine_load
from specaudit.demo import busy_reason


@pytest.fixture(autouse=True)
def _default_rule(monkeypatch):
    monkeypatch.delenv(machine_load.ENV, raising=False)


def test_quiet_machine_is_judged():
    assert busy_reason(0.0, 2) is None
    assert busy_reason(machine_load.DEFAULT_PER_CORE * 2, 2) is None   # the threshold itself is quiet
    assert busy_reason(1.1, 1) is None                         # one core: the demo alone is not busy
    assert busy_reason(2.0, 1) is not None


def test_busy_machine_is_not_judged_and_says_why():
    why = busy_reason(3.7, 2)
    assert why is not None and why.startswith("not judged")
    assert "3.7" in why and "2 cores" in why and "quiet machine" in why
    assert busy_reason(3.7, 8) is None                         # the same load on 8 cores is quiet


def test_the_override_moves_the_demo_and_the_benchmarks_alike(monkeypatch):
    """SPECAUDIT_BENCH_LOAD is the one knob: 2 per core makes 3.7 on 2 cores quiet for both,
    0.5 per core makes 1.9 on 2 cores busy for both (the demo keeps its own core allowed)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import benchutil
    monkeypatch.setattr(machine_load, "cores", lambda: 2)
    for per_core, load, busy in (("2", 3.7, False), ("0.5", 1.9, True), ("1e9", 50.0, False)):
        monkeypatch.setenv(machine_load.ENV, per_core)
        monkeypatch.setattr(machine_load, "load_avg", lambda load=load: load)
        assert (busy_reason(load, 2) is not None) is busy, (per_core, load)
        fields = benchutil.load_fields()
        assert fields["machine_quiet"] is not busy and fields["load_threshold"] == round(float(per_core) * 2, 2)


def test_a_bad_override_is_named(monkeypatch):
    monkeypatch.setenv(machine_load.ENV, "lots")
    with pytest.raises(ValueError, match="SPECAUDIT_BENCH_LOAD='lots': not a number"):
        busy_reason(1.0, 2)
