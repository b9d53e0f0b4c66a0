"""The readers' defaults that the commands also print in --help: one home for each value.

Numpy-free on purpose: every command's add_arguments runs at CLI start-up (`check --help`
imports no numeric library, tests/test_ci_install.py), so the commands read these here and
the readers (diff.py, calibrate.py) import them from here too. (The estimator's tolerance,
DEFAULT_TOLERANCE, lives in audit/estimate_model.py, itself numpy-free.)
"""
from __future__ import annotations

# diff: a change of the target's top-1 margin (logits) above this is a verify divergence;
# float32 batch-shape noise is ~1e-5, a real change is >> 1e-2
DEFAULT_MARGIN_TOL = 1e-3
# calibrate: the verify node counts N = budget + 1 and the concurrency levels measured
DEFAULT_N = (2, 4, 8, 9, 13, 16)
DEFAULT_C = (1, 4, 8)
# ab (evidence mode): trace windows are this many consecutive verify forwards at one batch
# size; a stratum is compared only with at least MIN_WINDOWS windows on each side
WINDOW_FORWARDS = 16
MIN_WINDOWS = 3


def csv(values) -> str:
    """(1, 4, 8) -> '1,4,8': a grid as the commands take it."""
    return ",".join(map(str, values))
