"""The checker's fast paths are taken on the shapes they are for, and cannot hide.

A run takes one of three size-dependent paths: pooled with other tiny runs of its
configuration (pool.POOL_RUN_BYTES), read inline on the caller's thread (a small run,
below stream.SMALL_RUN_BYTES), or read ahead on a thread (a big run). The findings are
the same on every path (tests/test_check_pool.py, tests/test_check_fastpaths.py); here:
each path is the one taken for its shape, a fast path that falls back says so in one
debug line (specaudit.audit.check.fallback; `specaudit check` with SPECAUDIT_DEBUG=1), and
an error the fallback is not meant for (a bug) propagates instead of silently taking
the slow path.
"""
from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_check_pool import _in_fork, _members, _report, _tiny

from specaudit.audit import check as C
from specaudit.audit.check import fallback, pool, pool_read, stream
from specaudit.trace.synth import synth_run_rows, write_run

LOGGER = "specaudit.audit.check"


@pytest.fixture(autouse=True)
def fresh_fallbacks(monkeypatch):
    """Each test starts with no fallback said yet (they are said once per process)."""
    monkeypatch.setattr(fallback, "_SAID", set())


def _spy(monkeypatch, module, name: str, calls: list) -> None:
    real = getattr(module, name)

    def spy(*a, **k):
        calls.append(name)
        return real(*a, **k)
    monkeypatch.setattr(module, name, spy)


def _paths(monkeypatch) -> list:
    """Which path each run took: the pool, check_run alone, the read-ahead thread."""
    calls: list = []
    _spy(monkeypatch, pool, "_pool_clean", calls)
    _spy(monkeypatch, pool, "check_run", calls)
    _spy(monkeypatch, stream, "_ReadAhead", calls)
    return calls


def _fell_back(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith(LOGGER) and "fell back" in r.getMessage()]


@pytest.fixture
def tiny_dataset(tmp_path):
    """Eight clean tiny runs of one configuration."""
    for i in range(8):
        _tiny(tmp_path / "ds", i)
    return tmp_path / "ds"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """One run above the pool's size and below the read-ahead's: read inline."""
    d = tmp_path_factory.mktemp("small")
    s, r, m = synth_run_rows(240, run_id="small", seed=5)
    write_run(d, s, r, m)
    size = sum(p.stat().st_size for p in d.rglob("*.parquet"))
    assert pool.POOL_RUN_BYTES < size < stream.SMALL_RUN_BYTES, size
    return d, size


def test_many_tiny_runs_take_the_pool(tiny_dataset, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    calls = _paths(monkeypatch)
    res = C.check_paths([tiny_dataset], workers=1)
    assert res.exit_code == 0 and len(res.runs) == 8
    assert calls == ["_pool_clean"]                       # one pool; no run alone, no thread
    assert _fell_back(caplog) == []


def test_a_small_run_is_read_inline(small_run, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    calls = _paths(monkeypatch)
    res = C.check_paths([small_run[0]], workers=1)
    assert res.exit_code == 0 and res.steps > 0
    assert calls == ["check_run"]                         # alone, on this thread
    assert _fell_back(caplog) == []


def test_a_big_run_is_read_ahead_with_the_same_findings(small_run, monkeypatch):
    """Big = at least SMALL_RUN_BYTES of the run's files (steps and requests,
    stream.is_big_run); the constant is lowered below this run's size rather than writing
    8 MB of trace."""
    inline = _report(C.check_paths([small_run[0]], workers=1))
    calls = _paths(monkeypatch)
    monkeypatch.setattr(stream, "SMALL_RUN_BYTES", small_run[1] // 4)
    res = C.check_paths([small_run[0]], workers=1)
    assert calls[:2] == ["check_run", "_ReadAhead"] and "_pool_clean" not in calls
    assert _report(res) == inline


def test_a_failing_pool_says_so_once_and_changes_nothing(tiny_dataset, monkeypatch, caplog):
    with monkeypatch.context() as m:
        m.setattr(pool, "POOL_RUN_BYTES", 0)
        alone = _report(C.check_paths([tiny_dataset]))

    def broken(*a, **k):
        raise ValueError("injected")
    monkeypatch.setattr(pool, "_pool_clean", broken)
    monkeypatch.setattr(pool, "POOL_RUNS", 3)             # three pools fail: one line
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    assert _report(C.check_paths([tiny_dataset], workers=1)) == alone
    assert _fell_back(caplog) == ["pool (pooled check) fell back to checking each run alone: ValueError: injected"]


def test_a_bug_in_the_pool_is_not_hidden(tiny_dataset, monkeypatch):
    """An error no data causes (here AttributeError) propagates: before, every run was
    quietly checked alone and the pool's bug showed only as slowness."""
    def buggy(*a, **k):
        raise AttributeError("injected bug")
    monkeypatch.setattr(pool, "_pool_clean", buggy)
    with pytest.raises(AttributeError, match="injected bug"):
        C.check_paths([tiny_dataset], workers=1)


def test_a_file_the_arrow_reader_refuses_says_so(tiny_dataset, monkeypatch, caplog):
    with monkeypatch.context() as m:
        m.setattr(pool, "POOL_RUN_BYTES", 0)
        alone = _report(C.check_paths([tiny_dataset]))
    real = pool_read._read_small_file

    def flaky(path, wanted):
        if "run_id=t3" in str(path):
            raise OSError("injected read error")
        return real(path, wanted)
    monkeypatch.setattr(pool_read, "_read_small_file", flaky)
    calls = _paths(monkeypatch)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    assert _report(C.check_paths([tiny_dataset], workers=1)) == alone
    assert calls == ["_pool_clean", "check_run"]          # t3 alone, the other seven pooled
    assert _fell_back(caplog) == ["pool read (Arrow) fell back to checking the run alone: "
                                  "OSError: injected read error"]


def _scan_with_log(members):
    """read_with_polars in a worker, its debug lines collected."""
    got: list = []
    h = logging.Handler()
    h.emit = lambda rec: got.append(rec.getMessage())
    log = logging.getLogger(LOGGER)
    log.addHandler(h)
    log.setLevel(logging.DEBUG)
    fallback._SAID.clear()
    try:
        return pool_read.read_with_polars(members) is None, got
    finally:
        log.removeHandler(h)
        log.setLevel(logging.NOTSET)


def test_the_polars_scan_says_why_it_falls_back(tiny_dataset):
    """A run whose step column has another type: the workers' one-scan read gives up
    (the task is read file by file with Arrow) and says why."""
    f = tiny_dataset / "run_id=t3" / "steps-000000.parquet"
    t = pq.read_table(f)
    pq.write_table(t.set_column(t.schema.get_field_index("step"), "step", t.column("step").cast(pa.int64())), f)
    fell, lines = _in_fork(_scan_with_log, _members(tiny_dataset))
    assert fell
    assert len(lines) == 1 and lines[0].startswith(
        "pool read (polars scan) fell back to reading file by file with Arrow: "), lines


def test_specaudit_debug_shows_fallbacks_on_stderr(tiny_dataset, monkeypatch, capsys):
    from specaudit.cli import main

    def broken(*a, **k):
        raise ValueError("injected")
    monkeypatch.setattr(pool, "_pool_clean", broken)
    log = logging.getLogger(LOGGER)
    try:
        monkeypatch.delenv("SPECAUDIT_DEBUG", raising=False)
        assert main(["check", str(tiny_dataset)]) == 0
        assert "debug" not in capsys.readouterr().err
        monkeypatch.setenv("SPECAUDIT_DEBUG", "1")
        fallback._SAID.clear()
        assert main(["check", str(tiny_dataset)]) == 0
        err = capsys.readouterr().err
        assert ("specaudit check: debug: specaudit.audit.check.pool: pool (pooled check) fell back to "
                "checking each run alone: ValueError: injected") in err
    finally:
        for h in [h for h in log.handlers if h.get_name() == fallback._HANDLER_NAME]:
            log.removeHandler(h)
        log.setLevel(logging.NOTSET)
