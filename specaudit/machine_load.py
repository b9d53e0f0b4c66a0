"""The busy-machine rule: when a timing measures other jobs rather than the code timed.

One definition for the demo's throughput verdict, the benchmarks (scripts/benchutil.py)
and every script that prints the load beside its figures. A figure measured while other
processes compete for the cores is noise, not a result:

    busy  <=>  1-minute load average  >  threshold(own)
    threshold(own) = max(per_core() x cores(), own + NOISE)

per_core() is 0.75 runnable processes per core (on 2 cores 1.5: one timed process plus a
little noise), or the SPECAUDIT_BENCH_LOAD environment variable's value, read at each
call (so CI or a test can move it; 1e9 never calls a machine busy). `own` is the load
the caller itself keeps up while the load is read (the demo decodes on one core, so
own=1): on one core the per-core share alone (0.75) would call the caller's own process
"busy", and the floor own + NOISE keeps it quiet.

load_fields() is what every figure carries beside it: load_avg_1m, cores, load_threshold,
machine_quiet (the keys docs/benchmarks/*.json and scripts/render_docs.py read).
Standard library only: the standalone scripts (the llama.cpp build, the tiny models, the
vLLM probes, some run under another interpreter) import it with the repository root on
sys.path.
"""
from __future__ import annotations

import os

ENV = "SPECAUDIT_BENCH_LOAD"
DEFAULT_PER_CORE = 0.75   # runnable processes per core above which timings are other jobs'
NOISE = 0.25              # load above the caller's own processes that is still "quiet"


def per_core() -> float:
    """Runnable processes per core allowed: SPECAUDIT_BENCH_LOAD, else DEFAULT_PER_CORE."""
    raw = os.environ.get(ENV)
    if raw is None or not raw.strip():
        return DEFAULT_PER_CORE
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: not a number (runnable processes per core, e.g. 0.75)") from None
    if not v >= 0:   # (NaN too)
        raise ValueError(f"{ENV}={raw!r}: must be a number >= 0 (runnable processes per core, e.g. 0.75)")
    return v


def cores() -> int:
    return os.cpu_count() or 1


def load_avg() -> float:
    """The 1-minute load average; 0.0 (quiet) where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0.0


def threshold(n_cores: int | None = None, own: float = 0.0) -> float:
    """The load above which the machine is busy, on `n_cores` (default: this machine's)
    for a caller that itself keeps `own` processes running."""
    n = cores() if n_cores is None else n_cores
    return max(per_core() * n, own + NOISE)


def is_busy(load: float, n_cores: int | None = None, own: float = 0.0) -> bool:
    """The verdict: `load` above the threshold (the threshold itself is quiet)."""
    return load > threshold(n_cores, own)


def load_fields(own: float = 0.0) -> dict:
    """The load keys every figure carries, read now (after the measurement):
    {load_avg_1m, cores, load_threshold, machine_quiet}."""
    load, n = load_avg(), cores()
    return {"load_avg_1m": round(load, 2), "cores": n, "load_threshold": round(threshold(n, own), 2),
            "machine_quiet": not is_busy(load, n, own)}
