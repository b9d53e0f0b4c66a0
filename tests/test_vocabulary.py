"""One vocabulary across commands (issue 28 item 5): the same flag for the same thing,
old spellings kept as hidden aliases for one release, --list-faults beside every
--inject, every writer says what it wrote, files written with the user's umask."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from specaudit.cli import build_parser, main

ENGINES = Path(__file__).parent / "fixtures" / "engines"


def _parse(*argv):
    return build_parser().parse_args(list(argv))


def _help(cmd: str) -> str:
    return " ".join(build_parser().subparsers[cmd].format_help().split()) + " "


@pytest.mark.parametrize("cmd, new, old, dest, value", [
    ("run", "--branching", "--topk", "topk", "3"),
    ("serve", "--branching", "--topk", "topk", "3"),
    ("lossless", "--branching", "--topk", "topk", "3"),
    ("serve", "--out", "--trace-dir", "trace_dir", "traces"),
    ("serve", "--profile", "--calibration", "calibration", "cost.json"),
])
def test_old_spellings_are_hidden_aliases(cmd, new, old, dest, value):
    want = int(value) if value.isdigit() else value
    assert getattr(_parse(cmd, new, value), dest) == want
    assert getattr(_parse(cmd, old, value), dest) == want      # still parses, one release
    h = _help(cmd)
    assert new in h and f"{old} " not in h.replace(f"{new} ", "")   # hidden from --help


def test_branching_and_sampling_top_k_are_named_apart():
    a = _parse("run", "--branching", "4", "--top-k", "20", "--out", "t")
    assert (a.topk, a.top_k) == (4, 20)
    assert "not the sampling --top-k" in _help("run") and "not the sampling --top-k" in _help("lossless")


@pytest.mark.parametrize("cmd", ["run", "serve", "lossless"])
def test_list_faults_wherever_inject_is(cmd):
    assert "--inject" in _help(cmd) and "--list-faults" in _help(cmd)
    p = subprocess.run([sys.executable, "-m", "specaudit", cmd, "--list-faults"], capture_output=True, text=True,
                       timeout=120, cwd=Path(__file__).resolve().parents[1])   # this source tree
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0].startswith("commit-counter") and "Traceback" not in p.stderr


def test_every_inject_has_list_faults():
    ap = build_parser()
    for name, sp in ap.subparsers.items():
        opts = {o for a in sp._actions for o in a.option_strings}
        if "--inject" in opts:
            assert "--list-faults" in opts, name


def test_one_default_output_format():
    ap = build_parser()
    for name, sp in ap.subparsers.items():
        for a in sp._actions:
            if "--output-format" in a.option_strings:
                assert a.default == "text", name
    assert _parse("query", "x", "--output-format", "table").output_format == "text"   # old name


def test_top_level_help_lists_both_ab_modes(capsys):
    h = build_parser().format_help()
    line = " ".join(h.split())
    assert "A/B from evidence" in line and "ab A B" in line and "rerunning" in line


def test_check_and_ab_say_what_they_wrote(tmp_path, capsys):
    out = tmp_path / "check.json"
    rc = main(["check", str(ENGINES / "sglang_clean.log"), "--output-format", "json", "-o", str(out)])
    assert rc in (0, 1)
    assert f"wrote {out}" in capsys.readouterr().err and out.exists()
    out = tmp_path / "ab.json"
    main(["ab", str(ENGINES / "seed_linear.log"), str(ENGINES / "seed_chain.log"), "--output-format", "json",
          "-o", str(out)])
    assert f"wrote {out}" in capsys.readouterr().err and out.exists()


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_dashboards_written_with_the_users_umask(tmp_path, mask, mode, capsys):
    old = os.umask(mask)
    try:
        assert main(["dashboards", "--out", str(tmp_path / "m")]) == 0
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "m").rglob("*") if p.is_file()]
    assert files
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {mode}
