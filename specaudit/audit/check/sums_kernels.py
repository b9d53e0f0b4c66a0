"""RunSums' per-batch run counters and depth histogram in one compiled pass:
sums_kernels.c, built and loaded by invariants/compiled.py (importing this module builds
it on first use). Loaded only through invariants/compiled.kernels (None: core.py's
numpy, RunSums.per_row and depth_bins, which stay the definition);
tests/test_compiled_rules.py holds the run totals identical both ways.

    vals, hist = run_sums(f)   # {counter: int} as {k: int(v.sum()) for per_row(f)}, np.bincount(depth_bins(f))
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from specaudit.invariants.compiled import bind, library
from specaudit.invariants.screen import MAX_BIN, SUM_KEYS

# the C's MAX_BIN (RunSums.depth_bins' clip) and its sums [8] in their order: shared with
# the clean-batch screen's pass (invariants/screen.py), which writes the same counters
KEYS = SUM_KEYS

_LIB = library(Path(__file__).with_name("sums_kernels.c"))
_RUN_SUMS = bind(_LIB, "run_sums", "i l l l l l l b oq ol", True)


def run_sums(f) -> tuple[dict, np.ndarray]:
    """A frame's {counter: int} (RunSums.per_row's, each summed as numpy's int64 sum)
    and its depth histogram (np.bincount of RunSums.depth_bins: int64, up to the highest
    bin used)."""
    sums = np.zeros(len(KEYS), dtype=np.uint64)
    hist = np.zeros(MAX_BIN + 1, dtype=np.int64)
    top = _RUN_SUMS(f.R, f.n, f.true_depth, f.accepted_depth, f.commit_n, f.commit_len, f.budget, f.ok,
                    sums, hist)
    return dict(zip(KEYS, sums.view(np.int64).tolist())), hist[: top + 1]
