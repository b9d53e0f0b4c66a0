"""Compiled kernels for big batches: C, built once per machine, loaded with ctypes;
optional, never the definition.

    kern = compiled.kernels("specaudit.invariants.frame_kernels", rows=R)   # a module, or None

The numpy code of each module is what a check means; a kernel module computes some of
the same arrays in one compiled pass (fewer passes over memory, no Python per numpy
call), and tests hold every kernel equal to the numpy it replaces (tests/test_compiled*.py
check the whole fixture corpus both ways). A kernel module is a Python file (X.py) that
wraps the functions of its C source beside it (X.c, built by `library`) with the numpy
signatures its caller uses. `kernels` gives None, and the caller uses its numpy, when:

  - the batch has fewer than MIN_ROWS rows: numpy is as fast there;
  - SPECAUDIT_COMPILED=0 is set (the numpy path only, e.g. to compare the two);
  - the library could not be built or loaded here (no C compiler, say): said once in a
    warning, then numpy for the rest of the process.

Why C and ctypes, not numba: numba's start in a process (its import and first call)
costs 0.3 to 0.6 s, as much as its kernels save on a million steps; a built library
loads in a millisecond, and ctypes lets go of the GIL while a kernel runs, so the read
thread decodes meanwhile.

Built with `$CC -O2 -shared -fPIC` (CC defaults to cc) into the user's cache folder
(SPECAUDIT_KERNEL_CACHE, else $XDG_CACHE_HOME or ~/.cache, then specaudit/kernels; when
that cannot be written, a private folder under the temporary directory), named after a
hash of the source, the compiler command, the flags and the machine's architecture: a changed source is built
anew, a build is written under a temporary name and renamed (concurrent builds are
safe), and a cached library is only loaded from a folder that is the user's own and
closed to others.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib
import logging
import os
import platform
import shlex
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

ENV = "SPECAUDIT_COMPILED"
MIN_ROWS = 4096      # rows of a batch from which the compiled kernels are used
CFLAGS = ("-O3", "-shared", "-fPIC", "-std=c99")
# this CPU's vector instructions (a build is this machine's: its CPU is in the cache key);
# without them x86-64's baseline has no 64-bit vector compare, and a one-pass row test
# runs 2-4x slower than numpy's (which picks AVX2/AVX-512 at run time). No float
# contraction (no kernel uses floats; kept exact if one does). Dropped, and the
# kernel built with CFLAGS alone, when the compiler refuses them.
TUNE = ("-march=native", "-ffp-contract=off")
BUILD_TIMEOUT_S = 120
_LOADED: dict[str, object] = {}
_LIBS: dict[str, ctypes.CDLL] = {}
HEADERS = Path(__file__).resolve().parent   # kernels_*.h: C shared by the kernel sources


def available() -> bool:
    """Kernels not switched off (SPECAUDIT_COMPILED=0)."""
    return os.environ.get(ENV, "1") != "0"


def kernels(module: str, rows: int):
    """The kernel module `module` for a batch of `rows` rows, or None (use numpy)."""
    if rows < MIN_ROWS or not available():
        return None
    if module not in _LOADED:
        _LOADED[module] = _load(module)
    return _LOADED[module]


def _load(module: str):
    try:
        return importlib.import_module(module)
    except Exception as e:   # a build or load error of any kind means numpy, said once
        log.warning("specaudit: compiled kernels %s unavailable (%s: %s); checking with numpy: same findings, "
                    "slower (SPECAUDIT_COMPILED=0 skips the kernels)", module.rsplit(".", 1)[-1],
                    type(e).__name__, " ".join(str(e).split())[:300])
        return None


# ------------------------------------------------------------------ calling

# argument codes of `bind`: a scalar, or an array of a dtype (read: converted to it,
# contiguous, a copy only when it is not already; "o" before the code: written in place,
# so it must already be that dtype and contiguous)
_SCALARS = {"i": ctypes.c_int64, "u": ctypes.c_uint64}
_ARRAYS = {"l": np.int64, "w": np.int32, "b": np.bool_, "q": np.uint64, "y": np.uint8}


def bind(lib: ctypes.CDLL, name: str, spec: str, returns: bool = False):
    """A Python callable for C function `name` whose arguments are `spec` (codes
    separated by spaces: i int64, u uint64 scalar; l int64, w int32, b bool, q uint64,
    y uint8 (bytes) array; o<code> an array written in place). Returns the C int64 when `returns`."""
    codes = spec.split()
    fn = getattr(lib, name)
    fn.argtypes = [_SCALARS.get(c, ctypes.c_void_p) for c in codes]
    fn.restype = ctypes.c_int64 if returns else None
    plan = [(c in _SCALARS, c.startswith("o"), _ARRAYS.get(c.lstrip("o"))) for c in codes]

    def call(*args):
        if len(args) != len(plan):
            raise TypeError(f"{name} takes {len(plan)} arguments, got {len(args)}")
        conv, keep = [], []
        for (scalar, out, dt), a in zip(plan, args):
            if scalar:
                conv.append(int(a))
                continue
            if out:
                if a.dtype != dt or not a.flags.c_contiguous:
                    raise TypeError(f"{name}: an output array must be contiguous {np.dtype(dt)}, not {a.dtype}")
            else:
                a = np.ascontiguousarray(a, dtype=dt)
            keep.append(a)   # alive until the call returns
            conv.append(a.ctypes.data)
        return fn(*conv)

    call.__name__ = name
    return call


# ------------------------------------------------------------------ building

def library(source: str | Path) -> ctypes.CDLL:
    """The C file `source` built into a shared library (once per machine) and loaded.
    Raises OSError / subprocess errors when it cannot be built or loaded."""
    source = Path(source)
    key = str(source)
    if key in _LIBS:
        return _LIBS[key]
    cc = shlex.split(os.environ.get("CC") or "cc")
    if not cc or shutil.which(cc[0]) is None:
        raise OSError(f"no C compiler ({' '.join(cc) or 'CC is empty'}) to build {source.name}")
    # the shared headers (token_mix ...) live beside this file: in the hash, on the include path
    headers = sorted(HEADERS.glob("*.h"))
    parts = [source.read_bytes(), *(h.read_bytes() for h in headers),
             " ".join([*cc, *CFLAGS, *TUNE, platform.machine()]).encode(), _cpu().encode()]
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    folder = cache_folder()
    target = folder / f"{source.stem}-{digest}.so"
    if not target.exists():
        fd, tmp = tempfile.mkstemp(prefix=f".{source.stem}-", suffix=".so", dir=folder)
        os.close(fd)
        try:
            build = lambda flags: subprocess.run([*cc, *flags, f"-I{HEADERS}", "-o", tmp, str(source)],
                                                 capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            out = build((*CFLAGS, *TUNE))
            if out.returncode != 0:   # a compiler without -march=native: the portable build
                out = build(CFLAGS)
            if out.returncode != 0:
                raise OSError(f"{' '.join(cc)} failed on {source.name}: {out.stderr.strip()[-500:]}")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(target))
    _LIBS[key] = lib
    return lib


def _cpu() -> str:
    """What -march=native builds for: the CPU's feature flags (Linux), else its name."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return line.strip()
    except OSError:
        pass
    return platform.processor()


def cache_folder() -> Path:
    """Where built libraries are kept: the user's own folder, closed to others."""
    env = os.environ.get("SPECAUDIT_KERNEL_CACHE")
    if env:
        choices = [Path(env)]
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        choices = [base / "specaudit" / "kernels",
                   Path(tempfile.gettempdir()) / f"specaudit-kernels-{os.getuid()}"]
    why = []
    for d in choices:
        try:
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            st = d.stat()
            if st.st_uid != os.getuid():
                why.append(f"{d} belongs to another user")
                continue
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                why.append(f"{d} can be written by others")
                continue
            if os.access(d, os.W_OK):
                return d
            why.append(f"{d} is not writable")
        except OSError as e:
            why.append(f"{d}: {e.strerror or e}")
    raise OSError("no folder for built kernels: " + "; ".join(why))
