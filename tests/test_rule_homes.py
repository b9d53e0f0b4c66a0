"""One home per rule, proven: every catalog rule's own pass/fail fixtures run through every
other home that claims the rule (invariants/homes.py lists the homes; each declares its
codes in its own module).

For each (rule, home) pair, derived from the homes' declarations and scopes (never
listed here): the home flags the rule's failing fixture with the rule's code (the
kernel's flags and the figures view's metrics are mapped to codes by their own
declarations) and, on the passing fixture, flags neither that code nor anything the
catalog itself does not report. Separate tests check the claims: every claimed code is
a catalog rule with a fail fixture, of a scope the home consumes, and no home flags a
code it does not claim. The rule x home matrix is printed in every failure message and
generated into docs/rules/index.md (scripts/render_docs.py), so adding a rule shows at
once which homes lack it.
"""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from specaudit.invariants import Rule
from specaudit.invariants.fixtures import FixtureRun
from specaudit.invariants.homes import HOMES, claims, render_matrix
from specaudit.invariants.registry import builtin_codes, kernel_codes, load_rules

from specaudit.audit.check import check_tables

REPO = Path(__file__).resolve().parents[1]
RULES = {r.code: r for r in load_rules(entry_points=False) if r.code in builtin_codes()}
HOME = {h.name: h for h in HOMES}


def _matrix() -> str:
    return "rule x home (x: computes it, blank: could but does not, -: another scope):\n" + \
        render_matrix(list(RULES.values()))


def _has_fail(rule) -> bool:
    return type(rule).fail is not Rule.fail


# ------------------------------------------------------------------ adapters
# Each takes a FixtureRun and returns the catalog codes the home flags on it.

def oracle_codes(run) -> set:
    from specaudit.audit.reference import check_rows
    return {code for code, _, _ in check_rows(run.steps, run.requests, run.manifest)}


def prom_codes(run) -> set:
    from specaudit.trace.inline_rules import inline_violations
    steps, _ = run.tables()
    v = inline_violations(steps.combine_chunks().to_batches()[0], eos_id=run.eos_id)
    return {c for c, m in v.items() if m.any()}


def _fed_mask(row) -> np.ndarray:
    """The [n, n] mask the engine fed, as far as the row tells: the trace keeps the mask's
    hash, not the mask. The ancestor-or-self mask when the hash is its hash; otherwise some
    other mask (the causal one, or all-visible where that is the ancestor mask: a chain)."""
    from specaudit.trace.schema import ancestor_mask, mask_hash
    p = np.asarray(row["parents"], dtype=np.int64)
    n = len(p)
    ok = n >= 1 and p[0] == -1 and all(0 <= p[i] < i for i in range(1, n))
    anc = ancestor_mask(p[None])[0] if ok else np.eye(n, dtype=bool)
    if ok and int(mask_hash(anc)) == int(row["mask_hash"]):
        return anc
    other = np.tril(np.ones((n, n), dtype=bool))
    return np.ones((n, n), dtype=bool) if (other == anc).all() else other


def kernel_codes_flagged(run) -> set:
    """The run's step rows as an engine would feed the fused audit: one batch per (tensor
    width budget + 1, chain or not), nodes beyond the width cut off (n_nodes keeps the
    count, so N above the budget shows), the fed mask from the row's hash. The torch
    reference and the Triton kernel (interpreted on CPU) must give the same flags."""
    from specaudit.kernels.audit import audit_step, audit_step_ref, decode_flags, new_counters
    flag_codes = kernel_codes()
    groups: dict = {}
    for s in run.steps:
        groups.setdefault((int(s["budget"]) + 1, s["algo"] == "chain"), []).append(s)
    out = set()
    for (N, chain), rows in sorted(groups.items()):
        B = len(rows)
        node = {k: torch.zeros(B, N, dtype=torch.long) for k in ("node_tokens", "target_argmax", "positions")}
        parents = torch.full((B, N), -1, dtype=torch.long)
        mask = torch.zeros(B, N, N, dtype=torch.bool)
        for b, s in enumerate(rows):
            n = min(len(s["node_tokens"]), N)
            for k, t in node.items():
                t[b, :n] = torch.tensor(s[k][:n])
            parents[b, :n] = torch.tensor(s["parents"][:n])
            mask[b, :n, :n] = torch.from_numpy(_fed_mask(s)[:n, :n])
        def col(k, rows=rows):
            return torch.tensor([int(s[k]) for s in rows], dtype=torch.long)
        args = (node["node_tokens"], parents, torch.tensor([len(s["node_tokens"]) for s in rows]),
                node["target_argmax"], col("accepted_depth"), col("commit_len"),
                torch.tensor([bool(s["finished"]) for s in rows]))
        kw = dict(chain=chain, eos_id=run.eos_id, node_mask=mask, positions=node["positions"],
                  seq_len=col("seq_len"))
        ref = audit_step_ref(*args, new_counters("cpu"), **kw)
        tri = audit_step(*args, new_counters("cpu"), **kw)
        assert ref.flags.tolist() == tri.flags.tolist(), "the Triton kernel and its torch reference disagree"
        for names in decode_flags(ref.flags):
            for f in names:
                out.update(flag_codes[f])
    return out


def sql_codes(run) -> set:
    from specaudit.postmortem import views
    from specaudit.postmortem.sql_guard import fetch_arrow
    from specaudit.postmortem.view_sql import FIGURE_RULES
    with tempfile.TemporaryDirectory() as d:
        run.write(Path(d))
        con = views.connect([Path(d)])
        try:
            rows = fetch_arrow(con, "SELECT metric, verdict FROM figures").to_pylist()
        finally:
            con.close()
    return {FIGURE_RULES[r["metric"]] for r in rows if r["verdict"] == "disagrees" and r["metric"] in FIGURE_RULES}


ADAPTERS = {"oracle": oracle_codes, "prom": prom_codes, "kernel": kernel_codes_flagged, "sql": sql_codes}


@functools.cache
def flagged(home: str, code: str, kind: str) -> frozenset:
    """What `home` flags on rule `code`'s passing or failing fixture (computed once)."""
    run = _fixture(code, kind)
    return frozenset(ADAPTERS[home](run))


def _fixture(code: str, kind: str) -> FixtureRun:
    rule = RULES[code]
    run = FixtureRun.make(rule.fixture_algo)
    (rule.fail if kind == "fail" else rule.passing)(run)
    return run


@functools.cache
def catalog_flags(code: str, kind: str) -> frozenset:
    run = _fixture(code, kind)
    steps, requests = run.tables()
    return frozenset(check_tables(steps, requests, run.manifest, max_per_code=0).counts)


def _pairs():
    """(code, home) for every claim a home makes on a rule it can consume."""
    cl = claims()
    return [(c, h.name) for h in HOMES for c in sorted(cl[h.name])
            if c in RULES and RULES[c].scope in h.scopes and _has_fail(RULES[c])]


# --------------------------------------------------------------------- tests

def test_every_home_has_an_adapter():
    assert set(ADAPTERS) == set(HOME), "a home in invariants/homes.py without an adapter here"


@pytest.mark.parametrize("code,home", _pairs(), ids=lambda x: x)
def test_home_runs_the_catalog_fixtures(code, home):
    """The home flags the rule's failing fixture with the rule's code and, on the passing
    fixture, neither that code nor anything the catalog does not report."""
    bad = flagged(home, code, "fail")
    assert code in bad, (f"{home} ({HOME[home].path}) claims {code} but does not flag its failing "
                         f"fixture (it flags {sorted(bad)})\n{_matrix()}")
    ok = flagged(home, code, "pass")
    extra = ok - catalog_flags(code, "pass")
    assert code not in ok and not extra, (f"{home} flags {sorted(ok)} on {code}'s passing fixture, "
                                          f"the catalog {sorted(catalog_flags(code, 'pass'))}\n{_matrix()}")


def test_claims_are_catalog_rules_of_a_scope_the_home_consumes():
    problems = []
    for h in HOMES:
        for c in sorted(h.codes()):
            r = RULES.get(c)
            if r is None:
                problems.append(f"{h.name} ({h.path}, {h.declares}) claims {c}: no such catalog rule")
            elif r.scope not in h.scopes:
                problems.append(f"{h.name} claims {c}, a {r.scope} rule, but consumes only {h.scopes}")
            elif not _has_fail(r):
                problems.append(f"{h.name} claims {c}, which has no fail fixture to prove it")
    assert not problems, "\n".join(problems) + "\n" + _matrix()


def test_the_oracle_flags_only_what_it_declares():
    """Over the pass and fail fixtures of every rule in the oracle's scopes, every code it
    emits is in RULES_IMPLEMENTED. (The other homes report through their declarations:
    the sink's keys are INLINE_CODES, the kernel's flags map through kernel_codes, the
    figures view's metrics through FIGURE_RULES; tests/test_one_verdict.py and
    test_the_figures_view_has_every_declared_metric check those maps.)"""
    home = HOME["oracle"]
    problems = []
    for code, rule in RULES.items():
        if rule.scope not in home.scopes or not _has_fail(rule):
            continue
        for kind in ("pass", "fail"):
            out = flagged("oracle", code, kind) - home.codes()
            if out:
                problems.append(f"oracle flags {sorted(out)} (not in {home.declares}) on {code}'s {kind} fixture")
    assert not problems, "\n".join(problems) + "\n" + _matrix()


def test_the_figures_view_has_every_declared_metric():
    """FIGURE_RULES names metrics the view really has. (The sink's INLINE_CODES and the
    kernel's flags against the catalog's live rules: tests/test_one_verdict.py.)"""
    from specaudit.postmortem import views
    from specaudit.postmortem.sql_guard import fetch_arrow
    from specaudit.postmortem.view_sql import FIGURE_RULES
    with tempfile.TemporaryDirectory() as d:
        FixtureRun.make().write(Path(d))
        con = views.connect([Path(d)])
        metrics = {r["metric"] for r in fetch_arrow(con, "SELECT metric FROM figures").to_pylist()}
        con.close()
    assert set(FIGURE_RULES) <= metrics, sorted(set(FIGURE_RULES) - metrics)


def test_the_docs_show_the_current_matrix():
    """docs/rules/index.md holds the matrix as the homes declare it now: a new rule (or a
    new claim) makes it stale, and this message shows which homes lack the rule."""
    page = (REPO / "docs" / "rules" / "index.md").read_text()
    want = render_matrix(list(RULES.values()))
    assert want in page, f"docs/rules/index.md is stale: run python3 scripts/render_docs.py\n{_matrix()}"


def test_the_rule_guide_lists_every_home():
    """The guide for adding a rule (the catalog's docstring and the generated index) names
    every home's file."""
    import specaudit.invariants as inv
    guide = inv.__doc__.split("Every place a new rule touches", 1)[1]
    page = (REPO / "docs" / "rules" / "index.md").read_text()
    for h in HOMES:
        assert h.path in guide and h.path in page, h.path
        assert (REPO / h.path).exists(), h.path
