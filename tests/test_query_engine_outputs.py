"""`specaudit query` and `report` over engine outputs (issue 28 item 4): a `windows` view
(one row per log line or scrape) and a `findings` view, in the same read-only, offline
DuckDB session as the trace views."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specaudit.cli import main
from specaudit.postmortem.engine_views import WINDOW_SCHEMA, split_paths, windows_table
from specaudit.trace.synth import synth_run_rows, write_run

ENGINES = Path(__file__).parent / "fixtures" / "engines"
CHAIN = str((ENGINES / "seed_chain.log").resolve())
BAD_RATE = str((ENGINES / "sglang_rate_above_one.log").resolve())


def _json(capsys):
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    return json.loads(cap.out), cap.err


def _one_line_err(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errs = [ln for ln in err.splitlines() if ": error: " in ln]
    assert len(errs) == 1, err
    return errs[0]


def test_windows_view_one_row_per_log_line(capsys):
    sql = ("SELECT engine, version, line, time, concurrency, rank, accept_len, accept_rate, gen_tps, k "
           "FROM windows ORDER BY line")
    assert main(["query", CHAIN, sql, "--output-format", "json"]) == 0
    rows, err = _json(capsys)
    decode_lines = [i + 1 for i, ln in enumerate(Path(CHAIN).read_text().splitlines()) if "Decode batch" in ln]
    assert [r["line"] for r in rows] == decode_lines and len(rows) == 8
    assert {r["engine"] for r in rows} == {"sglang"} and all(r["version"] for r in rows)
    assert {r["concurrency"] for r in rows} == {1.0} and {r["k"] for r in rows} == {7}
    first = Path(CHAIN).read_text().splitlines()[decode_lines[0] - 1]
    assert f"accept len: {rows[0]['accept_len']:.2f}" in first and f"{rows[0]['gen_tps']:.2f}" in first
    # the account of the reading
    assert f"{CHAIN}: sglang" in err and "8 windows" in err


def test_findings_view_holds_the_readers_findings(capsys):
    assert main(["query", BAD_RATE, "SELECT code, severity, line FROM findings WHERE code = 'SA701'",
                 "--output-format", "json"]) == 0
    rows, _ = _json(capsys)
    assert rows and {r["severity"] for r in rows} == {"error"}
    # a clean log: no findings; --no-check leaves the view empty
    assert main(["query", CHAIN, "SELECT count(*) AS n FROM findings", "--output-format", "json"]) == 0
    assert _json(capsys)[0] == [{"n": 0}]
    assert main(["query", BAD_RATE, "SELECT count(*) AS n FROM findings", "--output-format", "json",
                 "--no-check"]) == 0
    assert _json(capsys)[0] == [{"n": 0}]


def test_scrape_and_aiperf_export_are_windows_too(tmp_path, capsys):
    good = {"metrics": {"spec_decode_acceptance_length": {"value": 2.5, "unit": "ratio"},
                        "spec_decode_draft_acceptance_rate": {"value": 50.0, "unit": "%"},
                        "spec_decode_steps": {"value": 20}, "spec_decode_accepted_draft_tokens": {"value": 30},
                        "spec_decode_draft_tokens": {"value": 60}}}
    aiperf = tmp_path / "profile_export.jsonl"
    aiperf.write_text(json.dumps(good) + "\n")
    prom = str(ENGINES / "vllm_clean.prom")
    assert main(["query", prom, str(aiperf), "SELECT file, engine, count(*) AS n, max(accept_len) AS L "
                 "FROM windows GROUP BY ALL ORDER BY file", "--output-format", "json"]) == 0
    rows, _ = _json(capsys)
    by = {Path(r["file"]).name: r for r in rows}
    assert by["profile_export.jsonl"]["engine"] == "aiperf" and by["profile_export.jsonl"]["L"] == 2.5
    assert by["vllm_clean.prom"]["engine"] == "vllm" and by["vllm_clean.prom"]["n"] >= 1


def test_traces_and_logs_in_one_session(tmp_path, capsys):
    steps, reqs, man = synth_run_rows(4, seed=1)
    write_run(tmp_path / "traces", steps, reqs, man)
    sql = ("SELECT (SELECT count(*) FROM windows) AS windows, (SELECT count(*) FROM runs) AS runs, "
           "(SELECT count(*) FROM steps) > 0 AS has_steps")
    assert main(["query", str(tmp_path / "traces"), CHAIN, sql, "--output-format", "json", "--no-check"]) == 0
    assert _json(capsys)[0] == [{"windows": 8, "runs": 1, "has_steps": True}]
    # a trace alone still has the two (empty) views
    assert main(["query", str(tmp_path / "traces"), "SELECT count(*) AS n FROM windows", "--output-format",
                 "json", "--no-check"]) == 0
    assert _json(capsys)[0] == [{"n": 0}]


@pytest.mark.parametrize("sql, msg", [
    ("COPY windows TO 'w.csv'", "refused: COPY"),
    (f"SELECT * FROM read_csv('{CHAIN}')", "refused (read-only, offline session)"),
    ("INSTALL httpfs", "refused"),
    ("SET enable_external_access = true", "lock"),
])
def test_engine_session_is_read_only_and_offline(sql, msg, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)            # a COPY would land here; restored after the test
    assert main(["query", CHAIN, sql]) == 2
    assert msg in _one_line_err(capsys)
    assert not (tmp_path / "w.csv").exists()


def test_o_never_over_the_log_read(capsys):
    before = Path(CHAIN).read_bytes()
    assert main(["query", CHAIN, "SELECT 1", "-o", CHAIN]) == 2
    assert "one of the files this command reads" in _one_line_err(capsys)
    assert Path(CHAIN).read_bytes() == before


@pytest.mark.parametrize("name, msg", [
    ("bad_mixed_engines.log", "more than one engine"),
    ("bad_no_matching_lines.log", "not a recognised engine log"),
    ("bad_empty.log", "empty file"),
])
def test_bad_engine_inputs_one_line(name, msg, capsys):
    assert main(["query", str(ENGINES / name), "SELECT count(*) FROM windows"]) == 2
    assert msg in _one_line_err(capsys)


def test_windows_without_concurrency_are_rows_with_null(tmp_path):
    # SGLang's gauges carry no running-request count: the rows are there, concurrency NULL
    t = windows_table([str(ENGINES / "sglang_clean.prom")])
    assert t.schema.equals(WINDOW_SCHEMA) and t.num_rows >= 1
    assert t.column("accept_len").to_pylist()[0] is not None


def test_split_paths(tmp_path):
    (tmp_path / "d").mkdir()
    ab = tmp_path / "ab.json"
    ab.write_text('{"kind": "specaudit-ab-evidence"}')
    assert split_paths([str(tmp_path / "d"), CHAIN, str(ab)]) == ([str(tmp_path / "d"), str(ab)], [CHAIN])


def test_report_over_engine_outputs(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["report", CHAIN, BAD_RATE, "--out", str(out)]) == 1     # SA701 errors in one of them
    page = (out / "report.html").read_text()
    assert "Engine outputs" in page and "seed_chain.log" in page and "SA701" in page
    assert (out / "engine_windows.png").stat().st_size > 1000
    assert main(["report", CHAIN, "--out", str(tmp_path / "r2")]) == 0
    assert "no identity these outputs hold is broken" in (tmp_path / "r2" / "report.html").read_text()
    # with a trace: the engine section is added to the trace report
    steps, reqs, man = synth_run_rows(4, seed=1)
    write_run(tmp_path / "traces", steps, reqs, man)
    assert main(["report", str(tmp_path / "traces"), CHAIN, "--out", str(tmp_path / "r3"), "--no-check"]) == 0
    page = (tmp_path / "r3" / "report.html").read_text()
    assert "Engine outputs" in page and "Runs" in page
    # a file that is no engine's output: one line, nothing written
    assert main(["report", str(ENGINES / "bad_empty.log"), "--out", str(tmp_path / "r4")]) == 2
    assert "empty file" in _one_line_err(capsys) and not (tmp_path / "r4").exists()
