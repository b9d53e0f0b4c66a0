"""The dashboard and the alert rules against a real Prometheus scraping real servers.

Two `specaudit serve` processes (one clean, one with --inject commit-counter) and one
Prometheus (Debian's package; scripts/test.sh installs it) on loopback with a temporary
data folder, scraping both every second and evaluating dashboards/alerts.yml every
second. After load: every target expression of every dashboard panel, with the
dashboard's variables substituted, must return data for the clean server; the
violation alert must fire for the faulty server and not for the clean one.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_procs import HTTP, Proc, start_prometheus  # noqa: E402  (tests/ on the path first)

REPO = Path(__file__).resolve().parents[1]
DASH = REPO / "dashboards"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
need_prometheus = pytest.mark.skipif(
    PROMETHEUS is None and not os.environ.get("CI"),
    reason="prometheus not installed (scripts/test.sh installs Debian's package)")


def start_server(trace_dir: Path, *extra) -> tuple[Proc, str]:
    p = Proc([sys.executable, "-m", "specaudit", "serve", "--port", "0", "--trace-dir", str(trace_dir),
              "--concurrency", "8", "--max-new-tokens", "96", "--flush-seconds", "1",
              "--baseline-tps", "40", "--cost-factor", "1.5", "--estimate-window", "10", *extra])
    m = p.wait_for(r"listening on http://(127\.0\.0\.1:\d+)", 120)
    return p, m.group(1)


def substitute(expr: str, job: str, instance: str) -> str:
    """Grafana's variables as Grafana would send them for one selected job and instance."""
    for k, v in (("${job}", job), ("$job", job), ("${instance}", instance), ("$instance", instance),
                 ("$__rate_interval", "1m"), ("$__interval", "15s"), ("$__range", "5m")):
        expr = expr.replace(k, v)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def panel_targets(dash: dict):
    for p in dash["panels"]:
        for sub in [p] + p.get("panels", []):
            for t in sub.get("targets", []):
                yield sub["title"], t["expr"]


def query(prom: str, expr: str) -> list:
    r = HTTP.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    return body["data"]["result"]


def test_rules_pass_promtool():
    if PROMTOOL is None and not os.environ.get("CI"):
        pytest.skip("promtool not installed (scripts/test.sh installs Debian's prometheus)")
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"],
                 ["check", "config", "prometheus.yml"]):
        r = subprocess.run([PROMTOOL, *args], cwd=DASH, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    assert "SUCCESS: 3 rules found" in subprocess.run([PROMTOOL, "check", "rules", "alerts.yml"], cwd=DASH,
                                                      capture_output=True, text=True).stdout


def test_dashboard_is_ready_for_provisioning():
    dash = json.loads((DASH / "specaudit.json").read_text())
    assert dash["uid"] == "specaudit-spec-decoding" and "id" not in dash
    names = {v["name"]: v for v in dash["templating"]["list"]}
    assert names["datasource"]["type"] == "datasource" and names["datasource"]["query"] == "prometheus"
    assert {"job", "instance"} <= set(names)
    titles = [p["title"] for p in dash["panels"]]
    for want in ("Tokens/s", "Verify steps/s", "Mean commit length", "Mean accepted depth",
                 "Acceptance rate by depth", "Commit length distribution", "Reported vs derived commit length",
                 "Invariant violations by code", "Step latency quantiles", "Running requests"):
        assert want in titles, want
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"
        for t in p["targets"]:
            assert 'job=~"$job"' in t["expr"] and 'instance=~"$instance"' in t["expr"], t["expr"]
    heat = next(p for p in dash["panels"] if p["type"] == "heatmap")
    assert heat["targets"][0]["format"] == "heatmap"
    prov = (DASH / "provisioning" / "dashboards" / "specaudit.yml").read_text()
    assert "type: file" in prov and "path:" in prov
    assert "type: prometheus" in (DASH / "provisioning" / "datasources" / "prometheus.yml").read_text()


@need_prometheus
def test_every_panel_has_data_and_the_violation_alert_fires(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from load import run_load
    finally:
        sys.path.remove(str(REPO / "scripts"))
    procs: list[Proc] = []
    try:
        clean, clean_addr = start_server(tmp_path / "traces")
        procs.append(clean)
        fault, fault_addr = start_server(tmp_path / "traces", "--inject", "commit-counter")
        procs.append(fault)
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(json.dumps({      # JSON is YAML
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": [str(DASH / "alerts.yml")],   # the real rules, unmodified
            "scrape_configs": [{"job_name": "specaudit",
                                "static_configs": [{"targets": [clean_addr, fault_addr]}]}]}))
        prom, url = start_prometheus(PROMETHEUS, cfg, tmp_path / "tsdb")
        procs.append(prom)

        # Prometheus sends its first targets ~5 s after start: wait until both are scraped,
        # so the counters' rise is on record (every series is exported as 0 from the start)
        end = time.time() + 30
        while time.time() < end and len(query(url, 'up{job="specaudit"} == 1')) < 2:
            time.sleep(0.25)
        assert len(query(url, 'up{job="specaudit"} == 1')) == 2, "targets never came up"
        zero = query(url, f'specaudit_invariant_violations_total{{instance="{fault_addr}"}}')
        assert len(zero) == 18  # every inline rule's series, there before any request

        async def drive():
            prompts = ["def f(x):\n", "for i in range(10):\n", "class A:\n    def __init__(self):\n", "import os\n"]
            return await asyncio.gather(*(run_load(f"http://{a}", concurrency=8, requests=24, duration=60,
                                                   max_tokens=48, prompts=prompts, stream=True)
                                          for a in (clean_addr, fault_addr)))
        loads = asyncio.run(drive())
        assert all(ld["errors"] == 0 and ld["ok"] == 24 for ld in loads), loads

        # the first scrape after the load (poll up to 15 s)
        end = time.time() + 15
        sel = f'specaudit_verify_steps_total{{instance="{clean_addr}"}}'
        while time.time() < end and not query(url, f"{sel} > 0"):
            time.sleep(0.5)
        assert query(url, f"{sel} > 0"), "Prometheus never scraped the load"
        time.sleep(2.5)  # a few more scrapes, so rates over the window have two samples after the load

        dash = json.loads((DASH / "specaudit.json").read_text())
        empty = []
        n = 0
        for title, expr in panel_targets(dash):
            q = substitute(expr, "specaudit", clean_addr)
            n += 1
            res = query(url, q)
            # data, and at least one real number (0/0 gaps, e.g. a depth never drafted, aside)
            if not res or not any(math.isfinite(float(r["value"][1])) for r in res):
                empty.append((title, q, res[:3]))
        assert n >= 15 and not empty, f"panels with no data: {empty}"
        # the variables' own queries list both servers
        for v in dash["templating"]["list"]:
            if v["type"] == "query":
                m = re.match(r"label_values\((.*),\s*(\w+)\)$", v["query"]["query"])
                r = HTTP.get(f"{url}/api/v1/label/{m.group(2)}/values",
                              params={"match[]": substitute(m.group(1), "specaudit", ".*")}, timeout=10).json()
                assert r["status"] == "success" and r["data"], v["name"]
                if m.group(2) == "instance":
                    assert {clean_addr, fault_addr} <= set(r["data"])
        # the live numbers make sense: the clean server's reported and derived counters
        # agree; the faulty one reports its drafted count (7 per step) as accepted depth
        val = lambda e: float(query(url, e)[0]["value"][1])
        per_step = ('sum(rate(specaudit_%s_total{instance="%s"}[1m]))'
                    ' / sum(rate(specaudit_verify_steps_total{instance="%s"}[1m]))')
        for what in ("accepted_tokens", "committed_tokens"):
            assert val(per_step % (what, clean_addr, clean_addr)) == pytest.approx(
                val(per_step % ("derived_" + what, clean_addr, clean_addr)))
        assert val(per_step % ("accepted_tokens", fault_addr, fault_addr)) == pytest.approx(7.0)
        assert val(per_step % ("derived_accepted_tokens", fault_addr, fault_addr)) < 6.5
        assert val(f'specaudit_estimated_commit_length{{instance="{clean_addr}"}}') > 0

        # the violation alert: firing for the faulty server, absent for the clean one
        end = time.time() + 30
        firing = []
        while time.time() < end:
            alerts = HTTP.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
            firing = [a for a in alerts if a["labels"]["alertname"] == "SpecauditInvariantViolation"
                      and a["state"] == "firing"]
            if firing:
                break
            time.sleep(0.5)
        assert firing, "SpecauditInvariantViolation never fired"
        assert {a["labels"]["instance"] for a in firing} == {fault_addr}
        assert {a["labels"]["code"] for a in firing} >= {"SA301", "SA302"}
        assert all(a["labels"]["severity"] == "critical" for a in firing)
        rules = HTTP.get(f"{url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        assert {r["name"] for g in rules for r in g["rules"]} == {
            "SpecauditInvariantViolation", "SpecauditCommitLengthMismatch", "SpecauditAcceptanceCollapse"}
        assert all(r["health"] == "ok" for g in rules for r in g["rules"]), rules
    finally:
        codes = [p.stop() for p in reversed(procs)]
    assert codes[-1] == 0 and codes[-2] == 0, "servers must exit cleanly on SIGTERM"
    # each server closed its trace with the reported counters
    manifests = [json.loads(p.read_text()) for p in sorted((tmp_path / "traces").glob("*/run.json"))]
    assert len(manifests) == 2 and all(m.get("finished_at") and m["reported"]["verify_steps"] > 0 for m in manifests)
