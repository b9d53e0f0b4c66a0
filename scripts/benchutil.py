"""What every benchmark shares: the machine's load, read beside the figures.

A ratio measured while other processes compete for the cores is noise, not a
regression. `quiet_machine()` waits (up to `wait_s`) for the 1-minute load average to
drop below `threshold` x cores and returns the load it saw; `load_fields()` gives the
keys every benchmark's JSON line carries; `guard_ratios()` withholds the ratios of a
run that stayed busy, so a noisy figure is never mistaken for a result.

    from benchutil import guard_ratios, load_fields, quiet_machine
    quiet_machine()                          # before measuring
    out = {...figures...}
    out.update(load_fields())                # load_avg_1m, cores, load_threshold, machine_quiet
    guard_ratios(out, ["trace_overhead"])    # busy: the ratio becomes null, with the reason
"""
from __future__ import annotations

import os
import sys
import time

# Busy means a 1-minute load average above this many runnable processes per core. On 2
# cores, 0.75 x 2 = 1.5: the benchmark itself (one process) plus a little noise.
THRESHOLD_PER_CORE = float(os.environ.get("SPECAUDIT_BENCH_LOAD", "0.75"))


def cores() -> int:
    return os.cpu_count() or 1


def load_avg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this platform: treat as quiet
        return 0.0


def threshold() -> float:
    return THRESHOLD_PER_CORE * cores()


def quiet_machine(wait_s: float = 120.0, poll_s: float = 5.0, log=sys.stderr) -> float:
    """Wait until the load average is below the threshold (at most wait_s); return the load."""
    t0 = time.time()
    load = load_avg()
    while load > threshold() and time.time() - t0 < wait_s:
        print(f"machine busy: load average {load:.2f} > {threshold():.2f} ({THRESHOLD_PER_CORE} x "
              f"{cores()} cores); waiting", file=log)
        time.sleep(poll_s)
        load = load_avg()
    return load


def load_fields() -> dict:
    """The load keys every benchmark's JSON line carries, read now (after the measurement)."""
    load = load_avg()
    return {"load_avg_1m": round(load, 2), "cores": cores(), "load_threshold": round(threshold(), 2),
            "machine_quiet": load <= threshold()}


def guard_ratios(out: dict, keys) -> dict:
    """Null the ratios in `keys` when the machine was busy, and say why in `withheld`."""
    if out.get("machine_quiet", True):
        return out
    held = [k for k in keys if out.get(k) is not None]
    for k in held:
        out[k] = None
    if held:
        out["withheld"] = (f"{', '.join(held)}: load average {out.get('load_avg_1m')} above "
                           f"{out.get('load_threshold')} while measuring; rerun on a quiet machine")
    return out
