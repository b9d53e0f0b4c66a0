"""`specaudit ab --same-within`: the user's "same" band reaches every decision of both modes.

The band's default lives in specaudit.ab_verdict (SAME_WITHIN) and the rule there too; each
A/B mode passes the user's band down to its comparisons. These tests run the CLI with a
band far from the default and check every decision in its JSON against the band given:

    evidence (`ab A B`)      each stratum's verdicts and more-windows estimates, the matched
                             and pooled verdicts, the confounder report (whether the pooled
                             gap is "already the same" and which metrics' gaps it explains)
    runtime (`ab --a --b`)   each metric's verdict

and that the same inputs under the default band decide differently, so a path that
dropped the band for the default would fail here.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specaudit.ab_verdict import SAME_WITHIN, verdict
from specaudit.audit.ab_evidence.stats import more_windows
from specaudit.cli import main

ENGINES = Path(__file__).parent / "fixtures" / "engines"
SEED = (ENGINES / "seed_linear.log", ENGINES / "seed_chain.log")   # accept length 2.28 vs 1.99 at 1 request


def _ab_json(capsys, *argv) -> dict:
    code = main(["ab", *map(str, argv), "--output-format", "json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return json.loads(cap.out)


def _decided(x: dict, band: float) -> str:
    return verdict(x["diff_b_minus_a"]["ci95"], x["a"]["mean"], band)


def _evidence_decisions(res: dict, band: float) -> dict:
    """Every decision of an evidence result, remade from its numbers with `band`:
    {where: what the result should say}."""
    want = {}
    for s in res["strata"]:
        for m, x in s["metrics"].items():
            v = _decided(x, band)
            want[("stratum", s["label"], m, "verdict")] = v
            if v == "undecided":
                want[("stratum", s["label"], m, "more_windows")] = more_windows(
                    x["a"]["n"], x["b"]["n"], x["diff_b_minus_a"]["ci95"], x["diff_b_minus_a"]["mean"],
                    x["a"]["mean"], band)
    for block in ("matched", "pooled"):
        for m, x in res[block].items():
            want[(block, m, "verdict")] = _decided(x, band)
    pooled = res["pooled"]
    for e in res["confounders"]:
        if e["key"] == "all matched keys" or e.get("gap_within") is None:
            continue
        g = pooled[res["primary"]]["diff_b_minus_a"]["mean"]
        agree = abs(g) <= band * abs(pooled[res["primary"]]["a"]["mean"])
        want[("confounder", e["key"], "pooled figures agree")] = agree
        gaps = {m: x["diff_b_minus_a"]["mean"] for m, x in pooled.items()}
        want[("confounder", e["key"], "metrics explained")] = sorted(
            m for m, g_m in gaps.items() if abs(g_m) > band * abs(pooled[m]["a"]["mean"]) and abs(g_m) > 1e-9)
    return want


def _evidence_said(res: dict) -> dict:
    """What the result says, keyed as _evidence_decisions keys it."""
    said = {}
    for s in res["strata"]:
        for m, x in s["metrics"].items():
            said[("stratum", s["label"], m, "verdict")] = x["verdict"]
            if x["verdict"] == "undecided":
                said[("stratum", s["label"], m, "more_windows")] = x.get("more_windows")
    for block in ("matched", "pooled"):
        for m, x in res[block].items():
            said[(block, m, "verdict")] = x["verdict"]
    for e in res["confounders"]:
        if e["key"] == "all matched keys" or e.get("gap_within") is None:
            continue
        said[("confounder", e["key"], "pooled figures agree")] = e.get("note") == "the pooled figures already agree"
        said[("confounder", e["key"], "metrics explained")] = sorted(e["explains_by_metric"])
    return said


@pytest.mark.parametrize("band", [0.5, 0.2])
def test_evidence_mode_honours_same_within_everywhere(capsys, band):
    res = _ab_json(capsys, *SEED, "--same-within", band)
    assert res["same_within"] == band
    assert _evidence_said(res) == _evidence_decisions(res, band)
    # the same numbers under the default band decide otherwise in each kind of decision
    # (else this test could not see a path that fell back to the default)
    default = _evidence_decisions(res, SAME_WITHIN)
    changed = {k for k, v in _evidence_decisions(res, band).items() if default.get(k) != v}
    assert {k[0] for k in changed} >= ({"stratum", "matched"} if band == 0.2 else
                                       {"stratum", "matched", "pooled", "confounder"}), changed


def test_evidence_mode_more_windows_follows_same_within(capsys):
    """The more-windows estimate of an undecided stratum aims at the user's band: at 5.1% the
    rank-1 strata stay undecided and the nearer target is 'same' (band - gap), not the gap
    the default band aims at, so the estimate differs from the default's."""
    a = _ab_json(capsys, ENGINES / "sglang_clean_dp2.log", ENGINES / "sglang_dp_ranks.log", "--concurrency-bins",
                 "exact", "--min-windows", "2", "--same-within", "0.051")
    assert _evidence_said(a) == _evidence_decisions(a, 0.051)
    mw = {k: v for k, v in _evidence_said(a).items() if k[-1] == "more_windows"}
    assert mw and mw != {k: v for k, v in _evidence_decisions(a, SAME_WITHIN).items() if k in mw}, mw


def test_evidence_default_is_the_one_constant(capsys):
    res = _ab_json(capsys, *SEED)
    assert res["same_within"] == SAME_WITHIN
    assert _evidence_said(res) == _evidence_decisions(res, SAME_WITHIN)


def test_runtime_mode_honours_same_within(capsys, tmp_path, monkeypatch, models):
    """Arms that differ in budget (7 vs 1 drafted token per step): at the default band B is
    worse in accepted depth; a band of 95% of A calls every metric whose interval fits 'same'."""
    from specaudit import traced_ab as ab_arms
    monkeypatch.setattr(ab_arms, "_default_loader", lambda: (lambda device, dtype: models))
    band = 0.95
    res = _ab_json(capsys, "--a=--max-new-tokens 12", "--b=--max-new-tokens 12 --budget 1", "--num-prompts", "2",
                   "--repeats", "1", "--bootstrap", "200", "--out", tmp_path / "ab", "--no-progress",
                   "--same-within", band)
    assert res["same_within"] == band
    said = {m: x["verdict"] for m, x in res["metrics"].items()}
    assert said == {m: _decided(x, band) for m, x in res["metrics"].items()}
    default = {m: _decided(x, SAME_WITHIN) for m, x in res["metrics"].items()}
    assert said["accepted_depth"] == "same" and default["accepted_depth"] == "A better", (said, default)
    assert res["verdict"] == said["tokens_per_s"]
    saved = json.loads((tmp_path / "ab" / "ab.json").read_text())
    assert saved["same_within"] == band and saved["metrics"] == res["metrics"]


def test_the_band_and_the_verdict_have_one_home():
    """specaudit/ab_verdict.py is the only place the band's value and the verdict rule are
    written: both A/B modes import them at top level, and no module writes a band default of
    its own (`same_within=0.02`, `same_within: float = 0.02`, `default=0.02` beside the flag)."""
    import ast
    import re
    repo = Path(__file__).resolve().parents[1]
    for rel in ("specaudit/traced_ab.py", "specaudit/audit/ab_evidence/comparison.py"):
        tree = ast.parse((repo / rel).read_text(encoding="utf-8"))
        top = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "specaudit.ab_verdict"
               for a in n.names}
        assert "verdict" in top, f"{rel} does not import the verdict from specaudit.ab_verdict at top level"
    home = ast.parse((repo / "specaudit" / "ab_verdict.py").read_text(encoding="utf-8"))
    assert not [n for n in ast.walk(home) if isinstance(n, (ast.Import, ast.ImportFrom))
                and any((getattr(n, "module", None) or a.name).startswith("specaudit") for a in n.names)]
    literal = re.compile(r"same_within\s*(:\s*float\s*)?=\s*[0-9.]|--same-within[^)]*default=[0-9.]", re.S)
    rule = re.compile(r"^def verdict\(diff_ci", re.M)
    for p in sorted((repo / "specaudit").rglob("*.py")):
        if p.name == "ab_verdict.py":
            continue
        text = p.read_text(encoding="utf-8")
        assert not literal.search(text), f"{p.relative_to(repo)} writes a 'same' band of its own"
        assert not rule.search(text), f"{p.relative_to(repo)} defines an A/B verdict of its own"
