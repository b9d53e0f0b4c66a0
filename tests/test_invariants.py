"""The catalog itself: every rule unit is documented, registered once, and proves itself
on its own pass and fail fixtures; the registry loads user rules and entry points."""
from __future__ import annotations

import textwrap

import pytest
from specaudit.invariants import DEFINED, Rule, RuleError, all_rules, get_rule, load_rules
from specaudit.invariants.fixtures import FixtureRun

from specaudit.audit.check import check_paths
from specaudit.trace.safe_io import InputError

TRACE_RULES = [r for r in all_rules() if r.scope != "source"]


@pytest.fixture(autouse=True)
def restore_registry():
    """User rules loaded by a test must not leak into other tests' checks."""
    saved = dict(DEFINED)
    yield
    DEFINED.clear()
    DEFINED.update(saved)
FAMILIES = {"SA0", "SA1", "SA2", "SA3", "SA4", "SA5", "SA6", "SA7", "SA8"}


def test_catalog_covers_every_family_and_contract_rule_group():
    codes = {r.code for r in TRACE_RULES}
    assert {c[:3] for c in codes} >= {"SA0", "SA1", "SA2", "SA3", "SA4", "SA5", "SA6"}
    # the nine rule groups of the contract, by the rule that carries each
    for code in ("SA101", "SA104", "SA201", "SA202", "SA304", "SA301", "SA402", "SA407", "SA506"):
        assert code in codes


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_unit_is_documented(rule):
    assert rule.code[:3] in FAMILIES
    assert rule.name and rule.name == rule.name.lower() and " " not in rule.name
    assert rule.severity in ("error", "warning", "info")
    assert rule.scope in ("step", "request", "run", "source")
    doc = rule.doc()
    for part in ("What", "Why", "Example"):
        assert f"{part}:" in doc, f"{rule.code} docstring lacks {part}:"
    assert "{" in rule.message or rule.code in ("SA000",), "a message template shows the numbers"
    assert rule.summary() and len(rule.summary()) > 10


def test_codes_and_names_are_unique():
    rules = all_rules()
    assert len({r.code for r in rules}) == len(rules)
    assert len({r.name for r in rules}) == len(rules)


@pytest.mark.parametrize("rule", TRACE_RULES, ids=lambda r: r.code)
def test_rule_fixtures(rule, tmp_path):
    """The passing fixture reports no error at all; the failing one reports this code."""
    ok = FixtureRun.make(rule.fixture_algo)
    rule.passing(ok)
    res = check_paths([ok.write(tmp_path / "pass")])
    assert res.errors == 0, [f"{f.code} {f.message}" for f in res.findings]
    bad = FixtureRun.make(rule.fixture_algo)
    rule.fail(bad)
    res = check_paths([bad.write(tmp_path / "fail")])
    assert rule.code in res.counts, (rule.code, dict(res.counts))
    f = next(f for f in res.findings if f.code == rule.code)
    assert f.message and "{" not in f.message, f.message  # template fully formatted


def test_duplicate_code_is_refused():
    with pytest.raises(RuleError, match="defined twice"):
        class Again(Rule):
            """What: x. Why: y. Example: z."""
            code = "SA301"
            name = "again"
            message = "x"


def test_bad_rule_attributes_are_refused():
    with pytest.raises(RuleError, match="scope"):
        class BadScope(Rule):
            code = "SA998"
            name = "bad-scope"
            scope = "galaxy"
            message = "x"
    assert "SA998" not in DEFINED


USER_RULE = '''
import numpy as np
from specaudit.invariants import Hits, Rule

class ShortCommits(Rule):
    """What: a chain step commits at least 2 tokens (a user's own policy).

    Why: a team's drafter is expected to accept one draft at least.

    Example: commit_len 1 on a chain.
    """
    code = "{code}"
    name = "{name}"
    severity = "warning"
    scope = "step"
    message = "only {{commit_len}} token(s) committed"

    def check(self, f):
        return Hits(f.is_chain & (f.commit_len < 2) & ~f.finished, commit_len=f.commit_len)

    def fail(self, run):
        s = run.steps_where(lambda s: not s["finished"])[0]
        s["commit_len"] = 1
'''


def test_user_rules_from_a_folder(tmp_path):
    d = tmp_path / "my_rules"
    d.mkdir()
    (d / "short.py").write_text(USER_RULE.format(code="SA960", name="short-commits"))
    run = FixtureRun.make("chain", accept_p=0.3)
    res = check_paths([run.write(tmp_path / "t")], invariants_dirs=[d])
    assert "SA960" in res.rules
    assert res.counts.get("SA960", 0) > 0 and res.errors == 0   # a warning does not fail
    assert "only 1 token(s) committed" in next(f.message for f in res.findings if f.code == "SA960")
    assert get_rule("SA960").severity == "warning"


def test_user_rule_file_that_breaks_is_one_clear_error(tmp_path):
    d = tmp_path / "broken"
    d.mkdir()
    (d / "oops.py").write_text("import nonexistent_module_xyz\n")
    with pytest.raises(InputError, match="cannot import rule file"):
        load_rules(dirs=[d])
    (d / "oops.py").write_text(USER_RULE.format(code="SA301", name="dup"))
    with pytest.raises(InputError, match="defined twice"):
        load_rules(dirs=[d])


def test_entry_point_rules(monkeypatch, tmp_path):
    """A package exposing group `specaudit.invariants` adds rules without editing specaudit."""
    import importlib.metadata as md
    import sys
    pkg = tmp_path / "ep_rules_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(USER_RULE.format(code="SA961", name="ep-short-commits"))
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = md.EntryPoint(name="team", value="ep_rules_pkg", group="specaudit.invariants")

    def fake(**kw):
        return [ep] if kw.get("group") == "specaudit.invariants" else []
    monkeypatch.setattr(md, "entry_points", fake)
    codes = [r.code for r in load_rules(select=("SA96",))]
    assert "SA961" in codes
    sys.modules.pop("ep_rules_pkg", None)


def test_select_and_ignore_prefixes():
    codes = [r.code for r in load_rules(select=("SA3",), ignore=("SA31",), entry_points=False)]
    assert codes and all(c.startswith("SA3") and not c.startswith("SA31") for c in codes)
    assert [r.code for r in load_rules(select=("sa301",), entry_points=False)] == ["SA301"]


def test_message_template_of_the_seed_case(tmp_path):
    run = FixtureRun.make("chain")
    s = run.steps_where(lambda s: not s["finished"] and s["request_id"] == "1" and s["step"] == 2)[0]
    s["accepted_depth"], s["commit_len"] = 7, 2
    res = check_paths([run.write(tmp_path)], select=("SA301",))
    [f] = [f for f in res.findings if f.code == "SA301"]
    assert f.message == ("run fx-chain request 1 step 2: chain committed 2 tokens but accepted depth is 7 "
                         "(an unfinished step commits depth + 1 = 8)")
    assert (f.run_id, f.request_id, f.step) == ("fx-chain", "1", 2)
    assert f.values == {"algo": "chain", "commit_len": 2, "tokens": "tokens", "accepted_depth": 7,
                        "rule": "an unfinished step commits depth + 1 = 8"}


def test_rule_docs_render():
    r = get_rule("SA202")
    assert "ancestor-or-self" in r.doc() and r.family == "SA2"
    assert textwrap.dedent(r.doc()) == r.doc()


def test_docs_user_rule_example(tmp_path):
    """The user-rule example of docs/commands/check.md works as written (--invariants DIR)."""
    import re
    from pathlib import Path
    page = (Path(__file__).resolve().parents[1] / "docs" / "commands" / "check.md").read_text()
    block = re.search(r"```python\n(# my_rules/min_commit\.py\n.*?)```", page, re.S).group(1)
    d = tmp_path / "my_rules"
    d.mkdir()
    (d / "min_commit.py").write_text(block)
    run = FixtureRun.make("chain", accept_p=0.3)
    res = check_paths([run.write(tmp_path / "t")], invariants_dirs=[d], select=("SA950",))
    assert res.counts.get("SA950", 0) > 0 and res.exit_code == 0
    rule = get_rule("SA950")
    bad = FixtureRun.make("chain")
    rule.fail(bad)
    assert check_paths([bad.write(tmp_path / "f")], select=("SA950",)).counts["SA950"] >= 1
