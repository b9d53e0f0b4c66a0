"""Thin commands: every module in specaudit/commands/ is argument parsing plus a call into a
library function; the library functions the commands call are tested here directly
(check: test_check_inputs.py, query: test_query_dataset.py, report: test_report_inputs.py)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 40   # a command's function beyond add_arguments: parse, call, print; no more


def test_every_command_function_is_short():
    long = []
    for p in sorted((REPO / "specaudit" / "commands").glob("*.py")):
        for n in ast.parse(p.read_text(encoding="utf-8")).body:
            if isinstance(n, ast.ClassDef):
                long.append(f"{p.name}: class {n.name}")
            if isinstance(n, ast.FunctionDef) and n.name != "add_arguments" and n.end_lineno - n.lineno >= MAX_LINES:
                long.append(f"{p.name}: {n.name} has {n.end_lineno - n.lineno + 1} lines")
    assert not long, long


def test_ab_runtime_arms_are_checked_before_anything_runs(tmp_path):
    from specaudit.traced_ab import parse_vary, run_arms
    assert parse_vary(" algo, budget ,") == ["algo", "budget"] and parse_vary(None) is None
    for kw, word in ((dict(primary="accept_len"), "evidence metric"), (dict(num_prompts=0), "--num-prompts"),
                     (dict(n_boot=10), "--bootstrap"), (dict(same_within=1.0), "--same-within")):
        with pytest.raises(ValueError, match=word):
            run_arms("--algo chain", "--algo tree", out=tmp_path / "ab", **kw)
    assert not (tmp_path / "ab").exists()


def test_calibrate_profile_by_hand_and_its_text(tmp_path):
    from specaudit.audit.calibrate import format_profile, make_profile, parse_ints
    assert parse_ints("2, 4,8") == (2, 4, 8)
    for bad in ("4,a", "0", ""):
        with pytest.raises(ValueError):
            parse_ints(bad)
    with pytest.raises(ValueError, match="at most one"):
        make_profile(cost_factor=1.5, from_traces=str(tmp_path))
    with pytest.raises(ValueError, match="--drafter needs --target"):
        make_profile(drafter="skip:1")
    prof = make_profile(cost_factor=1.5, cost_factor_std=0.1)
    text = format_profile(prof, "c.json")
    assert text.startswith("cost profile (") and "-> c.json" in text and "r = 1.500 (sd 0.100)" in text


def test_run_summary_line_shows_derived_beside_reported():
    from specaudit.audit.run_summary import summary_line
    s = {"run_id": "r1", "requests": 2, "steps": 9, "mean_accepted_depth": 1.0, "reported_mean_accepted_depth": 7.0,
         "mean_commit_len": 2.0, "reported_mean_commit_len": 2.0, "tokens_per_s": 123.45}
    line = summary_line(s)
    assert line.startswith("r1: 2 requests, 9 steps, mean accepted depth 1.00 (reported 7.00, DISAGREES)")
    assert "mean commit length 2.00 (reported 2.00)," in line and line.endswith("123.5 tokens/s")


def test_rules_text_selects_and_renders():
    from specaudit.invariants import load_rules
    from specaudit.invariants.catalog import render
    rules = load_rules(entry_points=False)
    one = render(rules, "sa590")
    assert one.startswith("SA590 client-vs-trace (error, scope source)\n") and "What:" in one
    fam = render(rules, "SA59")
    assert "SA590" in fam and "SA591" in fam and "SA596" in fam   # + llama.cpp client vs server (sa59_llamacpp)
    assert fam.rstrip().endswith("7 rules; `specaudit rules CODE` explains one.")
    with pytest.raises(ValueError, match="no rule 'SA999'"):
        render(rules, "SA999")
