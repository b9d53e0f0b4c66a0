"""Compiled kernels for big batches (numba, the `fast` extra): optional, never the definition.

    kern = compiled.kernels("specaudit.invariants.frame_kernels", rows=R)   # a module, or None

The numpy code of each module is what a check means; a kernel module computes some of
the same arrays in one compiled pass (fewer passes over memory, no Python per numpy
call), and tests hold every kernel equal to the numpy it replaces (tests/test_compiled.py
checks the whole fixture corpus both ways). `kernels` gives None, and the caller uses
its numpy, when:

  - the batch has fewer than MIN_ROWS rows: numpy is as fast there, and a tiny run
    never pays numba's import (~0.2 s) or a first compile;
  - numba is not installed (`pip install 'specaudit[fast]'` brings it);
  - SPECAUDIT_COMPILED=0 is set (the numpy path only, e.g. to compare the two);
  - the kernel module failed to import or compile here (say a read-only cache folder):
    logged once, then numpy for the rest of the process.

numba's own start-up is paid once per process: its import (~0.1 s) and its CPU target
(~0.1 s), set up here without numba's BLAS probe, which imports scipy.linalg (~0.2 s
more) only to learn whether np.correlate and np.convolve's inner products may call a
BLAS; no kernel here uses them (see `_start_numba`).

Kernels are compiled on first use and cached on disk (numba's cache=True): beside the
module when its folder is writable, else in NUMBA_CACHE_DIR, which this sets when
unset to the user's cache folder (~/.cache/specaudit/numba) or, failing that, a
per-user folder under the temporary directory.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "SPECAUDIT_COMPILED"
MIN_ROWS = 4096      # rows of a batch from which the compiled kernels are used
_LOADED: dict[str, object] = {}


def available() -> bool:
    """numba importable and not switched off (SPECAUDIT_COMPILED=0)."""
    return os.environ.get(ENV, "1") != "0" and importlib.util.find_spec("numba") is not None


def kernels(module: str, rows: int):
    """The kernel module `module` for a batch of `rows` rows, or None (use numpy)."""
    if rows < MIN_ROWS or not available():
        return None
    if module not in _LOADED:
        _LOADED[module] = _load(module)
    return _LOADED[module]


def _load(module: str):
    _cache_dir(module)
    try:
        _start_numba()
    except Exception as e:   # (another numba's internals): numba starts as it would anyway
        log.debug("numba's target set up as usual (%s: %s)", type(e).__name__, e)
    try:
        return importlib.import_module(module)
    except Exception as e:   # numba's own errors vary by version: any failure means numpy
        log.warning("compiled kernels %s unavailable (%s: %s); checking with numpy", module,
                    type(e).__name__, e)
        return None


_BLAS_PROBE = "scipy.linalg.cython_blas"   # what numba imports to probe for a BLAS


def _start_numba() -> None:
    """Set numba's CPU target up (typing and target registries) with its BLAS probe
    seeing no scipy, unless scipy.linalg is loaded already (the probe is free then).

    The probe (numba.np.arraymath's _HAVE_BLAS) only picks np.correlate/np.convolve's
    inner product: a plain loop instead of BLAS in this process. np.dot and
    np.linalg import scipy themselves when a function using them compiles (after this
    returns), so they are unaffected. The probe's name is hidden only while the
    registries load."""
    if _BLAS_PROBE in sys.modules:
        return
    from numba.core.registry import cpu_target
    sys.modules[_BLAS_PROBE] = None   # `import` of it raises ImportError, scipy is not imported
    try:
        cpu_target.typing_context.refresh()
        cpu_target.target_context.refresh()
    finally:
        if _BLAS_PROBE in sys.modules and sys.modules[_BLAS_PROBE] is None:
            del sys.modules[_BLAS_PROBE]


def _cache_dir(module: str) -> None:
    """Point numba's cache at a writable folder when the module's own is not."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    spec = importlib.util.find_spec(module)
    here = Path(spec.origin).parent if spec is not None and spec.origin else None
    if here is not None and os.access(here, os.W_OK):
        return
    for d in (Path.home() / ".cache" / "specaudit" / "numba",
              Path(tempfile.gettempdir()) / f"specaudit-numba-{os.getuid()}"):
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(d, os.W_OK):
            os.environ["NUMBA_CACHE_DIR"] = str(d)
            return
