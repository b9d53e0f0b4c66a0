"""Real engines' series through a real Prometheus: dashboards, alerts, check --prometheus.

One replay exporter (tests/prom_replay.py: prometheus-client families serving every case
of tests/fixtures/prometheus/replay_cases.json at /metrics/<case>, one frame per 1.5 s,
the phases shortened to 30%) and one Prometheus (Debian's package; scripts/test.sh
installs it) for this module, on loopback with a temporary data folder, scraping
every second and evaluating dashboards/engines_rules.yml and engines_alerts.yml as
rendered with second-scale windows (the same expressions; the committed files use 5m).

Checks: every panel query of dashboards/engines.json returns data; every alert fires on
its broken case and never on a clean one; `specaudit check --prometheus` finds the same
codes as `specaudit check` on the same frames written as Prometheus text.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import prom_replay  # noqa: E402  (tests/ put on sys.path first)
from live_procs import HTTP, start_prometheus  # noqa: E402  (after the sys.path / importorskip set-up above)

from dashboards import engines as E  # noqa: E402  (after the sys.path / importorskip set-up above)

PROMETHEUS = shutil.which("prometheus")
# slow: a minute of replayed frames under a real Prometheus; light: that minute is spent waiting
# on the replay's clock (about a tenth of one core: the exporter thread, Prometheus, the poller),
# so under xdist it runs beside the alone tests (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.light,
              pytest.mark.skipif(PROMETHEUS is None and not os.environ.get("CI"),
                                 reason="prometheus not installed (scripts/test.sh installs Debian's package)")]
DT = 1.5          # seconds per replayed frame
SCALE = 0.3       # phases 30% as long as in the promtool tests
END = 34          # frames replayed before the alerts are judged (every phase and the reset seen)
TIMING = E.Timing(window="8s", baseline="15s", for_impossible="2s", for_warning="3s", for_gauge="3s")


def query(prom: str, expr: str, **params) -> list:
    r = HTTP.get(f"{prom}/api/v1/query", params={"query": expr, **params}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    return body["data"]["result"]


class Live:
    """The exporter, Prometheus, and what the alert poller saw."""

    def __init__(self, tmp: Path):
        self.cases = {n: prom_replay.scaled(c, SCALE) for n, c in prom_replay.CASES.items()}
        self.exporter = prom_replay.Exporter(self.cases, dt=DT).start()
        E.render(tmp / "rules", TIMING)
        cfg = tmp / "prometheus.yml"
        cfg.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": [str(tmp / "rules" / "engines_rules.yml"), str(tmp / "rules" / "engines_alerts.yml")],
            "scrape_configs": [{"job_name": n, "metrics_path": f"/metrics/{n}",
                                "static_configs": [{"targets": [f"127.0.0.1:{self.exporter.port}"]}]}
                               for n in self.cases]}))
        try:
            self.prom, self.url = start_prometheus(PROMETHEUS, cfg, tmp / "tsdb")
        except BaseException:   # (start_prometheus stopped its own process)
            self.exporter.stop()
            raise
        self.fired: dict = {}     # (job, alertname) -> labels, for every alert seen firing
        self.stop = threading.Event()
        self.poller = threading.Thread(target=self._poll, daemon=True)
        self.poller.start()

    def _poll(self):
        while not self.stop.is_set():
            try:
                alerts = HTTP.get(f"{self.url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
                for a in alerts:
                    if a["state"] == "firing":
                        self.fired.setdefault((a["labels"]["job"], a["labels"]["alertname"]), a["labels"])
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            self.stop.wait(0.5)

    def wait_frame(self, n: int):
        while self.exporter.frame() < n:
            time.sleep(0.2)

    def close(self):
        self.stop.set()
        code = self.prom.stop()
        self.exporter.stop()
        return code


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """One exporter and one Prometheus for all the tests here, stopped after them (so it
    never runs beside test_prometheus_live's)."""
    lv = Live(tmp_path_factory.mktemp("engines-live"))
    yield lv
    assert lv.close() == 0


def test_every_alert_fires_on_its_broken_replay_and_never_on_a_clean_one(live):
    live.wait_frame(END)
    time.sleep(4)   # the last frames' alerts (for: 3s) and one more poll
    got = {}
    for (job, name) in live.fired:
        got.setdefault(job, set()).add(name)
    wrong = {n: (sorted(got.get(n, ())), sorted(c["expect_alerts"])) for n, c in live.cases.items()
             if got.get(n, set()) != set(c["expect_alerts"])}
    assert not wrong, f"case: (fired, expected): {wrong}"
    for (job, name), labels in live.fired.items():
        a = next(a for a in E.ALERTS if a.name == name)
        assert labels["code"] == a.code and labels["severity"] == a.severity
        assert labels["engine"] == live.cases[job]["engine"]


def substitute(expr: str) -> str:
    """Grafana's variables with every value selected."""
    for k in ("job", "instance", "engine", "model", "rank"):
        expr = expr.replace(f'=~"${k}"', '=~".*"')
    assert "$" not in expr, expr
    return expr


def test_every_dashboard_query_returns_data(live):
    live.wait_frame(END)
    dash = json.loads((REPO / "dashboards" / "engines.json").read_text())
    empty, n = [], 0
    for p in dash["panels"]:
        for t in p["targets"]:
            n += 1
            res = query(live.url, substitute(t["expr"]))
            if not res or not any(math.isfinite(float(r["value"][1])) for r in res):
                empty.append((p["title"], t["expr"][:80]))
    assert n >= 12 and not empty, f"no data: {empty}"
    # every engine reaches the panels under the specaudit: names
    engines = {r["metric"]["engine"] for r in query(live.url, "specaudit:accept_length")}
    assert engines == set(E.ENGINES)
    # the selectors' own queries list every engine
    for v in dash["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.match(r"label_values\((.*),\s*(\w+)\)$", v["query"]["query"])
        r = HTTP.get(f"{live.url}/api/v1/label/{m.group(2)}/values",
                      params={"match[]": substitute(m.group(1))}, timeout=10).json()
        assert r["status"] == "success" and r["data"], v["name"]
        if v["name"] == "engine":
            assert set(r["data"]) == set(E.ENGINES)
    # live figures agree with the facts: vllm_clean replays vLLM PR #56633's counters (106 verify
    # steps, 92 + 64 + 48 accepted per position) each interval
    L = float(query(live.url, 'specaudit:accept_length{job="vllm_clean"}')[0]["value"][1])
    assert L == pytest.approx(1 + 204 / 106, rel=0.01)
    pos = {r["metric"]["position"]: float(r["value"][1])
           for r in query(live.url, 'specaudit:accept_rate_by_position{job="vllm_clean"}')}
    assert pos == pytest.approx({"0": 92 / 106, "1": 64 / 106, "2": 48 / 106}, rel=0.01)


def _frames_seen(live, job: str, series: str) -> list[int]:
    res = query(live.url, f'{series}{{job="{job}"}}[10m]')
    ts = [float(t) for t, _ in res[0]["values"]]
    return [round((t - live.exporter.t0) / DT) for t in ts]


def test_check_prometheus_finds_what_check_finds_on_the_same_text(live, tmp_path):
    from specaudit.audit.sources import audit_file
    from specaudit.audit.sources.prom_http import audit_prometheus, read_prometheus
    live.wait_frame(END)
    key = {"vllm": "vllm:spec_decode_num_drafts_total", "sglang": "sglang:spec_accept_length",
           "trtllm": "trtllm_spec_decode_num_draft_tokens_total", "llamacpp": "llamacpp:spec_decode_num_drafts_total"}
    end = time.time() - 3   # every sample stamped before this is stored by now
    compared = 0
    for name, case in live.cases.items():
        found, readings = audit_prometheus(live.url, match=[f'{{job="{name}"}}'], range_s=600, step_s=0, end=end)
        frames = [f for f in _frames_seen(live, name, key[case["engine"]])
                  if live.exporter.t0 + f * DT <= end]
        # a scrape that timed out on a loaded machine loses a frame: both sides then see the
        # same longer interval, so the comparison below holds for any frames seen; more than half
        # of them and at least 20 keep it from being vacuous (a fresh CI machine, load 6 on 2
        # cores while vLLM's venv was still settling, saw 27 of 34)
        assert len(frames) > 0.5 * (frames[-1] - frames[0] + 1) and len(frames) >= 20, (name, frames)
        text = "".join(f"# scraped_at: {live.exporter.t0 + i * DT:.3f}\n" + prom_replay.exposition(case, i)
                       for i in frames)
        path = tmp_path / f"{name}.prom"
        path.write_text(text)
        want = sorted({f.code for f in audit_file(path)})
        got = sorted({f.code for f in found})
        assert got == want, f"{name}: --prometheus {got} vs text {want}"
        assert set(case["expect_codes"]) <= set(got), (name, got)
        if case["engine"] != "sglang":
            assert sum(len(r.windows) for r in readings) == len(frames) - 1, (name, frames)
        compared += 1
    assert compared == len(live.cases)
    with pytest.raises(Exception) as e:
        read_prometheus(live.url, match=['{job="no-such-job"}'], range_s=600)
    assert "no speculative-decoding series" in str(e.value)


def test_check_prometheus_cli_exit_codes(live):
    live.wait_frame(END)

    def cli(*a):
        return subprocess.run([sys.executable, "-m", "specaudit", "check", "--prometheus", live.url, *a],
                              capture_output=True, text=True, timeout=180)
    r = cli("--range", "10m", "--step", "0", "--match", '{job="vllm_clean"}', "--match", '{job="llamacpp_clean"}')
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checked 2 Prometheus series groups, " in r.stdout
    r = cli("--range", "10m", "--step", "0", "--match", '{job="vllm_accepted_over_drafted"}',
            "--output-format", "sarif")
    assert r.returncode == 1, r.stderr
    assert "SA702" in r.stdout and json.loads(r.stdout)["version"] == "2.1.0"
    r = cli("--range", "10m", "--match", '{job="no-such-job"}')
    assert r.returncode == 2 and "no speculative-decoding series" in r.stderr and "Traceback" not in r.stderr
