"""Recording rules, alert rules and a Grafana dashboard for real engines' own metrics.

One table (ENGINES) says which series each engine exports; everything else is rendered
from it, so the four engines get the same `specaudit:` series and the same alerts:

    python3 -m specaudit.dashboards.engines        # rewrite the committed files below

    engines_rules.yml       recording rules: one set of specaudit: series per engine/model/rank
    engines_alerts.yml      alert rules on those series (impossibilities and collapses)
    engines.json            the Grafana dashboard (uid specaudit-engines)
    prometheus_engines.yml  a scrape config example loading both rule files

Words used below:
    engine     vllm | sglang | trtllm | llamacpp (the label `engine` of every specaudit:
               series; vLLM's own `engine` label, its data-parallel index, becomes `rank`)
    model      the engine's `model_name` label
    rank       vLLM `engine`, SGLang `dp_rank` (SGLang tp/pp ranks > 0 repeat rank 0's
               figures and are left out); "" when the engine has one
    window     the range of every rate(): 5m in the committed files (tests render shorter)
    counter    a monotonic series: only ever used through rate()/resets()
    gauge      SGLang's accept length/rate and TensorRT-LLM's acceptance length: a value
               over the engine's last log or iteration window; never rated or differenced,
               only averaged over time
    residual   an identity written as (left - right) / scale: 0 on an honest engine,
               > 0 (or != 0) where the identity breaks

Series (labels job, instance, engine, model, rank; `position` where named):
    specaudit:verify_steps:rate, :drafted_tokens:rate, :accepted_tokens:rate (bonus
    excluded), :generated_tokens:rate, :accepted_tokens_by_position:rate{position},
    :drafted_tokens_by_position:rate{position} (TensorRT-LLM), :counter_resets:count
    specaudit:accept_length:reported, :accept_rate:reported      gauges as printed
    specaudit:accept_rate          accepted / drafted (counters)
    specaudit:accept_length        1 + accepted / verify steps (vLLM, llama.cpp);
                                   1 + sum(accepted by position) / drafted at position 0
                                   (TensorRT-LLM); generated / verify calls (SGLang)
    specaudit:draft_positions      positions exported (k)
    specaudit:accept_rate_by_position{position, denominator}
    specaudit:identity:accepted_minus_drafted       (accepted - drafted) / drafted       > 0 impossible
    specaudit:identity:accept_length_excess{figure} accept length - (k + 1)              > 0 impossible
    specaudit:identity:position_increase{position}  (a[p] - a[p-1]) / a[0]               > 0 impossible
    specaudit:identity:position_sum_residual        (sum_p a[p] - accepted) / accepted   != 0 broken
    specaudit:identity:position_rate_excess{position} accept_rate_by_position - 1         > 0 impossible
    specaudit:identity:drafted_excess               drafted / verify steps - k           > 0 impossible
    specaudit:identity:gauge_minus_counters         (mean gauge - counters) / counters   != 0 disagree
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT_LABELS = ("job", "instance", "engine", "model", "rank")
MAX_POSITIONS = 16   # per-position identities are written out for positions 1..15


@dataclass(frozen=True)
class Engine:
    """What one engine exports (names as Prometheus stores them, `_total` included)."""

    name: str
    title: str
    counters: dict            # vocabulary word -> counter series
    gauges: dict = field(default_factory=dict)   # accept_length / accept_rate -> gauge series
    by_position: dict = field(default_factory=dict)  # accepted / drafted -> (series, position label)
    rank: str | None = None   # the engine's rank label
    select: str = ""          # extra label matchers on every raw series
    pos_denominator: str = "verify_steps"   # or drafted_at_position
    source: str = ""          # where the names were checked


ENGINES = {
    "vllm": Engine(
        "vllm", "vLLM",
        counters={"verify_steps": "vllm:spec_decode_num_drafts_total",
                  "drafted_tokens": "vllm:spec_decode_num_draft_tokens_total",
                  "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
                  "generated_tokens": "vllm:generation_tokens_total"},
        by_position={"accepted": ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position")},
        rank="engine",
        source="vllm/v1/spec_decode/metrics.py (SpecDecodingProm); engine label since vLLM PR #24049"),
    "sglang": Engine(
        "sglang", "SGLang",
        counters={"verify_steps": "sglang:spec_verify_calls_total",
                  "generated_tokens": "sglang:generation_tokens_total"},
        gauges={"accept_length": "sglang:spec_accept_length", "accept_rate": "sglang:spec_accept_rate"},
        rank="dp_rank", select='tp_rank=~"0?", pp_rank=~"0?"',
        source="python/sglang/srt/metrics/collector.py; spec_verify_calls_total since SGLang PR #25689"),
    "trtllm": Engine(
        "trtllm", "TensorRT-LLM",
        counters={"drafted_tokens": "trtllm_spec_decode_num_draft_tokens_total",
                  "accepted_tokens": "trtllm_spec_decode_num_accepted_tokens_total"},
        gauges={"accept_length": "trtllm_spec_decode_acceptance_length"},
        by_position={"accepted": ("trtllm_spec_decode_accepted_tokens_total", "token_position"),
                     "drafted": ("trtllm_spec_decode_drafted_tokens_total", "token_position")},
        pos_denominator="drafted_at_position",
        source="trtllm-serve /prometheus/metrics; per-position counters since TensorRT-LLM PR #12636"),
    "llamacpp": Engine(
        "llamacpp", "llama.cpp",
        counters={"verify_steps": "llamacpp:spec_decode_num_drafts_total",
                  "drafted_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
                  "accepted_tokens": "llamacpp:spec_decode_num_accepted_tokens_total",
                  "generated_tokens": "llamacpp:tokens_predicted_total"},
        by_position={"accepted": ("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "position")},
        source="llama-server --metrics, llama.cpp PR #26389"),
}


@dataclass(frozen=True)
class Timing:
    """Durations of the rules. Production defaults; tests render shorter ones."""

    window: str = "5m"        # rate() range
    baseline: str = "1h"      # acceptance collapse: compared with this long before
    for_impossible: str = "2m"
    for_warning: str = "10m"
    for_gauge: str = "15m"


def _sel(series: str, engine: Engine, extra: str = "") -> str:
    m = ", ".join(x for x in (engine.select, extra) if x)
    return f"{series}{{{m}}}" if m else series


def normalise(engine: Engine, agg: str, inner: str, pos_label: str | None = None) -> str:
    """An engine's expression, aggregated per target/model/rank (and position), relabelled to
    job, instance, engine, model, rank (, position)."""
    by = ["job", "instance", "model_name"] + ([engine.rank] if engine.rank else []) + (
        [pos_label] if pos_label else [])
    x = f"{agg} by ({', '.join(by)}) ({inner})"
    if engine.rank:
        x = f'label_replace({x}, "rank", "$1", "{engine.rank}", "(.*)")'
    x = f'label_replace({x}, "engine", "{engine.name}", "", "")'
    x = f'label_replace({x}, "model", "$1", "model_name", "(.*)")'
    drop = ["model_name"]
    if engine.rank and engine.rank != "engine":
        drop.append(engine.rank)
    if pos_label and pos_label != "position":
        x = f'label_replace({x}, "position", "$1", "{pos_label}", "(.*)")'
        drop.append(pos_label)
    return f"sum without ({', '.join(drop)}) ({x})"


def _rule(record: str, expr: str, **labels) -> dict:
    r = {"record": record, "expr": expr}
    if labels:
        r["labels"] = labels
    return r


def recording_rules(t: Timing = Timing()) -> dict:
    """The `specaudit:` series of every engine (two groups: per engine, then derived)."""
    w = t.window
    raw = []
    for e in ENGINES.values():
        for word, series in e.counters.items():
            raw.append(_rule(f"specaudit:{word}:rate", normalise(e, "sum", f"rate({_sel(series, e)}[{w}])"),
                             engine=e.name))
        for word, (series, pos) in e.by_position.items():
            raw.append(_rule(f"specaudit:{word}_tokens_by_position:rate",
                             normalise(e, "sum", f"rate({_sel(series, e)}[{w}])", pos), engine=e.name))
        for word, series in e.gauges.items():
            raw.append(_rule(f"specaudit:{word}:reported", normalise(e, "avg", _sel(series, e)), engine=e.name))
        # a restart resets every counter at once; the verify-step (or drafted) counter stands for all
        reset_series = e.counters.get("verify_steps") or e.counters["drafted_tokens"]
        raw.append(_rule("specaudit:counter_resets:count", normalise(e, "sum", f"resets({_sel(reset_series, e)}[{w}])"),
                         engine=e.name))
    on = "on (job, instance, engine, model, rank)"
    derived = [
        _rule("specaudit:accept_rate", f"specaudit:accepted_tokens:rate / {on} (specaudit:drafted_tokens:rate > 0)"),
    ]
    for e in ("vllm", "llamacpp"):   # verify steps and accepted drafts
        derived.append(_rule("specaudit:accept_length",
                             f'1 + specaudit:accepted_tokens:rate{{engine="{e}"}} / {on} '
                             f'(specaudit:verify_steps:rate{{engine="{e}"}} > 0)', engine=e))
    derived += [
        # TensorRT-LLM: drafted at position 0 counts verify steps; both per-position counters
        # are updated when a request finishes (the totals per iteration), so use them together
        _rule("specaudit:accept_length",
              'sum without (position) (specaudit:accepted_tokens_by_position:rate{engine="trtllm"}) '
              f'/ {on} (specaudit:drafted_tokens_by_position:rate{{engine="trtllm", position="0"}} > 0) + 1',
              engine="trtllm"),
        # SGLang: completion tokens per verify call (both counted per request)
        _rule("specaudit:accept_length",
              f'specaudit:generated_tokens:rate{{engine="sglang"}} / {on} '
              '(specaudit:verify_steps:rate{engine="sglang"} > 0)', engine="sglang"),
        _rule("specaudit:draft_length", f"specaudit:drafted_tokens:rate / {on} (specaudit:verify_steps:rate > 0)"),
        _rule("specaudit:draft_positions", "count without (position) (specaudit:accepted_tokens_by_position:rate)"),
        _rule("specaudit:accept_rate_by_position",
              'specaudit:accepted_tokens_by_position:rate{engine!="trtllm"} / on (job, instance, engine, model, rank) '
              'group_left () (specaudit:verify_steps:rate > 0)', denominator="verify_steps"),
        _rule("specaudit:accept_rate_by_position",
              "specaudit:accepted_tokens_by_position:rate / on (job, instance, engine, model, rank, position) "
              "(specaudit:drafted_tokens_by_position:rate > 0)", denominator="drafted_at_position"),
        _rule("specaudit:identity:accepted_minus_drafted",
              f"(specaudit:accepted_tokens:rate - {on} specaudit:drafted_tokens:rate) "
              f"/ {on} (specaudit:drafted_tokens:rate > 0)"),
        _rule("specaudit:identity:accept_length_excess",
              f"specaudit:accept_length - {on} (specaudit:draft_positions + 1)", figure="counters"),
        _rule("specaudit:identity:accept_length_excess",
              f"specaudit:accept_length:reported - {on} (specaudit:draft_positions + 1)", figure="gauge"),
        _rule("specaudit:identity:position_increase", " or ".join(
            f'label_replace((specaudit:accepted_tokens_by_position:rate{{position="{p}"}} - ignoring (position) '
            f'specaudit:accepted_tokens_by_position:rate{{position="{p - 1}"}}) / ignoring (position) '
            f'specaudit:accepted_tokens_by_position:rate{{position="0"}}, "position", "{p}", "", "")'
            for p in range(1, MAX_POSITIONS))),
        # vLLM and llama.cpp update the per-position and total counters together
        # accepted at a position <= its denominator (verify steps, or drafted at that position)
        _rule("specaudit:identity:position_rate_excess", "specaudit:accept_rate_by_position - 1"),
        # each verify step drafts at most k tokens (k = the positions exported: vLLM, llama.cpp)
        _rule("specaudit:identity:drafted_excess",
              f'specaudit:draft_length{{engine=~"vllm|llamacpp"}} - {on} specaudit:draft_positions'),
        _rule("specaudit:identity:position_sum_residual",
              'sum without (position) (specaudit:accepted_tokens_by_position:rate{engine=~"vllm|llamacpp"}) '
              f"/ {on} (specaudit:accepted_tokens:rate > 0) - 1"),
        _rule("specaudit:identity:gauge_minus_counters",
              f"avg_over_time(specaudit:accept_length:reported[{w}]) / {on} (specaudit:accept_length > 0) - 1"),
    ]
    return {"groups": [{"name": "specaudit-engines-series", "rules": raw},
                       {"name": "specaudit-engines-derived", "rules": derived}]}


@dataclass(frozen=True)
class Alert:
    name: str
    code: str                 # the catalog rule this alert is the live form of
    severity: str
    expr: str
    for_: str                 # a Timing field name
    summary: str
    description: str


# The catalog codes each alert stands for (`specaudit rules CODE` explains them).
ALERTS = [
    Alert("SpecauditAcceptedAboveDrafted", "SA702", "critical",
          "specaudit:identity:accepted_minus_drafted > 0.01 or specaudit:identity:position_rate_excess > 0.01",
          "for_impossible",
          "accepted drafts above drafted tokens",
          "{{ $labels.engine }} counted more accepted drafts than drafted tokens{{ with $labels.position }} at "
          "position {{ . }}{{ end }} over the window (by more than 1%): impossible; the accepted counter includes "
          "the bonus token or counts something twice."),
    Alert("SpecauditDraftedAboveSteps", "SA722", "critical",
          "specaudit:identity:drafted_excess > 0.01", "for_impossible",
          "more drafted tokens than verify steps x k",
          "{{ $labels.engine }} counted more drafted tokens per verify step than the positions it exports: a "
          "step verifies at most k drafts; padded or placeholder drafts were counted."),
    Alert("SpecauditAcceptLengthAboveMax", "SA705", "critical",
          "specaudit:identity:accept_length_excess > 0.01", "for_impossible",
          "accept length above k + 1",
          "The {{ $labels.engine }} accept length from its {{ $labels.figure }} exceeds k + 1 (k = the positions "
          "exported): a verify step cannot commit more than its drafts plus one bonus token."),
    Alert("SpecauditPositionRateIncreasing", "SA721", "critical",
          "specaudit:identity:position_increase > 0.01", "for_impossible",
          "per-position acceptance increases with position",
          "{{ $labels.engine }} accepted more drafts at position {{ $labels.position }} than at the position "
          "before it: a draft is accepted only after every earlier one was, so per-position counts cannot grow "
          "with position."),
    Alert("SpecauditPositionSumMismatch", "SA705", "warning",
          "abs(specaudit:identity:position_sum_residual) > 0.01", "for_warning",
          "per-position counts disagree with the accepted total",
          "{{ $labels.engine }}: the per-position accepted counts do not sum to the accepted-token counter "
          "(more than 1% apart); one of the two is counted wrongly."),
    Alert("SpecauditGaugeDisagreesWithCounters", "SA726", "warning",
          "abs(specaudit:identity:gauge_minus_counters) > 0.25", "for_gauge",
          "printed accept length disagrees with the counters",
          "{{ $labels.engine }}: the accept-length gauge averaged over the window is more than 25% off the "
          "accept length the counters give; which one is wrong needs a log or a trace (specaudit check on the "
          "server log)."),
    Alert("SpecauditAcceptanceNearZero", "SA727", "warning",
          "(specaudit:accept_rate < 0.02 or specaudit:accept_rate:reported < 0.02) "
          "and on (job, instance, engine, model, rank) "
          "(specaudit:drafted_tokens:rate > 0 or specaudit:verify_steps:rate > 0)", "for_warning",
          "acceptance near zero while drafting continues",
          "{{ $labels.engine }} accepts under 2% of its drafts while still drafting: dummy or padded drafts "
          "(zero-filled draft ids) or a drafter that no longer matches the target."),
    Alert("SpecauditAcceptanceCollapse", "SA709", "warning",
          "specaudit:accept_rate < 0.5 * avg_over_time(specaudit:accept_rate[{baseline}] offset {window}) "
          "and on (job, instance, engine, model, rank) specaudit:drafted_tokens:rate > 0", "for_warning",
          "acceptance collapsed below half of its level",
          "{{ $labels.engine }} accept rate fell below half of its mean over the {baseline} before, while "
          "drafting continues: the drafter or the target changed, the prompts changed kind (acceptance depends on "
          "the text: a loop body is drafted far better than a docstring), or a counter broke."),
    Alert("SpecauditCounterReset", "SA724", "info",
          "specaudit:counter_resets:count > 0", "for_impossible",
          "speculative-decoding counters reset",
          "{{ $labels.engine }} counters went down in the window (a restart): windows across a reset are left out "
          "of the identities."),
]


def alert_rules(t: Timing = Timing()) -> dict:
    rules = []
    for a in ALERTS:
        rules.append({
            "alert": a.name,
            "expr": a.expr.replace("{window}", t.window).replace("{baseline}", t.baseline),
            "for": getattr(t, a.for_),
            "labels": {"severity": a.severity, "code": a.code},
            "annotations": {
                "summary": f"[{a.code}] {{{{ $labels.engine }}}}{{{{ with $labels.model }}}} {{{{ . }}}}{{{{ end }}}}"
                           f"{{{{ with $labels.rank }}}} rank {{{{ . }}}}{{{{ end }}}} on {{{{ $labels.instance }}}}: "
                           f"{a.summary}",
                "description": a.description.replace("{baseline}", t.baseline),
                "runbook": f"specaudit rules {a.code}",
            },
        })
    return {"groups": [{"name": "specaudit-engines-alerts", "rules": rules}]}


# ---- Grafana ----------------------------------------------------------------------------

SEL = 'job=~"$job", instance=~"$instance", engine=~"$engine", model=~"$model", rank=~"$rank"'
DS = {"type": "prometheus", "uid": "${datasource}"}


def _panel(pid, title, desc, targets, x, y, w=12, h=8, unit="short", kind="timeseries", **extra):
    p = {"id": pid, "type": kind, "title": title, "description": desc, "datasource": DS,
         "gridPos": {"x": x, "y": y, "w": w, "h": h},
         "targets": [{"refId": chr(65 + i), "datasource": DS, "editorMode": "code", "range": kind != "table",
                      "instant": kind == "table", "expr": e, "legendFormat": lf}
                     for i, (e, lf) in enumerate(targets)],
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "options": {}}
    p.update(extra)
    return p


def _var(name, label, query):
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": f"{name}-var"}, "definition": query, "refresh": 2,
            "includeAll": True, "allValue": ".*", "multi": True,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "sort": 1}


def dashboard() -> dict:
    lf = "{{engine}} {{model}} {{rank}}"
    s = "{" + SEL + "}"
    panels = [
        _panel(1, "Accept length", "Mean tokens committed per verify step (bonus included): from the counters "
               "(specaudit:accept_length) beside the engine's own gauge where it prints one.",
               [(f"specaudit:accept_length{s}", lf + " counters"),
                (f"specaudit:accept_length:reported{s}", lf + " printed")], 0, 0),
        _panel(2, "Accept rate", "Accepted drafts / drafted tokens from the counters, and the engine's printed "
               "rate (SGLang; its definition changed in April 2026).",
               [(f"specaudit:accept_rate{s}", lf + " counters"),
                (f"specaudit:accept_rate:reported{s}", lf + " printed")], 12, 0, unit="percentunit"),
        _panel(3, "Per-position acceptance", "Accepted at each draft position / its denominator (verify steps: "
               "vLLM, llama.cpp; drafted at that position: TensorRT-LLM). Unconditional rates never rise with "
               "position.", [(f"specaudit:accept_rate_by_position{s}", lf + " pos {{position}} ({{denominator}})")],
               0, 8, unit="percentunit"),
        _panel(4, "Drafted vs accepted tokens/s", "Counter rates: drafted tokens, accepted drafts (bonus excluded), "
               "verify steps.",
               [(f"specaudit:drafted_tokens:rate{s}", lf + " drafted"),
                (f"specaudit:accepted_tokens:rate{s}", lf + " accepted"),
                (f"specaudit:verify_steps:rate{s}", lf + " verify steps")], 12, 8),
        _panel(5, "Identities (0 on an honest engine)", "Residuals: (accepted - drafted)/drafted, accept length "
               "- (k+1), per-position increase, per-position sum vs total, gauge vs counters. Above 0 (or away "
               "from 0) means a counter lies; see the alerts for the rule code.",
               [(f"specaudit:identity:accepted_minus_drafted{s}", lf + " accepted-drafted"),
                (f"specaudit:identity:accept_length_excess{s}", lf + " L-(k+1) {{figure}}"),
                (f"specaudit:identity:position_increase{s}", lf + " pos {{position}} increase"),
                (f"specaudit:identity:position_sum_residual{s}", lf + " per-position sum"),
                (f"specaudit:identity:position_rate_excess{s}", lf + " pos {{position}} rate - 1"),
                (f"specaudit:identity:drafted_excess{s}", lf + " drafted/step - k"),
                (f"specaudit:identity:gauge_minus_counters{s}", lf + " gauge vs counters")], 0, 16, w=24),
        _panel(6, "Counter resets", "Times a spec-decoding counter went down in the window (restarts).",
               [(f"specaudit:counter_resets:count{s}", lf)], 0, 24, w=8),
        _panel(7, "Active alerts", "specaudit alerts now pending or firing for the selection; the code names the "
               "catalog rule (`specaudit rules CODE`).",
               [('ALERTS{alertname=~"Specaudit.*", ' + SEL + "}", "{{alertname}} {{code}} {{alertstate}}")],
               8, 24, w=16, kind="table"),
    ]
    return {
        "uid": "specaudit-engines", "title": "specaudit: real engines' speculative decoding",
        "description": "vLLM, SGLang, TensorRT-LLM and llama.cpp spec-decoding metrics through the "
                       "specaudit: recording rules (engines_rules.yml) and alerts (engines_alerts.yml).",
        "tags": ["specaudit", "speculative-decoding"], "timezone": "utc", "editable": True, "graphTooltip": 1,
        "refresh": "30s", "schemaVersion": 39, "version": 1, "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1, "regex": ""},
            _var("job", "Job", 'label_values({__name__=~"specaudit:(verify_steps|drafted_tokens):rate"}, job)'),
            _var("instance", "Instance", 'label_values({__name__=~"specaudit:(verify_steps|drafted_tokens):rate", '
                                         'job=~"$job"}, instance)'),
            _var("engine", "Engine", 'label_values({__name__=~"specaudit:(verify_steps|drafted_tokens):rate", '
                                     'job=~"$job", instance=~"$instance"}, engine)'),
            _var("model", "Model", 'label_values({__name__=~"specaudit:(verify_steps|drafted_tokens):rate", '
                                   'engine=~"$engine"}, model)'),
            _var("rank", "Rank", 'label_values({__name__=~"specaudit:(verify_steps|drafted_tokens):rate", '
                                 'engine=~"$engine", model=~"$model"}, rank)'),
        ]},
        "annotations": {"list": []}, "links": [], "panels": panels,
    }


SCRAPE_EXAMPLE = """\
# Scrape real engines and load the specaudit rules for them (copy, then edit the targets):
#   prometheus --config.file=prometheus_engines.yml
# Metrics endpoints: vLLM and SGLang serve /metrics (SGLang with --enable-metrics);
# TensorRT-LLM's trtllm-serve /prometheus/metrics; llama-server /metrics with --metrics.
global:
  scrape_interval: 15s
  evaluation_interval: 15s
rule_files:
  - engines_rules.yml
  - engines_alerts.yml
scrape_configs:
  - job_name: vllm
    static_configs:
      - targets: ["127.0.0.1:8000"]
  - job_name: sglang
    static_configs:
      - targets: ["127.0.0.1:30000"]
  - job_name: trtllm
    metrics_path: /prometheus/metrics
    static_configs:
      - targets: ["127.0.0.1:8001"]
  - job_name: llamacpp
    static_configs:
      - targets: ["127.0.0.1:8080"]
"""


def to_yaml(doc: dict, header: str) -> str:
    import yaml
    return header + yaml.safe_dump(doc, sort_keys=False, width=10_000, allow_unicode=True)


RULES_HEADER = ("# Generated by `python3 -m specaudit.dashboards.engines` from its ENGINES table; do not edit.\n"
                "# Recording rules: real engines' spec-decoding series as specaudit: series per engine/model/rank.\n")
ALERTS_HEADER = ("# Generated by `python3 -m specaudit.dashboards.engines`; do not edit. Needs engines_rules.yml.\n"
                 "# Each alert carries the catalog code it stands for; runbook: `specaudit rules CODE`.\n")


def render(out: Path, t: Timing = Timing()) -> list[Path]:
    """Write the four files into `out` (the committed copies when out is this folder)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "engines_rules.yml": to_yaml(recording_rules(t), RULES_HEADER),
        "engines_alerts.yml": to_yaml(alert_rules(t), ALERTS_HEADER),
        "engines.json": json.dumps(dashboard(), indent=2) + "\n",
        "prometheus_engines.yml": SCRAPE_EXAMPLE,
    }
    for name, text in files.items():
        (out / name).write_text(text)
    return [out / n for n in files]


if __name__ == "__main__":
    for p in render(HERE):
        print(p)
