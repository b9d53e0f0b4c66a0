"""`specaudit demo` end to end (small settings, the same code path): what the README says it
shows is what it shows, and it exits non-zero when any of its promises fails."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import specaudit.demo as demo
from specaudit.cli import main

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--num-prompts", "1", "--max-new-tokens", "32"]


def _readme_block() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- demo-output:begin -->", 1)[1].split("<!-- demo-output:end -->", 1)[0]
    return [ln for ln in block.strip().strip("`").strip("\n").splitlines() if ln.strip()]


def _pattern(line: str) -> re.Pattern:
    """A README output line with what varies run to run generalised: a run id's timestamp and
    suffix, numbers (counts and figures), the demo folder, singular or plural counts."""
    line = re.sub(r"\d{8}T\d{6}-[0-9a-f]{4}", "<RUN>", line)
    rx = ""
    for i, p in enumerate(re.split(r"(<RUN>|specaudit-demo/|(?<![\w.])\d+(?:\.\d+)?)", line)):
        if i % 2 == 0:
            rx += re.sub(r"\b(finding|request|run|step|file|violation|rule)s?\b", r"\1s?", re.escape(p))
        else:
            rx += {"<RUN>": r"\d{8}T\d{6}-[0-9a-f]{4}", "specaudit-demo/": r"\S*/"}.get(p, r"\d+(?:\.\d+)?")
    return re.compile(rx)


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory):
    import contextlib
    import io
    out = tmp_path_factory.mktemp("demo") / "d"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["demo", *SMALL, "--out", str(out)])
    return code, buf.getvalue(), out


def test_demo_end_to_end_shows_what_the_readme_says(small_demo):
    code, text, out = small_demo
    assert code == 0, text
    lines = text.splitlines()
    runs = [ln for ln in lines if re.match(r"(chain|tree)-b\d+-k\d+-c\d+-(\S+-)?\d{8}T", ln)]
    assert len(runs) == 3 and all("lossless: yes" in ln for ln in runs), runs     # chain, tree, injected
    assert "DISAGREES" not in runs[0] + runs[1] and "DISAGREES" in runs[2]
    assert any(ln.startswith("No violations; checked 2 runs") for ln in lines), text
    for code_ in demo.EXPECTED_CODES:
        assert re.search(rf"^{code_} \S+ \(error\): \d+ findings?$", text, re.M), code_
    assert (out / "report" / "report.html").stat().st_size > 0
    assert lines[-1] == ("demo OK: clean runs clean and lossless; the injected bug caught by "
                         f"{', '.join(demo.EXPECTED_CODES)}; report written")
    # every line of the README's output block is a line of this run, up to run ids and figures
    for want in _readme_block():
        rx = _pattern(want)
        assert any(rx.fullmatch(ln) for ln in lines), f"README line not in the demo's output: {want}"


def test_the_readme_names_the_codes_the_demo_requires():
    readme = (REPO / "README.md").read_text()
    assert f"the injected bug caught by {', '.join(demo.EXPECTED_CODES)}" in readme
    assert "python3 -m specaudit demo" in readme


def test_demo_fails_when_the_injected_bug_is_not_caught(tmp_path, monkeypatch, capsys):
    # a fault the per-step and run-mean rules cannot see (it needs diff / the oracle)
    monkeypatch.setattr(demo, "INJECT", "stale-draft")
    code = main(["demo", *SMALL, "--out", str(tmp_path / "d")])
    out = capsys.readouterr().out
    assert code == 1, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("demo FAILED: ") and "stale-draft bug was not caught by SA301" in last, last


def test_demo_fails_when_the_report_is_not_written(tmp_path, monkeypatch, capsys):
    import specaudit.postmortem.report as report
    monkeypatch.setattr(report, "build_report", lambda paths, out_dir, **kw: Path(out_dir) / "report.html")
    code = main(["demo", *SMALL, "--out", str(tmp_path / "d")])
    out = capsys.readouterr().out
    assert code == 1 and "report" in out.strip().splitlines()[-1] and "was not written" in out, out


@pytest.mark.parametrize("change, says", [
    ({"clean_exit": 1}, "clean runs' check exited 1"),
    ({"lossless": [True, False]}, "not lossless"),
    ({"lossless": []}, "not lossless"),
    ({"injected_counts": {"SA301": 3, "SA506": 1}}, "not caught by SA507"),
])
def test_each_broken_promise_is_named(tmp_path, change, says):
    report = tmp_path / "report.html"
    report.write_text("<html>")
    good = dict(clean_exit=0, lossless=[True, True], injected_counts={c: 1 for c in demo.EXPECTED_CODES},
                report=report)
    assert demo.demo_problems(**good) == []
    problems = demo.demo_problems(**{**good, **change})
    assert len(problems) == 1 and says in problems[0], problems
