"""The clean-batch screen's one compiled pass: screen_kernels.c, built and loaded by
invariants/compiled.py (importing this module builds it on first use). Loaded only through
compiled.kernels; invariants/screen.py prepares its arguments and decides what a
refusal means (the batch checked in full by StepFrame, the definition).

    first_bad = screen_rows(R, N, tree, eos, max_new, chain_hash, codes, crow, <columns>,
                            shape_id, shape_hash, shape_depth, shape_kids, shape_par, child_off,
                            child_idx, <carry fields>, sums, hist)
"""
from __future__ import annotations

from pathlib import Path

from .compiled import bind, library

_LIB = library(Path(__file__).with_name("screen_kernels.c"))
# the batch (int32 columns as read, finished as uint8), each list's offsets then values, the
# shape of each row and each shape's mask hash, the carry in frame_link._FOLDED's order
# (frame_kernels.py's _CARRY), the outputs
_CARRY = "ow ow ob ob ow ol ol ol ol oq ol ob ob ob ow ol ow"
screen_rows = bind(_LIB, "screen_rows",
                   "i i i i i u w l w w w w w w y q w w w w w w w w w w w w l q w w w w w " + _CARRY + " oq ol", True)
