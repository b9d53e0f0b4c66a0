"""The demo withholds its throughput verdict on a busy machine: the runs were timed
minutes before the calibration, so other jobs slow them by different amounts and a
healthy run would look broken (seen under CI's load: "contradicts both counters")."""
from __future__ import annotations

from specaudit.demo import BUSY_PER_CORE, busy_reason


def test_quiet_machine_is_judged():
    assert busy_reason(0.0, 2) is None
    assert busy_reason(BUSY_PER_CORE * 2, 2) is None          # the threshold itself is quiet
    assert busy_reason(1.1, 1) is None                         # one core: the demo alone is not busy
    assert busy_reason(2.0, 1) is not None


def test_busy_machine_is_not_judged_and_says_why():
    why = busy_reason(3.7, 2)
    assert why is not None and why.startswith("not judged")
    assert "3.7" in why and "2 cores" in why and "quiet machine" in why
    assert busy_reason(3.7, 8) is None                         # the same load on 8 cores is quiet
