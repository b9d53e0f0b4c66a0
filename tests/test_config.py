"""`specaudit check` settings from [tool.specaudit] / specaudit.toml (specaudit/config.py):
found walking up like ruff, overridden by flags, --config / --isolated, bad keys refused."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specaudit.cli import main

ENGINES = Path(__file__).resolve().parent / "fixtures" / "engines"
LOG = "sglang_counter_vs_throughput.log"    # SA708 (error) and SA709 (warning)


@pytest.fixture
def proj(tmp_path, monkeypatch):
    """A repository with an engine log, the working directory two folders below its root."""
    shutil.copy(ENGINES / LOG, tmp_path / LOG)
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    return tmp_path


def check(capsys, *args):
    code = main(["check", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def counts(out: str) -> dict:
    return json.loads(out)["counts"]


def test_without_a_file_both_codes_and_exit_1(proj, capsys):
    code, out, _ = check(capsys, proj / LOG, "--output-format", "json")
    assert code == 1 and counts(out) == {"SA708": 1, "SA709": 1}


def test_pyproject_found_walking_up(proj, capsys):
    (proj / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.specaudit]\nselect = ["SA709"]\n'
                                         'output-format = "json"\n')
    code, out, _ = check(capsys, proj / LOG)
    assert counts(out) == {"SA709": 1} and code == 0   # a warning only


def test_nearest_file_wins_and_specaudit_toml_before_pyproject(proj, capsys):
    (proj / "pyproject.toml").write_text('[tool.specaudit]\nselect = ["SA709"]\noutput-format = "json"\n')
    (proj / "a" / "pyproject.toml").write_text('[tool.specaudit]\nselect = ["SA708"]\noutput-format = "json"\n')
    assert counts(check(capsys, proj / LOG)[1]) == {"SA708": 1}
    (proj / "a" / "specaudit.toml").write_text('ignore = ["SA708"]\noutput-format = "json"\n')
    assert counts(check(capsys, proj / LOG)[1]) == {"SA709": 1}


def test_pyproject_without_the_table_is_passed_over(proj, capsys):
    (proj / "pyproject.toml").write_text('[tool.specaudit]\nselect = ["SA709"]\noutput-format = "json"\n')
    (proj / "a" / "pyproject.toml").write_text('[project]\nname = "inner"\n')   # no [tool.specaudit]
    (proj / "a" / "b" / "pyproject.toml").write_text('this is [ not toml')      # not ours to judge
    assert counts(check(capsys, proj / LOG)[1]) == {"SA709": 1}


def test_flags_override_the_file(proj, capsys):
    (proj / "specaudit.toml").write_text('select = ["SA7"]\nignore = ["SA708"]\noutput-format = "json"\n')
    assert counts(check(capsys, proj / LOG)[1]) == {"SA709": 1}
    code, out, _ = check(capsys, proj / LOG, "--ignore", "SA709")   # --ignore replaces the file's ignore
    assert counts(out) == {"SA708": 1} and code == 1
    code, out, _ = check(capsys, proj / LOG, "--select", "SA708", "--ignore", "SA709", "--output-format", "text")
    assert code == 1 and "SA708" in out and not out.lstrip().startswith("{")


def test_isolated_and_config_flags(proj, capsys, tmp_path_factory):
    (proj / "specaudit.toml").write_text('select = ["SA709"]\noutput-format = "json"\n')
    code, out, _ = check(capsys, proj / LOG, "--isolated")
    assert code == 1 and "SA708" in out and not out.lstrip().startswith("{")
    other = tmp_path_factory.mktemp("elsewhere") / "ci.toml"
    other.write_text('select = ["SA708"]\noutput-format = "json"\n')
    assert counts(check(capsys, proj / LOG, "--config", other)[1]) == {"SA708": 1}
    code, _, err = check(capsys, proj / LOG, "--config", other, "--isolated")
    assert code == 2 and err.count("\n") == 1 and "--isolated" in err


def test_per_path_ignores_exact_counts(proj, capsys):
    for d in ("legacy", "new"):
        (proj / d).mkdir()
        shutil.copy(ENGINES / LOG, proj / d / LOG)
    (proj / "pyproject.toml").write_text('[tool.specaudit]\noutput-format = "json"\n'
                                         '[tool.specaudit.per-path-ignores]\n"legacy" = ["SA708"]\n')
    code, out, _ = check(capsys, proj / "legacy" / LOG, proj / "new" / LOG, "--max-per-code", "1")
    rep = json.loads(out)
    assert rep["counts"] == {"SA708": 1, "SA709": 2} and code == 1
    assert [f["file"] for f in rep["findings"] if f["code"] == "SA708"] == [str(proj / "new" / LOG)]
    # the ignore drops only its codes, only under its path: new/ alone still has both
    (proj / "pyproject.toml").write_text('[tool.specaudit]\noutput-format = "json"\n'
                                         '[tool.specaudit.per-path-ignores]\n"*.log" = ["SA7"]\n')
    code, out, _ = check(capsys, proj / "new" / LOG)
    assert counts(out) == {} and code == 0


def test_severity_overrides_decide_the_exit_code(proj, capsys):
    (proj / "specaudit.toml").write_text('select = ["SA709"]\n[severity]\nSA709 = "error"\n')
    code, out, _ = check(capsys, proj / LOG)
    assert code == 1 and "SA709 acceptance-shift (error)" in out
    (proj / "specaudit.toml").write_text('[severity]\nSA7 = "warning"\nSA709 = "info"\n')   # longest prefix wins
    code, out, _ = check(capsys, proj / LOG, "--output-format", "json")
    rules = json.loads(out)["rules"]
    assert code == 0 and rules["SA708"]["severity"] == "warning" and rules["SA709"]["severity"] == "info"


def test_throughput_tolerance(proj, capsys):
    near = proj / "near.prom"   # reported 2.4 against an estimate band [1.41, 1.98]: outside by 21%
    near.write_text((ENGINES / "specaudit_estimate_diverged.prom").read_text().replace(
        "specaudit_reported_commit_length 8.0000", "specaudit_reported_commit_length 2.4000"))
    code, out, _ = check(capsys, near)
    assert code == 1 and "SA708" in out and "(tolerance 10%)" in out
    (proj / "specaudit.toml").write_text("[tolerances]\nthroughput = 0.3\n")
    code, out, _ = check(capsys, near)
    assert code == 0 and "SA708" not in out, out
    from specaudit.invariants import sa7xx_throughput
    assert sa7xx_throughput.TOLERANCE == 0.1   # put back after the check


@pytest.mark.parametrize("text, names", [
    ('selct = ["SA7"]\n', ["selct", "did you mean select"]),
    ('select = ["SA77x"]\n', ["select SA77X", "no rule"]),
    ('ignore = "SA7"\n', ["ignore", "list"]),
    ('output-format = "yaml"\n', ["output-format", "'yaml'"]),
    ('[per-path-ignores]\n"nothing/*" = ["SA7"]\n', ["per-path-ignores 'nothing/*'", "matches no file"]),
    ('[per-path-ignores]\n"*.log" = ["SA99"]\n', ["per-path-ignores '*.log'", "no rule"]),
    ('[severity]\nSA708 = "fatal"\n', ["severity SA708", "'fatal'"]),
    ('[severity]\nSA9999 = "info"\n', ["severity", "SA9999", "no rule"]),
    ('[tolerances]\nthroughputt = 0.2\n', ["tolerances throughputt", "did you mean throughput"]),
    ('[tolerances]\nthroughput = "big"\n', ["tolerances throughput", "number"]),
    ("select = [\n", ["not valid TOML"]),
])
def test_bad_configuration_is_one_line_naming_file_and_key(proj, capsys, text, names):
    cfg = proj / "specaudit.toml"
    cfg.write_text(text)
    code, out, err = check(capsys, proj / LOG)
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert str(cfg) in err and all(n in err for n in names), err


def test_pyproject_key_errors_name_the_table(proj, capsys):
    (proj / "pyproject.toml").write_text('[tool.specaudit]\nselct = ["SA7"]\n')
    code, _, err = check(capsys, proj / LOG)
    assert code == 2 and "pyproject.toml: [tool.specaudit] selct: unknown key" in err, err
    code, _, err = check(capsys, proj / LOG, "--config", proj / "a" / "missing.toml")
    assert code == 2 and "missing.toml: no such file" in err
    (proj / "a" / "pyproject.toml").write_text('[project]\nname = "x"\n')
    code, _, err = check(capsys, proj / LOG, "--config", proj / "a" / "pyproject.toml")
    assert code == 2 and "has no [tool.specaudit] table" in err


def test_output_format_default_stays_text_and_only_a_typed_flag_overrides(proj, capsys):
    from specaudit.cli import build_parser
    sp = build_parser().subparsers["check"]
    assert next(a for a in sp._actions if "--output-format" in a.option_strings).default == "text"
    (proj / "specaudit.toml").write_text('output-format = "json"\n')
    assert check(capsys, proj / LOG)[1].lstrip().startswith("{")                    # the file's format
    assert not check(capsys, proj / LOG, "--output-format", "text")[1].lstrip().startswith("{")   # the flag's
