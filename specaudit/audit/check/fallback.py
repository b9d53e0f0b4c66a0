"""A fast path that gives up says so: one debug line per path and reason, never silence.

The checker has size-dependent fast paths (tiny runs pooled, pool files read with one
polars scan or with Arrow's reader directly); each falls back to a slower general path
on inputs it does not handle, with the same findings. A fallback on inputs it should
handle would only show as slowness, so every fallback goes through fell_back:

    log = logging.getLogger(__name__)
    fell_back(log, "pool read (polars scan)", "reading file by file with Arrow", exc)
    # -> DEBUG specaudit.audit.check.pool_read: pool read (polars scan) fell back to
    #    reading file by file with Arrow: ComputeError: ...

Once per (logger, path, reason kind) in a process (a dataset of 10,000 tiny runs says
it once, not 10,000 times). `specaudit check` shows these lines when SPECAUDIT_DEBUG is
set (debug_to_stderr); a library caller configures logging as it likes.
"""
from __future__ import annotations

import logging
import os
import sys

_SAID: set = set()   # (logger name, path, reason kind) already logged in this process
_HANDLER_NAME = "specaudit-check-debug"


def fell_back(log: logging.Logger, path: str, to: str, why) -> None:
    """Log, once, that fast path `path` fell back to `to` because of `why` (an exception,
    or a sentence for a fallback by shape)."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    if isinstance(why, BaseException):
        kind = type(why).__name__
        text = " ".join(str(why).split())[:200]
        reason = f"{kind}: {text}" if text else kind
    else:
        kind = reason = str(why)
    key = (log.name, path, kind)
    if key in _SAID:
        return
    _SAID.add(key)
    log.debug("%s fell back to %s: %s", path, to, reason)


def debug_to_stderr(environ=None) -> bool:
    """When SPECAUDIT_DEBUG is set: the checker's debug lines (its fallbacks) go to stderr.
    Returns whether it is set. Adds one handler at most, however often called."""
    environ = os.environ if environ is None else environ
    if not environ.get("SPECAUDIT_DEBUG"):
        return False
    log = logging.getLogger("specaudit.audit.check")
    if not any(h.get_name() == _HANDLER_NAME for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.set_name(_HANDLER_NAME)
        h.setFormatter(logging.Formatter("specaudit check: debug: %(name)s: %(message)s"))
        log.addHandler(h)
    log.setLevel(logging.DEBUG)
    return True
