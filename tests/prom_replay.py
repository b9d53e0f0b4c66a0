"""Replay real engines' spec-decoding series over time (a test helper, not a test).

The facts are in tests/fixtures/prometheus/replay_cases.json: per case, an engine, its
labels, and the counts one stats interval adds (verify steps, accepted drafts per
position, ...). From them this module renders, for frame i (i intervals after start):

    families(case, i)        the engine's metric families (prometheus_client objects)
    exposition(case, i, t)   the Prometheus text an engine's /metrics would serve
    text_scrapes(case, n)    frames 0..n-1 appended as one scrape file (`specaudit check`)
    promtool_series(case, n) input_series for `promtool test rules`
    Exporter                 an HTTP server serving every case at /metrics/<case>, one frame
                             per `dt` seconds, each sample stamped with its frame's time

Counters start at 0 (frame 0) and grow by each frame's counts; a case with `reset_at`
restarts them from 0 there. The last phase repeats forever, so rates stay steady.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

FACTS = Path(__file__).resolve().parent / "fixtures" / "prometheus" / "replay_cases.json"


CORPUS = Path(__file__).resolve().parent / "fixtures" / "engines" / "corpus"


def from_corpus(case: dict) -> dict:
    """A case whose phase takes its counts from a real-engines corpus entry
    ({"corpus": {"id": ..., "scale": n}}): that output's counts, times n, per interval."""
    ref = case.get("corpus")
    if not ref:
        return case
    entries = json.loads((CORPUS / f"{case['engine']}.json").read_text())
    entries = entries if isinstance(entries, list) else entries.get("cases", [])
    e = next(x for x in entries if x["id"] == ref["id"])
    f, n = e["facts"], ref.get("scale", 1)
    ph = case["phases"][0]
    if "series" in f:                                   # vLLM counters
        sr = f["series"]
        ph.update(drafts=sr["drafts"] * n, draft_tokens_per_step=sr["draft_tokens"] / sr["drafts"],
                  accepted_per_pos=[c * n for c in sr["per_pos"]])
    else:                                               # TensorRT-LLM per-position counters
        dp, ap = f["per_pos_drafted"], f["per_pos_accepted"]
        ph.update(drafts=dp[0] * n, drafted_per_pos=[c * n for c in dp], accepted_per_pos=[c * n for c in ap],
                  draft_tokens_per_step=sum(dp) / dp[0])
    case["source"] = f"{e['url']} ({e['id']}, {e.get('date', '')}): {e['reason']}" + (
        f"; x{n} per replayed interval" if n != 1 else "") + (f"; {case['source']}" if case.get("source") else "")
    return case


def load():
    """-> (cases by name, jitter cycle)."""
    d = json.loads(FACTS.read_text())
    return {c["name"]: from_corpus(c) for c in d["cases"]}, d["jitter"]


CASES, JITTER = load()


def _phase(case, j):
    n = 0
    for ph in case["phases"]:
        n += ph["frames"]
        if j < n:
            return ph
    return case["phases"][-1]


def interval(case, j) -> dict:
    """The counts frame j adds (j >= 1) and the gauges it shows."""
    ph = _phase(case, j)
    f = JITTER[j % len(JITTER)]
    k = case["k"]
    drafts = round(ph["drafts"] * f)
    per_pos = [round(c * f) for c in ph.get("accepted_per_pos", [])]
    drafted_pos = [round(c * f) for c in ph["drafted_per_pos"]] if "drafted_per_pos" in ph else [drafts] * len(per_pos)
    accepted = round(ph["accepted"] * f) if "accepted" in ph else sum(per_pos)
    drafted = round(ph["draft_tokens_per_step"] * drafts) if "draft_tokens_per_step" in ph else drafts * k
    return {"drafts": drafts, "draft_tokens": drafted, "accepted": accepted, "per_pos": per_pos,
            "drafted_per_pos": drafted_pos, "generated": drafts + accepted,
            "accept_length": ph.get("printed_accept_length", 1 + accepted / drafts if drafts else 0.0),
            "accept_rate": ph.get("printed_accept_rate", accepted / (drafts * k) if drafts else 0.0),
            "running": ph["running"]}


def cumulative(case, i) -> dict:
    """Counter values at frame i, and frame i's gauges."""
    start = case.get("reset_at", 0) if i >= case.get("reset_at", 10**9) else 0
    tot = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "generated": 0}
    pos = [0] * len(case["phases"][0].get("accepted_per_pos", []))
    dpos = list(pos)
    for j in range(start + 1, i + 1):
        iv = interval(case, j)
        for key in tot:
            tot[key] += iv[key]
        pos = [a + b for a, b in zip(pos, iv["per_pos"])]
        dpos = [a + b for a, b in zip(dpos, iv["drafted_per_pos"])]
    g = interval(case, max(i, 1))
    return {**tot, "per_pos": pos, "drafted_per_pos": dpos, "accept_length": g["accept_length"],
            "accept_rate": g["accept_rate"], "running": g["running"],
            "gen_tps": g["generated"] / case.get("dt", 15.0)}


def families(case, i, t=None) -> list:
    """The engine's metric families at frame i (timestamp t in seconds, when given)."""
    v = cumulative(case, i)
    labels = dict(case["labels"])
    out = []

    def counter(name, value, extra=None):
        lab = {**labels, **(extra or {})}
        fam = next((f for f in out if f.name == name), None)
        if fam is None:
            fam = CounterMetricFamily(name, f"{name} (replayed)", labels=list(lab))
            out.append(fam)
        fam.add_metric([lab[k] for k in fam._labelnames], value, timestamp=t)

    def gauge(name, value):
        fam = GaugeMetricFamily(name, f"{name} (replayed)", labels=list(labels))
        fam.add_metric(list(labels.values()), value, timestamp=t)
        out.append(fam)

    e = case["engine"]
    if e == "vllm":
        counter("vllm:spec_decode_num_drafts", v["drafts"])
        counter("vllm:spec_decode_num_draft_tokens", v["draft_tokens"])
        counter("vllm:spec_decode_num_accepted_tokens", v["accepted"])
        for p, c in enumerate(v["per_pos"]):
            counter("vllm:spec_decode_num_accepted_tokens_per_pos", c, {"position": str(p)})
        counter("vllm:generation_tokens", v["generated"])
        gauge("vllm:num_requests_running", v["running"])
    elif e == "sglang":
        counter("sglang:spec_verify_calls", v["drafts"])
        counter("sglang:generation_tokens", v["generated"])
        gauge("sglang:spec_accept_length", round(v["accept_length"], 2))
        gauge("sglang:spec_accept_rate", round(v["accept_rate"], 2))
        gauge("sglang:gen_throughput", round(v["gen_tps"], 2))
        gauge("sglang:num_running_reqs", v["running"])
    elif e == "trtllm":
        counter("trtllm_spec_decode_num_draft_tokens", v["draft_tokens"])
        counter("trtllm_spec_decode_num_accepted_tokens", v["accepted"])
        for p, (a, d) in enumerate(zip(v["per_pos"], v["drafted_per_pos"])):
            counter("trtllm_spec_decode_accepted_tokens", a, {"token_position": str(p)})
            counter("trtllm_spec_decode_drafted_tokens", d, {"token_position": str(p)})
        gauge("trtllm_spec_decode_acceptance_length", round(v["accept_length"], 4))
    elif e == "llamacpp":
        counter("llamacpp:spec_decode_num_drafts", v["drafts"])
        counter("llamacpp:spec_decode_num_draft_tokens", v["draft_tokens"])
        counter("llamacpp:spec_decode_num_accepted_tokens", v["accepted"])
        for p, c in enumerate(v["per_pos"]):
            counter("llamacpp:spec_decode_num_accepted_tokens_per_pos", c, {"position": str(p)})
        counter("llamacpp:tokens_predicted", v["generated"])
        gauge("llamacpp:requests_processing", v["running"])
    else:
        raise ValueError(f"unknown engine {e}")
    return out


class _Frame:
    def __init__(self, fams):
        self.fams = fams

    def collect(self):
        return self.fams


def exposition(case, i, t=None) -> str:
    reg = CollectorRegistry()
    reg.register(_Frame(families(case, i, t)))
    return generate_latest(reg).decode()


def text_scrapes(case, n, t0=1_700_000_000.0, dt=15.0) -> str:
    """Frames 0..n-1 as one file of appended scrapes (`# scraped_at:` before each)."""
    return "".join(f"# scraped_at: {t0 + i * dt:.3f}\n" + exposition(case, i) for i in range(n))


def promtool_series(case, n, instance="replay") -> list[dict]:
    """promtool input_series: every sample of frames 0..n-1, one value per interval."""
    series: dict[str, list] = {}
    for i in range(n):
        for fam in families(case, i):
            for s in fam.samples:
                lab = {"job": case["name"], "instance": instance, **s.labels}
                key = s.name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(lab.items())) + "}"
                series.setdefault(key, []).append(s.value)
    return [{"series": k, "values": " ".join(f"{x:g}" for x in vs)} for k, vs in series.items()]


class Exporter:
    """Serves /metrics/<case> for every case; frame = seconds since start // dt, each sample
    stamped with its frame's start time (so Prometheus stores each frame once)."""

    def __init__(self, cases=None, dt=1.5, port=0):
        self.cases = cases or CASES
        self.dt = dt
        self.t0 = time.time()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                name = self.path.rsplit("/", 1)[-1]
                case = outer.cases.get(name)
                if case is None:
                    self.send_error(404)
                    return
                i = outer.frame()
                body = exposition(case, i, t=outer.t0 + i * outer.dt).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # Prometheus gave up on a slow scrape (a loaded machine); the next one counts

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def frame(self) -> int:
        return int((time.time() - self.t0) / self.dt)

    def start(self):
        self.t0 = time.time()
        self.thread.start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


# ---- promtool unit tests of dashboards/engines_alerts.yml ---------------------------------

PROMTOOL_FRAMES = 100       # one frame per minute: 100 minutes of each case
PROMTOOL_EVAL = "93m"       # after every phase (the reset at frame 90 is still in the window)
# labels an alert carries beyond job/instance/engine/model/rank, severity and code
ALERT_EXTRA = {("vllm_accepted_over_drafted", "SpecauditAcceptLengthAboveMax"): {"figure": "counters"},
               ("trtllm_accept_length_above_max", "SpecauditAcceptLengthAboveMax"): {"figure": "gauge"},
               ("vllm_position_increasing", "SpecauditPositionRateIncreasing"): {"position": "1"},
               ("trtllm_position_accepted_over_drafted", "SpecauditAcceptedAboveDrafted"): {
                   "position": "0", "denominator": "drafted_at_position"}}


def expand(template: str, labels: dict) -> str:
    """The alert templates' two constructs, as Prometheus renders them: {{ $labels.x }} and
    {{ with $labels.x }}...{{ . }}...{{ end }} (skipped when the label is absent)."""
    import re

    def with_(m):
        v = labels.get(m.group(1), "")
        return m.group(2).replace("{{ . }}", v) if v else ""
    s = re.sub(r"\{\{ with \$labels\.(\w+) \}\}(.*?)\{\{ end \}\}", with_, template)
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), "<no value>"), s)


def alerts_test_doc() -> dict:
    """`promtool test rules` input: every case replayed at one frame per minute; every alert
    evaluated on every case, expected to fire exactly where the case says."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dashboards.engines import ALERTS, alert_rules
    by_name = {a.name: a for a in ALERTS}
    annotations = {r["alert"]: r["annotations"] for g in alert_rules()["groups"] for r in g["rules"]}
    tests = []
    for name, c in CASES.items():
        base = {"job": name, "instance": "replay", "engine": c["engine"]}
        if c["labels"].get("model_name"):
            base["model"] = c["labels"]["model_name"]
        if c["engine"] == "vllm":
            base["rank"] = c["labels"]["engine"]
        checks = []
        for a in ALERTS:
            exp = []
            if a.name in c["expect_alerts"]:
                lab = {**base, "severity": by_name[a.name].severity, "code": by_name[a.name].code,
                       **ALERT_EXTRA.get((name, a.name), {})}
                exp.append({"exp_labels": lab, "exp_annotations": {
                    k: expand(v, lab) for k, v in annotations[a.name].items()}})
            checks.append({"eval_time": PROMTOOL_EVAL, "alertname": a.name, "exp_alerts": exp})
        tests.append({"name": name, "interval": "1m", "input_series": promtool_series(c, PROMTOOL_FRAMES),
                      "alert_rule_test": checks})
    return {"rule_files": ["engines_rules.yml", "engines_alerts.yml"], "evaluation_interval": "1m", "tests": tests}


ALERTS_TEST_HEADER = ("# Generated by `python3 tests/prom_replay.py` from "
                      "tests/fixtures/prometheus/replay_cases.json;\n"
                      "# do not edit. Run: promtool test rules engines_alerts_test.yml\n")


def alerts_test_text() -> str:
    import yaml
    return ALERTS_TEST_HEADER + yaml.safe_dump(alerts_test_doc(), sort_keys=False, width=100_000)


def scaled(case, factor: float) -> dict:
    """The case with its phases (and reset) `factor` times as long, for a faster live replay."""
    c = json.loads(json.dumps(case))
    for ph in c["phases"]:
        ph["frames"] = max(1, round(ph["frames"] * factor))
    if "reset_at" in c:
        c["reset_at"] = max(2, round(c["reset_at"] * factor))
    return c


if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "dashboards" / "engines_alerts_test.yml"
    out.write_text(alerts_test_text())
    print(out)
