"""Estimate the committed tokens per step from throughput, and judge a reported figure.

The model (specaudit/estimate.py): a speculative step costs r plain decode steps, so
    C = (observed tokens/s / baseline tokens/s) * r
is what the engine's mean commit length (accept length, bonus included) must be. The
interval carries the spread of the throughputs and of r; the verdict compares the
reported figure with it: consistent, inconsistent, or not enough data.

Examples:
  # the seed case: r = 1.5, plain decoding 98 tokens/s, speculative 109 tokens/s
  specaudit estimate --observed-tps 109 --baseline-tps 98 --cost-factor 1.5 --reported-commit-len 2.0
  specaudit estimate --observed-tps 109 --baseline-tps 98 --cost-factor 1.5 --reported-commit-len 8   # exit 1

  # a trace dataset (steady-state throughput from its timestamps; N, c and the reported
  # figure from run.json); a profile measured on this machine also gives the baseline
  specaudit calibrate --out cost.json && specaudit estimate traces/ --profile cost.json --baseline-from-profile
  # scripts/load.py output against a plain run's, with a calibrated profile
  specaudit estimate --load spec.json --baseline plain.json --profile cost.json --n-nodes 8
  # an engine's log or scrape: throughput and accept len from the file itself
  specaudit estimate sglang.log --baseline-tps 1010 --cost-factor 1.35 --concurrency 8

Throughputs must be of one kind (both aggregate, or both per request) and at the same
concurrency. A cost factor typed by hand carries a 10% spread unless --cost-factor-std
says otherwise; `specaudit calibrate` measures r and its spread.

Exit codes: 0 consistent, 1 inconsistent, 2 bad input or not enough data.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

HELP = "estimate the commit length from throughput and judge the reported one"
ORDER = 35


def add_arguments(p) -> None:
    p.add_argument("input", nargs="?", metavar="INPUT",
                   help="trace dataset folder, scripts/load.py output, SGLang log, vLLM log or Prometheus scrape")
    g = p.add_argument_group("observed throughput (or INPUT)")
    g.add_argument("--observed-tps", type=float, help="observed tokens/s of the speculative run")
    g.add_argument("--observed-std", type=float, default=0.0, help="standard error of --observed-tps (default 0)")
    g.add_argument("--load", metavar="FILE", help="scripts/load.py output of the speculative run (same as INPUT)")
    g.add_argument("--source", choices=["sglang-log", "vllm-log", "prom-text"],
                   help="force how INPUT is read when it is an engine log or scrape")
    g = p.add_argument_group("baseline (plain greedy decoding at the same concurrency)")
    g.add_argument("--baseline-tps", type=float, help="plain decoding tokens/s")
    g.add_argument("--baseline-std", type=float, default=0.0, help="standard error of --baseline-tps (default 0)")
    g.add_argument("--baseline", metavar="FILE", help="scripts/load.py output of a plain (non-speculative) run")
    g.add_argument("--baseline-from-profile", action="store_true",
                   help="c / t_ar(c) from a measured --profile: only when the profile was measured on this "
                        "machine and runtime (the reference runtime's own runs)")
    g = p.add_argument_group("step cost factor r = (t_draft + t_verify(c, N)) / t_ar(c)")
    g.add_argument("--cost-factor", type=float, help="r given by hand (the seed's is 1.5)")
    g.add_argument("--cost-factor-std", type=float, default=None,
                   help="spread (1 sd) of a hand-given r (default: 10%% of r)")
    g.add_argument("--profile", metavar="FILE", help="cost profile JSON written by `specaudit calibrate`")
    g.add_argument("--n-nodes", type=int, help="verify nodes per step N = draft budget + 1 (for --profile)")
    g.add_argument("--concurrency", type=int, help="running requests c (for --profile; for a log, use only "
                                                   "windows at this concurrency)")
    g = p.add_argument_group("the figure under audit")
    g.add_argument("--reported-commit-len", type=float,
                   help="reported mean commit length / accept length, bonus token included")
    g.add_argument("--reported-accept-depth", type=float,
                   help="reported mean accepted depth (drafts only); compared as depth + 1")
    p.add_argument("--tolerance", type=float, default=0.1,
                   help="relative slack around the interval for what the model leaves out (default 0.1)")
    p.add_argument("--output-format", choices=["text", "json"], default="text")


# ------------------------------------------------------------------ inputs


def _is_load_json(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 65536))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return False
    for ln in reversed([x for x in tail.splitlines() if x.strip()]):
        try:
            obj = json.loads(ln)
        except json.JSONDecodeError:
            return False
        return isinstance(obj, dict) and "tokens_per_s" in obj
    return False


def observations_from_reading(reading, concurrency=None):
    """One Observation from an engine log or scrape: mean throughput over its windows."""
    from specaudit.audit.estimate import Observation
    from specaudit.trace.schema import InputError
    ws = [w for w in reading.windows if w.gen_tps is not None and w.gen_tps > 0 and not w.extra.get("counter_reset")]
    if concurrency is not None:
        ws = [w for w in ws if w.concurrency is not None and round(w.concurrency) == concurrency]
    if not ws:
        why = f" at concurrency {concurrency}" if concurrency is not None else ""
        raise InputError(reading.path, f"no window with a positive generation throughput{why} (a single "
                                       "Prometheus scrape has no rate: append a second one)")
    tps = [w.gen_tps for w in ws]
    n = len(tps)
    m = sum(tps) / n
    se = math.sqrt(sum((x - m) ** 2 for x in tps) / (n - 1) / n) if n > 1 else 0.0
    cs = [w.concurrency for w in ws if w.concurrency is not None]
    ls = [w.accept_len for w in ws if w.accept_len is not None]
    cfg = reading.config
    n_nodes = cfg.get("num_draft_tokens") or ((cfg["num_spec_tokens"] + 1) if cfg.get("num_spec_tokens") else None)
    extra = {}
    if cs and (max(cs) - min(cs)) / max(max(cs), 1) > 0.25:
        extra["confounder"] = (f"concurrency varies {min(cs):g}..{max(cs):g} across the windows; "
                               "pass --concurrency to use one level")
    conc = round(sum(cs) / len(cs)) if cs else None
    rep = sum(ls) / len(ls) if ls else None
    if rep is not None and not reading.includes_bonus:
        rep += 1
    return [Observation(source=reading.source, tps=m, tps_std=se, concurrency=conc, n_nodes=n_nodes,
                        reported_commit_len=rep, label=Path(reading.path).name, samples=n, extra=extra)]


def gather(args) -> list:
    from specaudit.audit.estimate import Observation, observation_from_load_json, observations_from_traces
    from specaudit.trace.schema import InputError
    if args.load:
        if args.input:
            raise ValueError("give either INPUT or --load FILE, not both")
        from specaudit.audit.estimate import observation_from_load_json as _olj
        return [_olj(args.load)]
    if args.observed_tps is not None and args.input:
        raise ValueError("give either INPUT or --observed-tps, not both")
    if args.observed_tps is not None:
        return [Observation(source="cli", tps=args.observed_tps, tps_std=args.observed_std or 0.0,
                            concurrency=args.concurrency, n_nodes=args.n_nodes, label="--observed-tps")]
    if not args.input:
        raise ValueError("no observed throughput: give --observed-tps or an INPUT file/folder")
    p = Path(args.input)
    if not p.exists():
        raise InputError(p, "no such file or folder")
    if p.is_dir():
        return observations_from_traces(p)
    if args.source is None and _is_load_json(p):
        return [observation_from_load_json(p)]
    from specaudit.audit.sources import read_source
    return observations_from_reading(read_source(p, args.source), args.concurrency)


def baseline(args, obs) -> tuple[float, float, str]:
    from specaudit.audit.estimate import CostProfile, observation_from_load_json, profile_t_ar
    if args.baseline_tps is not None and args.baseline:
        raise ValueError("give either --baseline-tps or --baseline FILE, not both")
    if args.baseline:
        o = observation_from_load_json(args.baseline)
        return o.tps, o.tps_std, o.label
    if args.baseline_tps is not None:
        return args.baseline_tps, args.baseline_std or 0.0, "--baseline-tps"
    if args.profile and args.baseline_from_profile:
        c = args.concurrency or obs.concurrency
        t_ar = profile_t_ar(CostProfile.load(args.profile), c)
        return c / t_ar, 0.0, f"c / t_ar({c}) of the profile"
    raise ValueError("no baseline: give --baseline-tps (plain decoding tokens/s at the same concurrency), "
                     "--baseline FILE, or --baseline-from-profile")


def cost(args, obs) -> tuple[float, float, str]:
    from specaudit.audit.estimate import CostProfile
    if args.cost_factor is not None and args.profile:
        raise ValueError("give either --cost-factor or --profile, not both")
    if args.cost_factor is not None:
        prof = CostProfile.manual(args.cost_factor, args.cost_factor_std)
        r, sd = prof.lookup()
        return r, sd, "by hand" + ("" if args.cost_factor_std is not None else ", spread 10% of r")
    if args.profile:
        prof = CostProfile.load(args.profile)
        n = args.n_nodes or obs.n_nodes
        c = args.concurrency or obs.concurrency
        r, sd = prof.lookup(n, c)
        return r, sd, f"profile {Path(args.profile).name} at N={n}, c={c}"
    raise ValueError("no cost factor: give --cost-factor R (e.g. 1.5) or --profile FILE from `specaudit calibrate`")


# ------------------------------------------------------------------- main


def main(args) -> int:
    from specaudit.audit.estimate import CONSISTENT, INCONSISTENT, NOT_ENOUGH_DATA, estimate_commit_length, verdict
    if not (0 <= args.tolerance < 1):
        raise ValueError(f"--tolerance must be in [0, 1), got {args.tolerance}")
    if args.reported_commit_len is not None and args.reported_accept_depth is not None:
        raise ValueError("give either --reported-commit-len or --reported-accept-depth, not both")
    obs = gather(args)
    results = []
    for o in obs:
        base, base_sd, base_label = baseline(args, o)
        r, r_sd, r_label = cost(args, o)
        est = estimate_commit_length(o.tps, base, r, cost_factor_std=r_sd, tps_std=o.tps_std, baseline_std=base_sd)
        rep, rep_label = o.reported_commit_len, f"from {o.source}"
        if args.reported_commit_len is not None:
            rep, rep_label = args.reported_commit_len, "--reported-commit-len"
        elif args.reported_accept_depth is not None:
            rep, rep_label = args.reported_accept_depth + 1, "--reported-accept-depth + 1"
        v = verdict(est, rep, args.tolerance)
        res = {"label": o.label, "source": o.source, "concurrency": o.concurrency, "n_nodes": o.n_nodes,
               "samples": o.samples, "cost_factor_from": r_label, "baseline_from": base_label,
               "estimate": est.to_dict(), "reported_commit_len": rep, "reported_from": rep_label if rep else None,
               "verdict": v, "tolerance": args.tolerance}
        if rep is not None:
            pv, plo, phi = est.predicted_tps(rep)
            res["predicted_tps"] = {"value": round(pv, 3), "low": round(plo, 3), "high": round(phi, 3)}
        if est.value < 1:
            res["note"] = ("the estimate is below 1 token per step, which speculative decoding cannot do: the "
                           "baseline or the cost factor does not match this run")
        if o.extra.get("confounder"):
            res["confounder"] = o.extra["confounder"]
        if est.rel_std > 0.25:
            res["why_not_enough"] = f"the interval is too wide (relative sd {est.rel_std:.0%}) to judge any figure"
        elif rep is None:
            res["why_not_enough"] = "no reported commit length (give --reported-commit-len)"
        results.append(res)
    order = {INCONSISTENT: 2, NOT_ENOUGH_DATA: 1, CONSISTENT: 0}
    overall = max((r["verdict"] for r in results), key=lambda x: order[x])
    if args.output_format == "json":
        print(json.dumps({"verdict": overall, "results": results}))
    else:
        for res in results:
            print_text(res)
    return {CONSISTENT: 0, INCONSISTENT: 1, NOT_ENOUGH_DATA: 2}[overall]


def print_text(res, file=None) -> None:
    file = file or sys.stdout
    e = res["estimate"]
    head = res["label"] + (f" (c={res['concurrency']}, N={res['n_nodes']})"
                           if res.get("concurrency") or res.get("n_nodes") else "")
    print(f"{head}:", file=file)
    print(f"  observed {e['observed_tps']:.1f} tokens/s (sd {e['tps_std']:.1f}), baseline {e['baseline_tps']:.1f} "
          f"tokens/s (sd {e['baseline_std']:.1f}), cost factor r = {e['cost_factor']:.3f} (sd "
          f"{e['cost_factor_std']:.3f}, {res['cost_factor_from']})", file=file)
    print(f"  estimated commit length {e['value']:.2f}  95% [{e['low']:.2f}, {e['high']:.2f}]  "
          f"= {e['observed_tps']:.1f} / {e['baseline_tps']:.1f} * {e['cost_factor']:.3f}", file=file)
    if res.get("reported_commit_len") is not None:
        p = res["predicted_tps"]
        print(f"  reported commit length {res['reported_commit_len']:.2f} ({res['reported_from']}) would give "
              f"{p['value']:.1f} tokens/s [{p['low']:.1f}, {p['high']:.1f}]", file=file)
    for k in ("note", "confounder", "why_not_enough"):
        if res.get(k) and (k != "why_not_enough" or res["verdict"] == "not enough data"):
            print(f"  {k.replace('_', ' ')}: {res[k]}", file=file)
    print(f"  verdict: {res['verdict']} (tolerance {res['tolerance']:.0%})", file=file)
