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

_LIB = library(Path(__file__).with_name("sums_kernels.c"))
_RUN_SUMS = bind(_LIB, "run_sums", "i l l l l l l b oq ol", True)
MAX_BIN = 4096   # as RunSums.depth_bins clips (and the C's MAX_BIN)
# the C's sums [8], in its order: RunSums.per_row's counters
KEYS = ("drafted", "accepted", "accepted_counter", "committed", "commit_len_sum", "width_sum", "refused", "steps")


def run_sums(f) -> tuple[dict, np.ndarray]:
    """A frame's {counter: int} (RunSums.per_row's, each summed as numpy's int64 sum)
    and its depth histogram (np.bincount of RunSums.depth_bins: int64, up to the highest
    bin used)."""
    sums = np.zeros(len(KEYS), dtype=np.uint64)
    hist = np.zeros(MAX_BIN + 1, dtype=np.int64)
    top = _RUN_SUMS(f.R, f.n, f.true_depth, f.accepted_depth, f.commit_n, f.commit_len, f.budget, f.ok,
                    sums, hist)
    return dict(zip(KEYS, sums.view(np.int64).tolist())), hist[: top + 1]
