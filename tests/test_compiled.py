"""Compiled kernels (invariants/compiled.py): when they are used, and that the check says the
same with them as without.

The gate's own behaviour first (rows, the switch, numba missing, a kernel module that
fails to load, the cache folder). Then the whole catalog's fixtures, and big corrupted
runs, checked twice in this process: kernels forced on for every batch (MIN_ROWS 0) and
off (SPECAUDIT_COMPILED=0); the findings, their order and the counts must be identical.
numba is in the test install (the `fast` extra), so nothing here skips without it.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import sys

import numba  # noqa: F401  (the test install has it: its absence is a failure here, not a skip)
import pytest
import specaudit.invariants.compiled as compiled
from specaudit.invariants import all_rules
from specaudit.invariants.fixtures import FixtureRun

from specaudit.audit.check import check_tables

TRACE_RULES = [r for r in all_rules() if r.scope != "source"]


# ---------------------------------------------------------------------- the gate

def test_small_batches_and_the_switch_give_numpy(monkeypatch):
    monkeypatch.setattr(compiled, "_LOADED", {"m": "kernels"})
    monkeypatch.delenv(compiled.ENV, raising=False)
    assert compiled.kernels("m", rows=compiled.MIN_ROWS - 1) is None
    assert compiled.kernels("m", rows=compiled.MIN_ROWS) == "kernels"
    monkeypatch.setenv(compiled.ENV, "0")
    assert compiled.kernels("m", rows=10 ** 9) is None


def test_without_numba_numpy(monkeypatch):
    monkeypatch.setattr(compiled, "_LOADED", {"m": "kernels"})
    monkeypatch.delenv(compiled.ENV, raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "numba" else real(name, *a))
    assert not compiled.available()
    assert compiled.kernels("m", rows=10 ** 9) is None


def test_a_kernel_module_that_fails_to_load_is_numpy_once_and_logged(monkeypatch, tmp_path, caplog):
    (tmp_path / "broken_kernels_mod.py").write_text("raise RuntimeError('cannot cache: read-only folder')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(compiled, "_LOADED", {})
    monkeypatch.delenv(compiled.ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger=compiled.__name__):
        assert compiled.kernels("broken_kernels_mod", rows=10 ** 6) is None
        assert compiled.kernels("broken_kernels_mod", rows=10 ** 6) is None
    said = [r.getMessage() for r in caplog.records if "broken_kernels_mod" in r.getMessage()]
    assert len(said) == 1 and "read-only folder" in said[0] and "numpy" in said[0]
    sys.modules.pop("broken_kernels_mod", None)


def test_cache_folder_is_set_only_when_the_modules_own_is_not_writable(monkeypatch, tmp_path):
    (tmp_path / "k_mod.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    compiled._cache_dir("k_mod")                     # tmp_path is writable: numba caches beside it
    assert "NUMBA_CACHE_DIR" not in os.environ
    monkeypatch.setattr(compiled.os, "access", lambda p, mode: str(p) != str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    compiled._cache_dir("k_mod")
    got = os.environ.get("NUMBA_CACHE_DIR")
    assert got == str(tmp_path / "home" / ".cache" / "specaudit" / "numba")
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/somewhere/else")
    compiled._cache_dir("k_mod")                     # the user's own choice is kept
    assert os.environ["NUMBA_CACHE_DIR"] == "/somewhere/else"


# ------------------------------------------------- the same check with and without

def _check_both(monkeypatch, run: FixtureRun):
    """(findings, counts) with the kernels on for every batch, and with numpy only."""
    out = []
    for switch in ("1", "0"):
        monkeypatch.setenv(compiled.ENV, switch)
        monkeypatch.setattr(compiled, "MIN_ROWS", 0)
        st, rq = run.tables()
        res = check_tables(st, rq, run.manifest, max_per_code=50)
        out.append(([(f.code, f.message, f.run_id, f.request_id, f.step) for f in res.findings],
                    dict(res.counts), res.steps, res.requests))
    return out


@pytest.mark.parametrize("rule", TRACE_RULES, ids=lambda r: r.code)
def test_every_fixture_checks_the_same_compiled_and_not(rule, monkeypatch):
    for make in (rule.passing, rule.fail):
        run = FixtureRun.make(rule.fixture_algo)
        make(run)
        on, off = _check_both(monkeypatch, run)
        assert on == off, (rule.code, make.__name__)


# each a rule whose fail() breaks one row of a big run: several at once, so one batch
# holds many kinds of damage and the kernels meet them side by side
BIG_DAMAGE = {"chain": ("SA102", "SA201", "SA301", "SA303", "SA304", "SA305", "SA307", "SA401"),
              "tree": ("SA103", "SA201", "SA202", "SA302", "SA304", "SA305", "SA306", "SA403")}


@pytest.mark.parametrize("algo", sorted(BIG_DAMAGE))
def test_big_damaged_runs_check_the_same_compiled_and_not(algo, monkeypatch):
    by_code = {r.code: r for r in TRACE_RULES}
    clean = FixtureRun.make(algo, seed=11, n_requests=120, max_new_tokens=200)
    assert len(clean.steps) >= 2000
    on, off = _check_both(monkeypatch, clean)
    assert on == off and not on[0]
    run = FixtureRun.make(algo, seed=11, n_requests=120, max_new_tokens=200)
    for code in BIG_DAMAGE[algo]:
        by_code[code].fail(run)
    on, off = _check_both(monkeypatch, run)
    assert on == off
    assert set(BIG_DAMAGE[algo]) & set(on[1]), on[1]
