"""`specaudit run` from the command line: bad input is one clear line and exit 2."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specaudit.cli import main
from specaudit.runtime.faults import FAULTS


def run_cli(capsys, *argv):
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_list_faults(capsys):
    code, out, _ = run_cli(capsys, "run", "--list-faults")
    assert code == 0
    lines = out.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == list(FAULTS)
    for ln, f in zip(lines, FAULTS.values()):
        assert ln.split()[1] == f.revealed_by in ("check", "diff", "lossless")
    assert FAULTS["stale-draft"].revealed_by == "diff"


@pytest.mark.parametrize("argv,needle", [
    (["--inject", "nope"], "unknown fault"),
    (["--budget", "0"], "budget"),
    (["--algo", "tree", "--budget", "2", "--topk", "3"], "exceed"),
    (["--topk", "0", "--algo", "tree"], "topk"),
    (["--prompts", "/nonexistent/prompts.jsonl"], "not found"),
    (["--max-new-tokens", "600"], "context"),
])
def test_bad_input_exit_2(capsys, tmp_path, argv, needle):
    code, out, err = run_cli(capsys, "run", "--out", str(tmp_path / "t"), "--num-prompts", "1", *argv)
    assert code == 2
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").iterdir()), "half-written output"


def test_prompt_longer_than_context(capsys, tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "%s"}\n' % ("x" * 500))
    code, _, err = run_cli(capsys, "run", "--prompts", str(p), "--out", str(tmp_path / "t"))
    assert code == 2 and "exceeds the context" in err


def test_unwritable_out_and_existing_run(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    code, _, err = run_cli(capsys, "run", "--out", str(f), "--num-prompts", "1")
    assert code == 2 and "not a folder" in err
    args = ["run", "--out", str(tmp_path / "t"), "--num-prompts", "1", "--max-new-tokens", "8",
            "--run-id", "same"]
    code, _, err = run_cli(capsys, *args)
    assert code == 0, err
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and "already exists" in err


def test_run_summary_and_console_script(tmp_path):
    """The installed console script runs and prints the closing summary."""
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "specaudit", "run", "--algo", "tree", "--budget", "6",
                        "--topk", "2", "--concurrency", "2", "--num-prompts", "2", "--max-new-tokens", "24",
                        "--oracle", "--out", str(tmp_path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "mean accepted depth" in r.stdout and "mean commit length" in r.stdout
    assert "lossless: yes" in r.stdout and "x plain greedy" in r.stdout
