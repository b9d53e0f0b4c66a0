"""The real-engines rules, alerts and dashboard (dashboards/engines*), without a server.

The committed files are what dashboards/engines.py renders; `promtool` accepts them and
passes their unit tests (every alert fires on its broken replay and stays silent on every
clean one, series from tests/fixtures/prometheus/replay_cases.json); gauges are never
rated and counters always are; every alert names a catalog code and its runbook; the
dashboard is ready for Grafana provisioning; `specaudit dashboards --out DIR` writes a
working bundle.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DASH = REPO / "dashboards"
sys.path.insert(0, str(REPO / "tests"))
import prom_replay  # noqa: E402  (tests/ put on sys.path first)

from dashboards import engines as E  # noqa: E402  (after the sys.path / importorskip set-up above)

PROMTOOL = shutil.which("promtool")
need_promtool = pytest.mark.skipif(PROMTOOL is None and not os.environ.get("CI"),
                                   reason="promtool not installed (scripts/test.sh installs Debian's prometheus)")


def test_committed_files_are_the_rendered_ones(tmp_path):
    E.render(tmp_path)
    for name in ("engines_rules.yml", "engines_alerts.yml", "engines.json", "prometheus_engines.yml"):
        assert (tmp_path / name).read_text() == (DASH / name).read_text(), \
            f"{name} is stale: run python3 -m specaudit.dashboards.engines"
    assert prom_replay.alerts_test_text() == (DASH / "engines_alerts_test.yml").read_text(), \
        "engines_alerts_test.yml is stale: run python3 tests/prom_replay.py"


@need_promtool
def test_promtool_accepts_the_rules_and_passes_their_unit_tests():
    for args in (["check", "rules", "engines_rules.yml", "engines_alerts.yml"],
                 ["check", "config", "prometheus_engines.yml"],
                 ["test", "rules", "engines_alerts_test.yml"]):
        r = subprocess.run([PROMTOOL, *args], cwd=DASH, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (args, r.stdout[-3000:], r.stderr[-3000:])
    out = subprocess.run([PROMTOOL, "check", "rules", "engines_alerts.yml"], cwd=DASH, capture_output=True,
                         text=True).stdout
    assert f"SUCCESS: {len(E.ALERTS)} rules found" in out


def test_unit_tests_cover_every_alert_both_ways():
    """Each alert fires on at least one broken case and every engine has a clean case on
    which nothing fires (the promtool file asserts exactly these expectations)."""
    doc = yaml.safe_load((DASH / "engines_alerts_test.yml").read_text())
    fired = {a.name: [] for a in E.ALERTS}
    silent_engines = set()
    for t in doc["tests"]:
        case = prom_replay.CASES[t["name"]]
        checks = {c["alertname"]: c["exp_alerts"] for c in t["alert_rule_test"]}
        assert set(checks) == set(fired), t["name"]
        for name, exp in checks.items():
            if exp:
                fired[name].append(t["name"])
        if not any(checks.values()):
            assert not case["expect_alerts"]
            silent_engines.add(case["engine"])
    assert all(fired.values()), {k: v for k, v in fired.items() if not v}
    assert silent_engines == set(E.ENGINES)


def _raw_uses(expr: str, series: str) -> list[str]:
    """The function (or '') directly around each use of a raw series in an expression."""
    out = []
    for m in re.finditer(re.escape(series) + r"(\{[^}]*\})?(\[[^\]]+\])?", expr):
        head = expr[:m.start()]
        f = re.search(r"(\w+)\($", head)
        out.append(f.group(1) if f else "")
    return out


def test_gauges_are_never_rated_and_counters_always_are():
    rules = [r for g in E.recording_rules()["groups"] for r in g["rules"]]
    seen = set()
    for e in E.ENGINES.values():
        for series in e.gauges.values():
            for r in rules:
                for f in _raw_uses(r["expr"], series):
                    seen.add(series)
                    assert f not in ("rate", "irate", "increase", "resets", "delta", "deriv"), (series, r["expr"])
        counters = list(e.counters.values()) + [s for s, _ in e.by_position.values()]
        for series in counters:
            for r in rules:
                for f in _raw_uses(r["expr"], series):
                    seen.add(series)
                    assert f in ("rate", "resets"), (series, f, r["expr"])
    every = {s for e in E.ENGINES.values() for s in list(e.counters.values()) + list(e.gauges.values())
             + [s for s, _ in e.by_position.values()]}
    assert seen == every, every - seen
    # the reported gauges are only averaged over time in the derived rules
    derived = [r for r in E.recording_rules()["groups"][1]["rules"]]
    for r in derived:
        assert not re.search(r"(rate|increase|resets)\(specaudit:\w+:reported", r["expr"]), r


def test_every_alert_names_its_catalog_rule_and_runbook():
    from specaudit.invariants import get_rule, load_rules
    load_rules(entry_points=False)
    doc = E.alert_rules()
    for r in doc["groups"][0]["rules"]:
        code = r["labels"]["code"]
        rule = get_rule(code)
        assert rule is not None and rule.scope == "source", code
        assert r["annotations"]["summary"].startswith(f"[{code}] ")
        assert r["annotations"]["runbook"] == f"specaudit rules {code}"
        assert r["labels"]["severity"] in ("critical", "warning", "info")
        assert "$value" not in json.dumps(r["annotations"])
    # the runbook command works
    code = doc["groups"][0]["rules"][0]["labels"]["code"]
    out = subprocess.run([sys.executable, "-m", "specaudit", "rules", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and code in out.stdout


def test_dashboard_is_ready_for_provisioning():
    dash = json.loads((DASH / "engines.json").read_text())
    assert dash["uid"] == "specaudit-engines" and "id" not in dash
    names = {v["name"]: v for v in dash["templating"]["list"]}
    assert names["datasource"]["type"] == "datasource"
    assert {"job", "instance", "engine", "model", "rank"} <= set(names)
    titles = {p["title"] for p in dash["panels"]}
    assert {"Accept length", "Accept rate", "Per-position acceptance", "Drafted vs accepted tokens/s",
            "Identities (0 on an honest engine)", "Active alerts"} <= titles
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"
        for t in p["targets"]:
            for var in ("$engine", "$model", "$rank", "$job", "$instance"):
                assert var in t["expr"], (p["title"], t["expr"])


def test_dashboards_command_writes_a_working_bundle(tmp_path):
    from specaudit.dashboards import BUNDLE
    out = tmp_path / "mon"
    r = subprocess.run([sys.executable, "-m", "specaudit", "dashboards", "--out", str(out)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in BUNDLE:
        assert (out / name).is_file(), name
    assert f"path: {out.resolve()}" in (out / "provisioning/dashboards/specaudit.yml").read_text()
    assert (out / "engines_rules.yml").read_text() == (DASH / "engines_rules.yml").read_text()
    # an edited file is not replaced without --force; nothing else is touched
    (out / "alerts.yml").write_text("# mine\n")
    r = subprocess.run([sys.executable, "-m", "specaudit", "dashboards", "--out", str(out)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "alerts.yml" in r.stderr and "--force" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert (out / "alerts.yml").read_text() == "# mine\n"
    r = subprocess.run([sys.executable, "-m", "specaudit", "dashboards", "--out", str(out), "--force"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and (out / "alerts.yml").read_text() == (DASH / "alerts.yml").read_text()
    assert not [p for p in out.rglob(".*") if p.is_file()], "temporary files left behind"
    f = tmp_path / "file"
    f.write_text("x")
    r = subprocess.run([sys.executable, "-m", "specaudit", "dashboards", "--out", str(f)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "not a folder" in r.stderr and "Traceback" not in r.stderr
    if PROMTOOL:
        r = subprocess.run([PROMTOOL, "check", "config", "prometheus_engines.yml"], cwd=out, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
