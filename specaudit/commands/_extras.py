"""Which optional dependency group (pip extra) a command or a missing module belongs to.

The base install (`pip install specaudit`) is what reading needs: check, rules, query,
estimate, ab from evidence, diff, dashboards (numpy, pyarrow, duckdb, prometheus-client,
tqdm). Everything else comes with an extra (pyproject.toml's optional-dependencies);
a command whose extra is missing says so in one line and exits 2, never with an
ImportError traceback. Keep this table in step with pyproject.toml (tests/test_extras.py
compares them).
"""
from __future__ import annotations

import importlib.util

# top-level module -> the extra that installs it
MODULE_EXTRA = {
    "torch": "runtime", "safetensors": "runtime", "scipy": "runtime",
    "fastapi": "serve", "uvicorn": "serve", "starlette": "serve", "pydantic": "serve", "opentelemetry": "serve",
    "matplotlib": "report",
    "polars": "fast",
    "pyspark": "spark",
    "transformers": "hf",
    "triton": "triton",
}
# extra -> the top-level modules a command of that extra imports (checked before it runs;
# spark, hf and triton are reached inside commands and named by MODULE_EXTRA when missing)
EXTRA_MODULES = {
    "runtime": ("torch", "safetensors", "scipy"),
    "serve": ("torch", "safetensors", "fastapi", "uvicorn", "pydantic", "opentelemetry"),
    "report": ("matplotlib",),
    "demo": ("torch", "safetensors", "scipy", "matplotlib"),   # run, check, estimate and report in one
}


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def install_hint(extra: str, module: str) -> str:
    return f"{module} is not installed: pip install 'specaudit[{extra}]' (the {extra} extra)"


def missing_for(extra: str | None) -> str | None:
    """The one-line reason a command of this extra cannot run here, or None."""
    for m in EXTRA_MODULES.get(extra or "", ()):
        if not _present(m):
            return install_hint(extra, m)
    return None


def missing_module(e: BaseException) -> str | None:
    """The one-line reason for a ModuleNotFoundError of an optional dependency (a code path
    the command-level check does not cover, e.g. check --engine spark), or None when the
    module is not one an extra brings (then it is a bug, reported as such)."""
    if not isinstance(e, ModuleNotFoundError) or not e.name:
        return None
    top = e.name.split(".", 1)[0]
    extra = MODULE_EXTRA.get(top)
    if extra is None or _present(top):
        return None
    return install_hint(extra, top)
