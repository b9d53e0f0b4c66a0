"""The base install (`pip install specaudit`, no extras) in a fresh venv: its size on disk
and how fast `specaudit check --help` starts. Prints one JSON line.

    python3 scripts/base_install.py                  # a venv under the cache, rebuilt from the wheel
    python3 scripts/base_install.py --venv /tmp/v    # measure (and create if absent) this venv
    python3 scripts/base_install.py --runs 20        # start-up: the median of 20 runs

What it does (tests/test_base_install.py uses the same functions):
  - wheelhouse(): the base dependencies of pyproject.toml (`[project] dependencies`)
    downloaded once as wheels into $SPECAUDIT_CACHE/wheels/<key> (key: the requirement
    list, Python version and platform), through pip and its cache; later runs install
    offline from it (--no-index), so the test does not depend on the registry after
    the first time;
  - build_wheel(): specaudit's own wheel from this checkout (--no-deps);
  - make_venv(): `python -m venv`, then the wheel and its dependencies from the wheelhouse;
  - measure(): the venv's site-packages in MB (what the install added: pip and
    setuptools, which every venv has, are left out and reported apart), the largest
    packages, and the median wall time of `specaudit check --help` (the console script,
    as CI runs it), beside the machine's load (scripts/benchutil.py).
Targets (issue 34): base install under 150 MB, `check --help` under 0.3 s.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from benchutil import load_fields  # noqa: E402  (the scripts folder on the path first)

VENV_OWN = ("pip", "setuptools", "_distutils_hack", "pkg_resources", "distutils-precedence.pth")
# what the base install must never bring (an extra's packages)
HEAVY = ("torch", "polars", "matplotlib", "scipy", "fastapi", "uvicorn", "pydantic", "safetensors",
         "opentelemetry", "transformers", "pyspark", "triton")


def cache_dir() -> Path:
    return Path(os.environ.get("SPECAUDIT_CACHE", Path.home() / ".cache" / "specaudit"))


def base_requirements() -> list[str]:
    try:
        import tomllib
    except ModuleNotFoundError:
        import tomli as tomllib
    with open(REPO / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def _pip(python, *args, env=None, timeout=900):
    r = subprocess.run([str(python), "-m", "pip", *args, "-q", "--disable-pip-version-check"],
                       capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args[:2])} failed: {r.stderr.strip()[-2000:]}")
    return r


def wheelhouse() -> Path:
    """The base dependencies as wheels (plus setuptools, to build specaudit offline), downloaded once."""
    reqs = base_requirements() + ["setuptools>=68"]
    key = hashlib.sha256(json.dumps([reqs, sys.version_info[:2], platform.machine(), sys.platform])
                         .encode()).hexdigest()[:16]
    d = cache_dir() / "wheels" / f"base-{key}"
    done = d / ".complete"
    if not done.is_file():
        d.mkdir(parents=True, exist_ok=True)
        _pip(sys.executable, "download", "--only-binary", ":all:", "-d", str(d), *reqs)
        done.write_text("\n".join(reqs) + "\n")
    return d


SOURCES = ("specaudit", "invariants", "kernels", "dashboards", "pyproject.toml", "README.md")


def build_wheel(out: Path) -> Path:
    """specaudit's wheel, built from a copy of the sources: setuptools writes build/ and
    *.egg-info beside them, and a stale build/lib would ship modules deleted since."""
    import tempfile
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("specaudit-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "specaudit-src"
        src.mkdir()
        for name in SOURCES:
            if (REPO / name).is_dir():
                shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy(REPO / name, src / name)
        _pip(sys.executable, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(src))
    (whl,) = out.glob("specaudit-*.whl")
    return whl


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / "python"


def make_venv(venv: Path, wheel: Path, house: Path) -> Path:
    """A fresh venv holding the base install: specaudit's wheel, its dependencies from the wheelhouse."""
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # the machine's pip settings stay out, and this interpreter's PYTHONPATH too: a source checkout
    # on it (its specaudit.egg-info) reads to the venv's pip as specaudit already installed
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    env["PIP_CONFIG_FILE"] = os.devnull        # the machine's pip.conf (extra indexes, constraints) stays out
    _pip(venv_python(venv), "install", "--no-index", "--find-links", str(house), str(wheel), env=env)
    return venv


def site_packages(venv: Path) -> Path:
    out = subprocess.run([str(venv_python(venv)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def _size(p: Path) -> int:
    if p.is_symlink() or p.is_file():
        return p.lstat().st_size
    return sum(f.lstat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())


def measure(venv: Path, runs: int = 10) -> dict:
    sp = site_packages(venv)
    sizes = {}
    for entry in sp.iterdir():
        if entry.name.endswith((".dist-info", ".pth")) or entry.name == "__pycache__":
            continue
        name = entry.name.split(".")[0]
        sizes[name] = sizes.get(name, 0) + _size(entry)
    own = sum(sizes.pop(n, 0) for n in VENV_OWN)
    dist = sum(_size(e) for e in sp.iterdir() if e.name.endswith(".dist-info"))
    total = sum(sizes.values()) + dist
    exe = venv / "bin" / "specaudit"
    times = []
    subprocess.run([str(exe), "check", "--help"], capture_output=True, check=True)   # warm the page cache
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([str(exe), "check", "--help"], capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    mb = 1024 * 1024
    top = sorted(sizes.items(), key=lambda kv: -kv[1])[:8]
    return {
        "script": "scripts/base_install.py",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.node()} {platform.machine()} {platform.system()} python {platform.python_version()}",
        "base_install_mb": round(total / mb, 1),
        "target_install_mb": 150,
        "largest_mb": {k: round(v / mb, 1) for k, v in top},
        "venv_own_mb": round(own / mb, 1),   # pip and setuptools: in every venv, not counted
        "heavy_present": sorted(n for n in sizes if n in HEAVY),
        "check_help_s_median": round(statistics.median(times), 3),
        "check_help_s_min": round(min(times), 3),
        "target_check_help_s": 0.3,
        "runs": runs,
        **load_fields(),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, help="measure this venv (created with the base install when absent)")
    ap.add_argument("--runs", type=int, default=10, help="start-up runs (median reported)")
    a = ap.parse_args(argv)
    venv = a.venv or cache_dir() / "base-install-venv"
    if a.venv is None or not venv_python(venv).exists():
        make_venv(venv, build_wheel(cache_dir() / "base-install-wheel"), wheelhouse())
    print(json.dumps(measure(venv, a.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
