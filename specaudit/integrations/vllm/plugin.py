"""The `vllm.general_plugins` entry point (pyproject.toml): `register()`.

vLLM calls register() in each of its processes at start-up. It does nothing unless
SPECAUDIT_VLLM_TRACE is set:

    SPECAUDIT_VLLM_TRACE=DIR         trace every verify step into the dataset folder DIR
    SPECAUDIT_VLLM_RUN_ID=ID         the run's id (default vllm-<UTC time>-<pid>)
    SPECAUDIT_VLLM_FLUSH_S=SECONDS   how often rows reach disk (default 1)

With tracing asked for, a vLLM version the hooks do not know is refused: register()
raises one line naming the supported versions (versions.py), so the server does not start
with a trace that could be wrong. Anything that fails after that is the plugin's problem
only (sink.Recorder.fail): vLLM keeps serving and the run is marked incomplete.
"""
from __future__ import annotations

import logging
import os

from specaudit.integrations.vllm.versions import refusal

log = logging.getLogger("specaudit.vllm")
ENV = "SPECAUDIT_VLLM_TRACE"
_recorder = None


def register() -> None:
    global _recorder
    out = os.environ.get(ENV, "").strip()
    if not out or _recorder is not None:
        return
    import vllm
    why = refusal(getattr(vllm, "__version__", ""))
    if why:
        raise RuntimeError(why)
    from specaudit.integrations.vllm import hooks
    from specaudit.integrations.vllm.sink import Recorder
    try:
        flush_s = float(os.environ.get("SPECAUDIT_VLLM_FLUSH_S", "1") or 1)
    except ValueError:
        raise RuntimeError("specaudit vLLM plugin: SPECAUDIT_VLLM_FLUSH_S must be a number of seconds") from None
    rec = Recorder(out, os.environ.get("SPECAUDIT_VLLM_RUN_ID") or None, flush_s=flush_s,
                   vllm_version=vllm.__version__)
    try:
        hooks.install(rec)
    except Exception as e:       # vLLM's internals moved: serve untraced, say so
        rec.fail("install", e)
        return
    _recorder = rec
