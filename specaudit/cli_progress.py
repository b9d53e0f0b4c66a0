"""The trace checker as the commands run it: its memory pool picked, its steps counted on a
terminal. `specaudit check` and `specaudit report` (which checks before it plots) share it.

    with checking() as progress:   # Arrow's pool picked (audit/check/arrow_pool.py)
        res = check_paths(paths, progress=progress)   # progress: the counter's update, or None
"""
from __future__ import annotations

import contextlib
import sys


def step_progress(stream=None):
    """On a terminal: a counter of the trace steps checked and their rate (tqdm, on stderr),
    shown once the check has run for a second and cleared when it ends; None anywhere else
    (a pipe, a file, CI logs: the report alone)."""
    stream = sys.stderr if stream is None else stream
    if not stream.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(unit=" steps", unit_scale=True, desc="checking", delay=1.0, leave=False, file=stream,
                mininterval=0.5, dynamic_ncols=True)


@contextlib.contextmanager
def checking():
    """While a command checks traces: jemalloc for Arrow's buffers where it is safe
    (decoded batches reuse pages: arrow_pool.py); yields the step counter's update
    (step_progress), or None off a terminal, and closes the counter however the check ends."""
    from specaudit.audit.check.arrow_pool import use_check_pool
    use_check_pool()
    bar = step_progress()
    try:
        yield bar.update if bar is not None else None
    finally:
        if bar is not None:
            bar.close()
