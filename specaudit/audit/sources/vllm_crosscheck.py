"""The plugin's trace against every surface vLLM itself shows, to the token.

    python -m specaudit.audit.sources.vllm_crosscheck RUN_DIR [--log server.log]
        [--metrics-before a.txt --metrics-after b.txt] [--responses responses.jsonl]

prints one JSON object {"checked": [...], "mismatches": [...]} and exits 1 when any
surface disagrees with the trace, 0 when all agree, 2 on unreadable input.

What the trace says, from its evidence (never from vLLM's counter columns):
    drafted        per step: N - 1, the draft tokens the verify forward was fed
    accepted       per step: len(accepted_path) - 1, the drafts the rejection sampler
                   returned before its own token
    drafts         steps with N > 1 (vLLM's "num_drafts")
    per position   steps whose accepted prefix reaches draft position i
    generated      every request's output tokens
What vLLM shows:
    log            `SpecDecoding metrics:` lines: Accepted and Drafted summed over the
                   run's lines (exact), drafts recovered from the mean acceptance length
                   (two decimals: within its rounding)
    /metrics       deltas of vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total,
                   ..._per_pos_total{position}, vllm:generation_tokens_total (exact)
    per request    each response's metrics.speculative_decoding: num_draft_tokens,
                   num_accepted_draft_tokens, num_spec_steps, per_step_drafted,
                   per_step_accepted (exact, step by step)
Two more kinds of finding:
    vllm-own       identities among vLLM's own outputs (own_identities): a per-request
                   block whose arrays do not sum to its totals, or blocks that do not sum
                   to the /metrics deltas. These need no trace.
    trace          accepted drafts vLLM counted on a request's last step after its stop
                   token or EOS, which the stop check then cut (vLLM #56101): no aggregate
                   holds the committed length, only the trace shows it.
Each mismatch names the surface that disagreed: that is the evidence that decided.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def trace_facts(run_dir) -> dict:
    """Per-request and total counts derived from a run's step and request rows."""
    import pyarrow.dataset as ds
    run_dir = Path(run_dir)
    files = sorted(run_dir.glob("steps-*.parquet"))
    cols = ["request_id", "step", "node_tokens", "accepted_path", "accepted_depth", "commit_len", "finished"]
    steps = ds.dataset([str(f) for f in files], format="parquet").to_table(columns=cols).to_pylist() if files else []
    steps.sort(key=lambda r: (r["request_id"], r["step"]))
    per_req: dict[str, dict] = {}
    pos: list[int] = []
    tot = {"drafts": 0, "drafted": 0, "accepted": 0, "after_stop": 0, "after_stop_steps": []}
    for r in steps:
        d = len(r["node_tokens"]) - 1
        if d <= 0:
            continue
        a = len(r["accepted_path"]) - 1
        # vLLM counted accepted drafts its stop check then cut off (never emitted): #56101
        lost = r["accepted_depth"] + 1 - r["commit_len"] if r["finished"] else 0
        if lost > 0:
            tot["after_stop"] += lost
            tot["after_stop_steps"].append([r["request_id"], r["step"], r["accepted_depth"], r["commit_len"]])
        q = per_req.setdefault(r["request_id"], {"drafted": [], "accepted": []})
        q["drafted"].append(d)
        q["accepted"].append(a)
        tot["drafts"] += 1
        tot["drafted"] += d
        tot["accepted"] += a
        pos += [0] * (a - len(pos))
        for i in range(a):
            pos[i] += 1
    tot["per_pos"] = pos
    gen = 0
    rq = run_dir / "requests.parquet"
    parts = [rq] if rq.exists() else sorted(run_dir.glob("requests-*.parquet"))
    req_ids = []
    for p in parts:
        import pyarrow.parquet as pq
        for row in pq.read_table(p, columns=["request_id", "output_tokens"]).to_pylist():
            gen += len(row["output_tokens"] or [])
            req_ids.append(row["request_id"])
    tot["generated"] = gen
    return {"total": tot, "requests": per_req, "request_ids": req_ids}


def log_totals(text: str) -> dict | None:
    """Accepted, Drafted summed over the `SpecDecoding metrics:` lines; drafts recovered
    from each line's mean acceptance length (low, high: its two-decimal rounding)."""
    from specaudit.audit.sources.vllm import SPEC_RE, F  # the reader check uses: one parser of the line
    acc = dr = 0
    lo = hi = 0.0
    n = 0
    for line in text.splitlines():
        m = SPEC_RE.search(line)
        if not m:
            continue
        body = m.group("body")
        a = F["accepted"].search(body)
        d = F["drafted"].search(body)
        mean = F["mean"].search(body)
        if not (a and d and mean):
            continue
        a, d, mean = int(float(a.group(1))), int(float(d.group(1))), float(mean.group(1))
        acc, dr, n = acc + a, dr + d, n + 1
        if a == 0:     # a 1.00 mean: drafts not recoverable; each drafted at least one token
            hi += d
            continue
        hi += a / max(mean - 1 - 0.005, 1e-9)
        lo += a / (mean - 1 + 0.005)
    return None if n == 0 else {"lines": n, "accepted": acc, "drafted": dr, "drafts_low": lo, "drafts_high": hi}


def metric_values(text: str) -> dict:
    """{(name, position or None): value} for the vLLM counters the cross-check reads."""
    from prometheus_client.parser import text_string_to_metric_families
    want = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos",
            "vllm:generation_tokens")
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:   # by sample name: a TYPE line may name the family with or without _total
            if not s.name.endswith("_total") or s.name[:-6] not in want:
                continue
            key = (s.name[:-6], s.labels.get("position"))
            out[key] = out.get(key, 0.0) + s.value
    return out


def crosscheck(run_dir, log_text: str | None = None, metrics_before: str | None = None,
               metrics_after: str | None = None, responses: list[dict] | None = None) -> dict:
    """Compare the trace with each surface given; returns {"checked", "mismatches", "trace"}."""
    facts = trace_facts(run_dir)
    t = facts["total"]
    checked, bad = [], []

    def cmp(surface, what, trace_v, vllm_v):
        item = {"surface": surface, "what": what, "trace": trace_v, "vllm": vllm_v}
        checked.append(item)
        if trace_v != vllm_v:
            bad.append(item)

    if log_text is not None:
        lt = log_totals(log_text)
        if lt is None:
            bad.append({"surface": "log", "what": "SpecDecoding metrics lines", "trace": t["drafts"], "vllm": None})
        else:
            cmp("log", "Accepted (sum over lines)", t["accepted"], lt["accepted"])
            cmp("log", "Drafted (sum over lines)", t["drafted"], lt["drafted"])
            ok = lt["drafts_low"] - 1e-6 <= t["drafts"] <= lt["drafts_high"] + 1e-6
            item = {"surface": "log", "what": "drafts recovered from the mean acceptance length",
                    "trace": t["drafts"], "vllm": [round(lt["drafts_low"], 2), round(lt["drafts_high"], 2)]}
            checked.append(item)
            if not ok:
                bad.append(item)
    if metrics_after is not None:
        a = metric_values(metrics_after)
        b = metric_values(metrics_before or "")
        delta = lambda name, p=None: round(a.get((name, p), 0.0) - b.get((name, p), 0.0))
        cmp("/metrics", "spec_decode_num_drafts_total delta", t["drafts"], delta("vllm:spec_decode_num_drafts"))
        cmp("/metrics", "spec_decode_num_draft_tokens_total delta", t["drafted"],
            delta("vllm:spec_decode_num_draft_tokens"))
        cmp("/metrics", "spec_decode_num_accepted_tokens_total delta", t["accepted"],
            delta("vllm:spec_decode_num_accepted_tokens"))
        positions = sorted({int(p) for (n, p) in a if n.endswith("_per_pos") and p is not None})
        for i in positions:
            cmp("/metrics", f"accepted_tokens_per_pos_total{{position={i}}} delta",
                t["per_pos"][i] if i < len(t["per_pos"]) else 0,
                delta("vllm:spec_decode_num_accepted_tokens_per_pos", str(i)))
        cmp("/metrics", "generation_tokens_total delta", t["generated"], delta("vllm:generation_tokens"))
    for resp in responses or []:
        rid = resp.get("id", "")
        block = ((resp.get("metrics") or {}).get("speculative_decoding")) if isinstance(resp, dict) else None
        match = [k for k in facts["request_ids"] if k.startswith(rid + "-")]
        if len(match) != 1:
            bad.append({"surface": "per-request", "what": f"request {rid} in the trace", "trace": len(match),
                        "vllm": 1})
            continue
        q = facts["requests"].get(match[0], {"drafted": [], "accepted": []})
        if block is None:
            bad.append({"surface": "per-request", "what": f"{rid}: metrics.speculative_decoding",
                        "trace": len(q["drafted"]), "vllm": None})
            continue
        cmp("per-request", f"{rid}: num_spec_steps", len(q["drafted"]), block.get("num_spec_steps"))
        cmp("per-request", f"{rid}: num_draft_tokens", sum(q["drafted"]), block.get("num_draft_tokens"))
        cmp("per-request", f"{rid}: num_accepted_draft_tokens", sum(q["accepted"]),
            block.get("num_accepted_draft_tokens"))
        if block.get("per_step_drafted") is not None or q["drafted"]:
            cmp("per-request", f"{rid}: per_step_drafted", q["drafted"], block.get("per_step_drafted") or [])
            cmp("per-request", f"{rid}: per_step_accepted", q["accepted"], block.get("per_step_accepted") or [])
    if t["after_stop"]:
        # the aggregates cannot show this (they hold no committed length); the trace does
        bad.append({"surface": "trace", "what": "accepted drafts counted after the request's stop, never emitted "
                    "(vLLM #56101): per step [request, step, accepted_depth, commit_len]",
                    "trace": t["after_stop_steps"], "vllm": t["after_stop"]})
    for item in own_identities(responses or [], metrics_before, metrics_after):
        checked.append(item)
        if item["trace"] != item["vllm"]:
            bad.append(item)
    return {"checked": checked, "mismatches": bad, "trace": t}


def own_identities(responses: list[dict], metrics_before: str | None, metrics_after: str | None) -> list[dict]:
    """What vLLM's own outputs must satisfy among themselves, no trace needed (surface
    "vllm-own"; `trace` holds the side recomputed from the other numbers):
    each per-request block's per-step arrays sum to its totals, have num_spec_steps
    entries, never accept more than drafted, and agree with its histogram; and the
    blocks of all responses sum to the /metrics deltas when the responses are all the
    traffic between the two scrapes."""
    out = []
    sums = {"steps": 0, "drafted": 0, "accepted": 0}
    n_blocks = 0
    for resp in responses:
        b = (resp.get("metrics") or {}).get("speculative_decoding") if isinstance(resp, dict) else None
        if not b:
            continue
        n_blocks += 1
        rid = resp.get("id", "")
        acc, dr = b.get("per_step_accepted"), b.get("per_step_drafted")
        hist = b.get("acceptance_histogram") or []
        sums["steps"] += b.get("num_spec_steps") or 0
        sums["drafted"] += b.get("num_draft_tokens") or 0
        sums["accepted"] += b.get("num_accepted_draft_tokens") or 0
        own = lambda what, recomputed, shown, rid=rid: out.append(
            {"surface": "vllm-own", "what": f"{rid}: {what}", "trace": recomputed, "vllm": shown})
        own("sum(acceptance_histogram) = num_spec_steps", sum(hist), b.get("num_spec_steps"))
        own("sum(j * histogram[j]) = num_accepted_draft_tokens", sum(j * h for j, h in enumerate(hist)),
            b.get("num_accepted_draft_tokens"))
        if acc is not None and dr is not None:
            own("sum(per_step_accepted) = num_accepted_draft_tokens", sum(acc), b.get("num_accepted_draft_tokens"))
            own("sum(per_step_drafted) = num_draft_tokens", sum(dr), b.get("num_draft_tokens"))
            own("len(per_step_accepted) = num_spec_steps", len(acc), b.get("num_spec_steps"))
            own("steps accepting more than drafted", 0, sum(1 for a, d in zip(acc, dr) if a > d))
            own("spec steps that drafted nothing", 0, sum(1 for d in dr if d <= 0))
    if n_blocks and metrics_after is not None and n_blocks == len(responses):
        a, bb = metric_values(metrics_after), metric_values(metrics_before or "")
        delta = lambda name: round(a.get((name, None), 0.0) - bb.get((name, None), 0.0))
        for what, key, name in (("num_spec_steps", "steps", "vllm:spec_decode_num_drafts"),
                                ("num_draft_tokens", "drafted", "vllm:spec_decode_num_draft_tokens"),
                                ("num_accepted_draft_tokens", "accepted", "vllm:spec_decode_num_accepted_tokens")):
            out.append({"surface": "vllm-own", "what": f"sum of the responses' {what} = /metrics {name}_total delta",
                        "trace": sums[key], "vllm": delta(name)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specaudit.audit.sources.vllm_crosscheck",
                                 description=__doc__.split("\n\n")[0],
                                 epilog="Exit 0: every surface agrees with the trace; 1: a mismatch (each names "
                                        "its surface); 2: unreadable input.")
    ap.add_argument("run_dir", help="the traced run's folder (run_id=<id>/)")
    ap.add_argument("--log", help="the vLLM server's log (SpecDecoding metrics lines)")
    ap.add_argument("--metrics-before", help="a /metrics scrape taken before the requests")
    ap.add_argument("--metrics-after", help="a /metrics scrape taken after them")
    ap.add_argument("--responses", help="JSON lines: the completions' response bodies")
    a = ap.parse_args(argv)
    try:
        if not Path(a.run_dir).is_dir():
            raise OSError(f"{a.run_dir}: not a run folder")
        rd = lambda p: Path(p).read_text(errors="replace") if p else None
        resp = [json.loads(x) for x in rd(a.responses).splitlines() if x.strip()] if a.responses else None
        out = crosscheck(a.run_dir, rd(a.log), rd(a.metrics_before), rd(a.metrics_after), resp)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 1 if out["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
