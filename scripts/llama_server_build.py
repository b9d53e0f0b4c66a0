#!/usr/bin/env python3
"""Build llama.cpp's `llama-server` from the pinned llama-cpp-python sdist, cached by version.

    python3 scripts/llama_server_build.py                 # pristine binary: prints one JSON line
    python3 scripts/llama_server_build.py --patch FILE    # a patched binary (a unified diff, -p1,
                                                          # paths relative to the llama.cpp tree)

The sdist (`pip download --no-binary :all: llama-cpp-python==VERSION`) carries the whole
llama.cpp tree under vendor/llama.cpp. Layout under $SPECAUDIT_CACHE/llama.cpp (default
~/.cache/specaudit/llama.cpp):

    src/llama_cpp_python-V.tar.gz, src/llama_cpp_python-V/   the sdist and its tree
    build-V/  (or build/, adopted when its CMakeCache points at this tree)   one Ninja build dir
    llama-cpp-python-V/llama-server, build.json               the pristine binary + how it was built
    llama-cpp-python-V/patched/<sha256[:12] of the diff>/llama-server

A second run finds the binary and costs nothing. A patched build applies the diff to the
tree under a file lock, rebuilds incrementally (seconds: only the touched files), copies the
binary out and restores the touched files from the tarball (their mtime set to now, so the
next build recompiles them); the pristine binary is a separate copy and never clobbered.
Files a crashed patched build left modified are listed in a journal and restored first.

A missing tool: one line naming the step and what to install, exit 2. A failed build:
the log's last lines on stderr and one line naming the step, exit 3.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

VERSION = "0.3.36"          # llama-cpp-python release whose vendor/llama.cpp is the pinned engine
PKG = "llama_cpp_python"
CMAKE_FLAGS = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF"]


class StepError(Exception):
    """One line for the user; `code` is the exit status (2: something to install, 3: a failure)."""

    def __init__(self, msg: str, code: int = 3):
        super().__init__(msg)
        self.code = code


def cache_root() -> Path:
    base = os.environ.get("SPECAUDIT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "specaudit")
    return Path(base) / "llama.cpp"


class Layout:
    def __init__(self, root: Path | None = None, version: str = VERSION):
        self.root = root or cache_root()
        self.version = version
        self.tarball = self.root / "src" / f"{PKG}-{version}.tar.gz"
        self.sdist = self.root / "src" / f"{PKG}-{version}"
        self.tree = self.sdist / "vendor" / "llama.cpp"
        self.out = self.root / f"llama-cpp-python-{version}"
        self.binary = self.out / "llama-server"
        self.journal = self.out / "dirty.json"   # files a patched build has modified
        self.lock = self.root / ".lock"

    @property
    def build(self) -> Path:
        own = self.root / f"build-{self.version}"
        if (own / "CMakeCache.txt").exists():
            return own
        adopt = self.root / "build"   # a build dir configured by hand on this tree (cannot be moved)
        cache = adopt / "CMakeCache.txt"
        if cache.exists():
            m = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache.read_text(errors="replace"), re.M)
            if m and Path(m.group(1).strip()).resolve() == self.tree.resolve():
                return adopt
        return own

    def patched(self, sha: str) -> Path:
        return self.out / "patched" / sha / "llama-server"


def _run(step: str, cmd: list, log: Path, cwd: Path | None = None) -> float:
    """Run one build step with its output appended to `log`; its wall time in seconds."""
    t0 = time.monotonic()
    with open(log, "ab") as f:
        f.write(("\n$ " + " ".join(map(str, cmd)) + "\n").encode())
        f.flush()
        r = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-25:]
        sys.stderr.write("\n".join(tail) + "\n")
        raise StepError(f"llama.cpp build: step '{step}' failed (exit {r.returncode}); full log: {log}")
    return time.monotonic() - t0


def need_tools() -> None:
    """The build's tools, each named with its step and the package that provides it."""
    missing = []
    if not shutil.which("cmake"):
        missing.append("configure needs cmake")
    if not shutil.which("ninja"):
        missing.append("configure needs ninja (package ninja-build)")
    if not (shutil.which("c++") or shutil.which("g++")) or not (shutil.which("cc") or shutil.which("gcc")):
        missing.append("compile needs a C/C++ compiler (package g++)")
    if missing:
        raise StepError("llama.cpp build: " + "; ".join(missing)
                        + ": apt-get install cmake ninja-build g++ (scripts/test.sh does it)", code=2)


def fetch_sdist(L: Layout, log: Path) -> None:
    if not L.tarball.exists():
        L.tarball.parent.mkdir(parents=True, exist_ok=True)
        _run("download the sdist", [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                                    ":all:", f"llama-cpp-python=={L.version}", "-d", str(L.tarball.parent)], log)
        if not L.tarball.exists():
            raise StepError(f"llama.cpp build: step 'download the sdist' left no {L.tarball.name}")
    if not (L.tree / "CMakeLists.txt").exists():
        tmp = L.sdist.with_name(L.sdist.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with tarfile.open(L.tarball) as t:
            t.extractall(tmp, filter="data")
        shutil.rmtree(L.sdist, ignore_errors=True)
        (tmp / L.sdist.name).rename(L.sdist)
        tmp.rmdir()


def restore(L: Layout, rel_paths) -> None:
    """Put tree files back as the tarball has them, mtime now (so Ninja recompiles them)."""
    rel_paths = sorted(set(rel_paths))
    if not rel_paths:
        return
    prefix = f"{PKG}-{L.version}/vendor/llama.cpp/"
    with tarfile.open(L.tarball) as t:
        for rel in rel_paths:
            dst = L.tree / rel
            try:
                member = t.getmember(prefix + rel)
            except KeyError:      # a file the patch created
                dst.unlink(missing_ok=True)
                continue
            data = t.extractfile(member).read()
            dst.write_bytes(data)
            os.utime(dst, None)


def restore_journal(L: Layout) -> None:
    if L.journal.exists():
        restore(L, json.loads(L.journal.read_text()))
        L.journal.unlink()


def configure_and_build(L: Layout, log: Path) -> dict:
    need_tools()
    build = L.build
    from_scratch = not (build / "build.ninja").exists()
    t_cfg = 0.0
    if not (build / "CMakeCache.txt").exists():
        t_cfg = _run("configure (cmake)", ["cmake", "-S", str(L.tree), "-B", str(build), *CMAKE_FLAGS], log)
    jobs = os.environ.get("SPECAUDIT_BUILD_JOBS") or str(os.cpu_count() or 2)
    t_build = _run("compile llama-server", ["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs],
                   log)
    exe = build / "bin" / "llama-server"
    if not exe.exists():
        raise StepError(f"llama.cpp build: step 'compile llama-server' left no {exe}")
    return {"exe": exe, "configure_s": round(t_cfg, 1), "build_s": round(t_build, 1), "from_scratch": from_scratch,
            "jobs": int(jobs), "build_dir": str(build)}


def _install(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copy2(src, tmp)
    tmp.replace(dst)


def _machine() -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repository root
    from specaudit.machine_load import load_fields  # the busy rule's load keys (stdlib only)
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.machine(),
            **load_fields()}


class Locked:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.path, "a")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def ensure_server(L: Layout | None = None) -> dict:
    """The pristine binary, built once per version; returns build.json's content + `binary`."""
    L = L or Layout()
    info = L.out / "build.json"
    if L.binary.exists() and info.exists():
        return {**json.loads(info.read_text()), "binary": str(L.binary), "cached": True}
    with Locked(L.lock):
        if L.binary.exists() and info.exists():
            return {**json.loads(info.read_text()), "binary": str(L.binary), "cached": True}
        L.out.mkdir(parents=True, exist_ok=True)
        log = L.out / "build.log"
        fetch_sdist(L, log)
        restore_journal(L)
        t0 = time.monotonic()
        b = configure_and_build(L, log)
        _install(b.pop("exe"), L.binary)
        meta = {"version": f"llama-cpp-python {L.version}", "total_s": round(time.monotonic() - t0, 1), **b,
                **_machine()}
        info.write_text(json.dumps(meta, indent=1) + "\n")
        return {**meta, "binary": str(L.binary), "cached": False}


def touched_files(diff: str) -> list:
    out = []
    for ln in diff.splitlines():
        if ln.startswith("+++ ") or ln.startswith("--- "):
            p = ln[4:].split("\t")[0].strip()
            if p != "/dev/null":
                out.append(p.split("/", 1)[1] if "/" in p else p)
    return sorted(set(out))


def ensure_patched(patch: Path, L: Layout | None = None) -> dict:
    """A binary built from the tree with `patch` applied, cached by the diff's hash."""
    L = L or Layout()
    diff = patch.read_text()
    sha = hashlib.sha256(diff.encode()).hexdigest()[:12]
    dst = L.patched(sha)
    if dst.exists():
        return {"binary": str(dst), "patch": patch.name, "sha": sha, "cached": True}
    ensure_server(L)
    with Locked(L.lock):
        if dst.exists():
            return {"binary": str(dst), "patch": patch.name, "sha": sha, "cached": True}
        log = L.out / f"patch-{sha}.log"
        restore_journal(L)
        files = touched_files(diff)
        if not files:
            raise StepError(f"llama.cpp build: step 'apply {patch.name}': no file in the diff", code=2)
        L.journal.write_text(json.dumps(files))
        try:
            _run(f"apply {patch.name}", ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch",
                                         "-d", str(L.tree), "-i", str(patch.resolve())], log)
            t0 = time.monotonic()
            b = configure_and_build(L, log)
            _install(b.pop("exe"), dst)
        finally:
            restore_journal(L)
        return {"binary": str(dst), "patch": patch.name, "sha": sha, "cached": False,
                "build_s": round(time.monotonic() - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Build llama.cpp's llama-server from the pinned llama-cpp-python "
                                 f"sdist ({VERSION}), cached under $SPECAUDIT_CACHE/llama.cpp; prints one JSON line "
                                 "(binary path, build time, machine)")
    ap.add_argument("--patch", metavar="DIFF", type=Path, help="build a copy with this unified diff applied (-p1)")
    a = ap.parse_args(argv)
    try:
        if a.patch is not None and not a.patch.is_file():
            raise StepError(f"llama.cpp build: --patch {a.patch}: no such file", code=2)
        res = ensure_patched(a.patch) if a.patch else ensure_server()
    except StepError as e:
        print(str(e), file=sys.stderr)
        return e.code
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
