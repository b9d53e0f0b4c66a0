"""Deprecated import path (kept as an alias): the tracer lives in `specaudit.trace.tracer`.

Engines instrumented against `specaudit.tracer` keep working; new code imports
`from specaudit.trace.tracer import Tracer`.
"""
from specaudit.trace.tracer import Tracer, node_mask_hashes, steps_to_arrow

__all__ = ["Tracer", "node_mask_hashes", "steps_to_arrow"]
