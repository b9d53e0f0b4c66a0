"""Skips that cannot hide a failure: on a developer's machine a missing tool or package skips
its test; with `CI` set (CI runs `bash scripts/test.sh`, which installs every one of them) the
same absence fails, so a broken install step can never pass as a skip.

    from ci import need, import_or_fail, module_needs
    module_needs(tool.exists(), f"AIPerf not installed at {tool}")  # module level
    transformers = import_or_fail("transformers")                  # module level
    @need(shutil.which("openssl") is not None, "openssl not installed")
    def test_tls(...): ...
"""
from __future__ import annotations

import functools
import importlib
import os

import pytest


def on_ci() -> bool:
    return bool(os.environ.get("CI"))


def need(ok: bool, reason: str):
    """A decorator: the test runs when `ok`; else it is skipped, or failed under CI."""
    if ok:
        return lambda fn: fn
    if not on_ci():
        return pytest.mark.skip(reason=f"{reason} (bash scripts/test.sh installs it; under CI this fails)")

    def deco(fn):
        @functools.wraps(fn)          # the same signature, so the same fixtures are set up
        def failing(*args, **kwargs):
            missing(reason)
        return failing
    return deco


def missing(reason: str) -> None:
    """Inside a test or fixture: skip, or fail under CI."""
    if on_ci():
        pytest.fail(f"{reason}, and CI is set: scripts/test.sh should have installed it", pytrace=False)
    pytest.skip(f"{reason} (bash scripts/test.sh installs it; under CI this fails)")


def module_needs(ok: bool, reason: str) -> None:
    """At module level: nothing when `ok`; else the whole module is skipped, or its collection
    fails under CI."""
    if ok:
        return
    if on_ci():
        pytest.fail(f"{reason}, and CI is set: scripts/test.sh should have installed it", pytrace=False)
    pytest.skip(f"{reason} (bash scripts/test.sh installs it; under CI this fails)", allow_module_level=True)


def import_or_fail(name: str):
    """pytest.importorskip, except that under CI a missing module fails the collection."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if on_ci():
            pytest.fail(f"cannot import {name} ({e}), and CI is set: scripts/test.sh should have installed it",
                        pytrace=False)
        pytest.skip(f"{name} is not installed (bash scripts/test.sh installs it)", allow_module_level=True)
