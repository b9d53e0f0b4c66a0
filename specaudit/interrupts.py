"""SIGTERM as an interrupt: the one way a long command gets to clean up before it exits.

    from specaudit.interrupts import terminate_as_interrupt
    old = terminate_as_interrupt()     # SIGTERM now raises Terminated in the main thread
    try: ...                           # cleanup (the final flush) runs in except / finally
    finally: signal.signal(signal.SIGTERM, old)

The CLI answers Terminated with one line and exit 143 (128 + SIGTERM), after the command
cleaned up; a plain KeyboardInterrupt (Ctrl-C) is exit 130.
"""
from __future__ import annotations


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C so cleanup (the final flush) runs."""


def terminate_as_interrupt():
    """From now on SIGTERM raises Terminated in the main thread (exit 143 after cleanup).
    Returns the handler it replaced (restore it with signal.signal), None off the main thread."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_term(signum, frame):
        raise Terminated()
    return signal.signal(signal.SIGTERM, on_term)
