"""Compiled kernels (invariants/compiled.py): when they are used, how they are built, and
that the check says the same with them as without.

The gate's own behaviour first (rows, the switch, no C compiler, a kernel module that
fails to load), then building (once per source, again when it changes, a compile error
in the compiler's words, the private cache folder). Then the whole catalog's fixtures,
and big corrupted runs, checked twice in this process: kernels forced on for every batch
(MIN_ROWS 0) and off (SPECAUDIT_COMPILED=0); the findings, their order and the counts
must be identical. The test machine has a C compiler (scripts/test.sh installs g++), so
nothing here skips without one.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import stat
import sys

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


def test_without_a_c_compiler_numpy_said_once(monkeypatch, tmp_path, caplog):
    (tmp_path / "k_src.c").write_text("int one(void) { return 1; }\n")
    (tmp_path / "k_cc_mod.py").write_text(
        "from pathlib import Path\nfrom specaudit.invariants.compiled import library\n"
        "LIB = library(Path(__file__).with_name('k_src.c'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(compiled, "_LOADED", {})
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("SPECAUDIT_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(compiled.ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger=compiled.__name__):
        assert compiled.kernels("k_cc_mod", rows=10 ** 6) is None
        assert compiled.kernels("k_cc_mod", rows=10 ** 6) is None
    said = [r.getMessage() for r in caplog.records if "k_cc_mod" in r.getMessage()]
    assert len(said) == 1 and "no C compiler" in said[0] and "numpy" in said[0], said
    sys.modules.pop("k_cc_mod", None)


def test_a_kernel_module_that_fails_to_load_is_numpy_once_and_logged(monkeypatch, tmp_path, caplog):
    (tmp_path / "broken_kernels_mod.py").write_text("raise RuntimeError('cannot build: read-only folder')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(compiled, "_LOADED", {})
    monkeypatch.delenv(compiled.ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger=compiled.__name__):
        assert compiled.kernels("broken_kernels_mod", rows=10 ** 6) is None
        assert compiled.kernels("broken_kernels_mod", rows=10 ** 6) is None
    said = [r.getMessage() for r in caplog.records if "broken_kernels_mod" in r.getMessage()]
    assert len(said) == 1 and "read-only folder" in said[0] and "numpy" in said[0]
    sys.modules.pop("broken_kernels_mod", None)


def test_a_library_is_built_once_per_source_and_rebuilt_when_it_changes(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECAUDIT_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(compiled, "_LIBS", {})
    src = tmp_path / "k_once.c"
    src.write_text("#include <stdint.h>\nint64_t k(int64_t x) { return x + 1; }\n")
    lib = compiled.library(src)
    lib.k.restype, lib.k.argtypes = ctypes.c_int64, [ctypes.c_int64]
    assert lib.k(41) == 42
    built = sorted((tmp_path / "cache").glob("k_once-*.so"))
    assert len(built) == 1 and not list((tmp_path / "cache").glob(".k_once-*"))   # no temporary left
    assert compiled.library(src) is lib                      # once per process
    monkeypatch.setattr(compiled, "_LIBS", {})
    compiled.library(src)                                    # a new process: the cached file, no build
    assert sorted((tmp_path / "cache").glob("k_once-*.so")) == built
    src.write_text("#include <stdint.h>\nint64_t k(int64_t x) { return x + 2; }\n")
    monkeypatch.setattr(compiled, "_LIBS", {})
    lib2 = compiled.library(src)
    lib2.k.restype, lib2.k.argtypes = ctypes.c_int64, [ctypes.c_int64]
    assert lib2.k(41) == 43 and len(list((tmp_path / "cache").glob("k_once-*.so"))) == 2


def test_the_tuning_flags_are_dropped_when_refused_and_the_cpu_is_in_the_key(monkeypatch, tmp_path):
    """TUNE (-march=native ...): a compiler refusing them builds with CFLAGS alone; the
    CPU's flags are part of the cache key (a cache shared by other CPUs never loads it)."""
    monkeypatch.setenv("SPECAUDIT_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(compiled, "_LIBS", {})
    monkeypatch.setattr(compiled, "TUNE", ("-fno-such-flag-specaudit",))
    src = tmp_path / "k_tune.c"
    src.write_text("#include <stdint.h>\nint64_t k(int64_t x) { return x * 3; }\n")
    lib = compiled.library(src)
    lib.k.restype, lib.k.argtypes = ctypes.c_int64, [ctypes.c_int64]
    assert lib.k(14) == 42
    monkeypatch.setattr(compiled, "_LIBS", {})
    monkeypatch.setattr(compiled, "_cpu", lambda: "flags : another cpu")
    compiled.library(src)
    assert len(list((tmp_path / "cache").glob("k_tune-*.so"))) == 2


def test_a_source_that_does_not_compile_says_the_compilers_words(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECAUDIT_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(compiled, "_LIBS", {})
    src = tmp_path / "k_bad.c"
    src.write_text("int k(void) { return undeclared_name; }\n")
    with pytest.raises(OSError, match="undeclared_name"):
        compiled.library(src)
    assert not list((tmp_path / "cache").iterdir())          # nothing half-built left behind


def test_the_cache_folder_is_private_and_one_open_to_others_is_refused(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECAUDIT_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    got = compiled.cache_folder()
    assert got == tmp_path / "xdg" / "specaudit" / "kernels"
    assert stat.S_IMODE(got.stat().st_mode) & 0o077 == 0
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("SPECAUDIT_KERNEL_CACHE", str(shared))
    with pytest.raises(OSError, match="can be written by others"):
        compiled.cache_folder()


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


def test_the_cli_without_a_compiler_says_so_once_and_checks_with_numpy(tmp_path):
    """A big run, a machine with no C compiler: one line on stderr naming the cause, no
    traceback, and the same report as with the kernels."""
    import subprocess

    from specaudit.trace.synth import write_synthetic_dataset
    write_synthetic_dataset(tmp_path / "data", 6000, n_nodes=8, seed=2, rollups=False)
    env = dict(os.environ, SPECAUDIT_KERNEL_CACHE=str(tmp_path / "cache"), CC=str(tmp_path / "no-cc"))
    env.pop(compiled.ENV, None)
    cmd = [sys.executable, "-m", "specaudit", "check", str(tmp_path / "data"), "--output-format", "json"]
    bare = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert bare.returncode == 0, bare.stderr
    lines = [ln for ln in bare.stderr.splitlines() if ln.strip()]
    said = [ln for ln in lines if "no C compiler" in ln]
    assert len(said) >= 1 and "numpy" in said[0], bare.stderr
    assert "Traceback" not in bare.stderr
    assert len({ln for ln in said}) == len(said)            # each kernel module says it once
    env.pop("CC")
    built = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert built.returncode == 0 and "no C compiler" not in built.stderr, built.stderr
    assert list((tmp_path / "cache").glob("*.so"))          # the kernels were built and used
    drop = lambda out: {k: v for k, v in json.loads(out).items() if k not in ("seconds", "elapsed_s")}
    assert drop(bare.stdout) == drop(built.stdout)
