"""scripts/bench_suite.py: the suite's own figures come from the README's pytest line, a
per-test timeline (tests/conftest.py, SPECAUDIT_TEST_TIMELINE) and the machine's CPU
counters; and the benchmarks page shows the load read while measuring."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import bench_suite  # noqa: E402
import render_docs  # noqa: E402


def test_it_runs_the_pytest_line_of_test_sh_with_the_workers_asked():
    line = next(ln for ln in (REPO / "scripts" / "test.sh").read_text().splitlines() if ln.startswith("exec "))
    want = [a for a in shlex.split(line)[1:] if a != "$@"]
    got = bench_suite.pytest_argv(7)
    assert got[:got.index("-n")] == want[:want.index("-n")] and got[got.index("-n") + 1] == "7"
    assert got[got.index("-n") + 2:] == want[want.index("-n") + 2:]
    assert "--dist" in got and "loadgroup" in got


def test_pytests_last_line_is_read_with_and_without_failures():
    text = ("....\n109.30s setup    tests/x.py::y\n"
            "=========== 3 failed, 2044 passed, 1 skipped in 476.93s (0:07:56) ===========\n")
    (m,) = bench_suite.SUMMARY.finditer(text)
    assert (m["counts"], m["secs"]) == ("3 failed, 2044 passed, 1 skipped", "476.93")
    (m,) = bench_suite.SUMMARY.finditer("...\n2047 passed in 501.37s (0:08:21)\n")
    assert (m["counts"], m["secs"]) == ("2047 passed", "501.37")
    assert not list(bench_suite.SUMMARY.finditer("12.0s call tests/a.py::b\n"))


def test_summary_gives_each_worker_and_the_modules_holding_the_most_time():
    def rec(test, worker, start, end, cpu, kids):
        return {"test": test, "worker": worker, "start": start, "end": end, "cpu_s": cpu, "children_cpu_s": kids}
    tl = [rec("tests/a.py::x", "gw0", 100.0, 160.0, 1.0, 20.0), rec("tests/a.py::y", "gw0", 160.0, 170.0, 2.0, 0.0),
          rec("tests/b.py::z", "gw1", 101.0, 131.0, 30.0, 0.0)]
    s = bench_suite.summarise(tl)
    assert s["per_worker"] == {"gw0": {"tests": 2, "busy_from_s": 0.0, "last_end_s": 70.0},
                            "gw1": {"tests": 1, "busy_from_s": 1.0, "last_end_s": 31.0}}
    assert s["modules"] == [{"module": "tests/a.py", "wall_s": 70.0, "cpu_s": 23.0, "tests": 2},
                            {"module": "tests/b.py", "wall_s": 30.0, "cpu_s": 30.0, "tests": 1}]


def test_a_real_run_is_timed_from_the_timeline_and_the_cpu_counters(monkeypatch):
    """One real test through the repository's conftest: its timeline record and the run's figures."""
    one = "tests/test_bench_suite.py::test_pytests_last_line_is_read_with_and_without_failures"
    monkeypatch.setattr(bench_suite, "pytest_argv", lambda n: [sys.executable, "-m", "pytest", "-q", "-p",
                                                              "no:cacheprovider", "-n", str(n), one])
    r = bench_suite.run_suite(0, sys.stderr)
    assert r["exit_code"] == 0 and r["result"] == "1 passed" and r["pytest_s"] > 0, r
    assert r["wall_s"] >= r["pytest_s"] and r["cpu_s"] > 0 and 0 < r["busy"] <= 1.05, r
    assert r["workers"] == 0 and r["per_worker"]["main"]["tests"] == 1
    (mod,) = r["modules"]
    assert mod["module"] == "tests/test_bench_suite.py" and mod["tests"] == 1 and mod["wall_s"] >= 0


def test_a_failing_run_names_its_failures_and_keeps_the_whole_output(monkeypatch, tmp_path):
    """A failure's detail is not lost: the run names the failed node ids and its whole output
    (the traceback included, however long the output after it) stays in log_dir."""
    t = tmp_path / "test_two.py"
    t.write_text("def test_ok():\n    assert True\n\n\ndef test_bad():\n    assert 2 + 2 == 5, 'arithmetic'\n")
    monkeypatch.setattr(bench_suite, "pytest_argv", lambda n: [sys.executable, "-m", "pytest", "-q", "-p",
                                                              "no:cacheprovider", str(t)])
    logs = tmp_path / "logs"
    logs.mkdir()
    r = bench_suite.run_suite(0, sys.stderr, logs)
    assert r["exit_code"] == 1 and r["result"] == "1 failed, 1 passed", r
    assert [f.rsplit("::", 1)[1] for f in r["failed"]] == ["test_bad"], r["failed"]
    text = (logs / "pytest-n0.log").read_text()
    assert "arithmetic" in text and "def test_bad" in text and "1 failed, 1 passed" in text
    assert bench_suite.failed_tests("FAILED tests/a.py::b[x-1] - AssertionError: no\nERROR tests/c.py::d\n"
                                    "FAILED tests/a.py::b[x-1] - again\n") == ["tests/a.py::b[x-1]", "tests/c.py::d"]


def test_the_page_shows_the_load_read_while_measuring_not_after():
    name, title, script, what, keys = next(b for b in render_docs.BENCHMARKS if b[0] == "suite")
    figs = {k: 1 for k, _ in keys}
    figs.update(load_avg_1m=0.4, machine_quiet=True)
    doc = {"benchmark": name, "command": "python3 scripts/bench_suite.py", "commit": "0" * 40, "dirty": False,
           "date": "2026-12-02T00:00:00Z", "machine": {"cores": 2, "load_avg_1m": 3.9, "machine_quiet": False},
           "figures": figs}
    text = render_docs.render_benchmark(name, doc, title, script, what, keys)
    assert "load average 0.4 on 2 cores (quiet)" in text and "3.9" not in text
    del figs["load_avg_1m"], figs["machine_quiet"]          # a benchmark without its own: the machine's
    text = render_docs.render_benchmark(name, json.loads(json.dumps(doc)), title, script, what, keys)
    assert "load average 3.9 on 2 cores (busy: ratios withheld)" in text


def test_a_runs_modules_and_workers_are_tables_of_their_own_not_json_cells():
    """Records inside a run's record (modules: a list; per_worker: keyed by worker) render
    as their own tables, one per run, named by the run's first column."""
    name, title, script, what, keys = next(b for b in render_docs.BENCHMARKS if b[0] == "suite")
    figs = {k: 1 for k, _ in keys}
    figs["runs"] = [{"workers": w, "pytest_s": 400.0 + w, "per_worker": {"gw0": {"tests": 7 + w}},
                     "modules": [{"module": "tests/test_x.py", "wall_s": 12.5 + w}]} for w in (2, 3)]
    doc = {"benchmark": name, "command": "python3 scripts/bench_suite.py", "commit": "0" * 40, "dirty": False,
           "date": "2026-12-02T00:00:00Z", "machine": {"cores": 2, "load_avg_1m": 0.1}, "figures": figs}
    text = render_docs.render_benchmark(name, doc, title, script, what, keys)
    assert "| workers | pytest_s |\n|---|---|\n| 2 | 402.0 |\n| 3 | 403.0 |" in text
    assert "modules (workers 3):" in text and "| tests/test_x.py | 15.5 |" in text
    assert "per_worker (workers 2):" in text and "| gw0 | 9 |" in text
    assert '{"' not in text                                   # no record left as a JSON cell
    rows = render_docs._rows_table("only records", [{"modules": [{"module": "m", "wall_s": 1.0}]}])
    assert "modules (row 1):" in "\n".join(rows) and "| m | 1.0 |" in rows  # no column to name a row by


def test_the_headline_figure_is_the_run_at_test_shs_own_worker_count(monkeypatch, tmp_path, capsys):
    """--workers 3,4 (one below test.sh's and its own) runs both; pytest_s and of_target
    are the run at scripts/test.sh's -n."""
    own = int(bench_suite.test_sh_pytest()[bench_suite.test_sh_pytest().index("-n") + 1])
    fake = {n: {"workers": n, "exit_code": 0, "result": "9 passed", "pytest_s": 100.0 * n, "wall_s": 100.0 * n,
                "cpu_s": 1.0, "busy": 0.5, "idle_core_s": 1.0, "per_worker": {}, "modules": []}
            for n in (own - 1, own)}
    dirs = []
    monkeypatch.setattr(bench_suite, "run_suite", lambda n, log, log_dir: dirs.append(log_dir) or fake[n])
    monkeypatch.setattr(bench_suite, "quiet_machine", lambda: 0.1)
    assert bench_suite.main(["--workers", f"{own - 1},{own}", "--json-out", str(tmp_path / "s.json"),
                             "--log-dir", str(tmp_path / "logs")]) == 0
    assert dirs == [tmp_path / "logs"] * 2 and dirs[0].is_dir()
    cap = capsys.readouterr()
    assert f"{tmp_path / 'logs'}/pytest-n<workers>.log" in cap.err
    out = json.loads(cap.out.strip().splitlines()[-1])
    assert out["test_sh_workers"] == own and out["pytest_s"] == 100.0 * own
    assert [r["workers"] for r in out["runs"]] == [own - 1, own]
    assert json.loads((tmp_path / "s.json").read_text())["figures"]["pytest_s"] == 100.0 * own


def test_a_bad_worker_list_is_a_usage_error_not_a_traceback(capsys):
    import pytest
    with pytest.raises(SystemExit) as e:
        bench_suite.main(["--workers", "two"])
    assert e.value.code == 2 and "comma-separated worker counts" in capsys.readouterr().err
