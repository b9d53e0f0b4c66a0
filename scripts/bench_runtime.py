"""Benchmark the reference runtime: plain greedy vs chain vs trees, traced vs untraced.

Everything is measured side by side in one run, interleaved round by round (so drift
and other load hit every configuration alike), on the embedded models at batch 1 with
held-out prompts. Prints one JSON object per configuration, then a last line with:
    speedup_chain        chain tokens/s (traced) / plain greedy tokens/s
    speedup_best_tree    best tree tokens/s (traced) / plain greedy tokens/s
    trace_overhead       1 - traced / untraced tokens/s (chain and trees pooled)
    mean_commit_len_chain, and the same figures per configuration.
    sampled_chain        per temperature (--temperatures, default 0.7 and 1.0): speculative
                         sampling on the chain against plain sampling from the target at the
                         same temperature (speedup, traced), and the tracing overhead of a
                         sampled run (contract v2 columns) pooled as trace_overhead_v2
    tracer_cpu_us_per_step   the tracer's own CPU time per step, measured directly after the
                         rounds (one traced chain run and one traced tree run, thread CPU
                         time): `record` on the decode thread, `convert` (steps_to_arrow, on
                         the worker, holding the GIL), `worker` (the worker thread in all,
                         sinks' Parquet writes included; those drop the GIL)
    load_avg_1m, cores, load_threshold, machine_quiet (scripts/benchutil.py): on a busy
                         machine the ratios (speedups, overheads) are withheld (null, and
                         `withheld` says why); the CPU figures above are kept

    python scripts/bench_runtime.py                 # ~3 minutes on 2 idle cores
    python scripts/bench_runtime.py --quick         # smoke run
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))   # scripts/: benchutil
from benchutil import add_json_out, guard_ratios, load_fields, quiet_machine, record  # noqa: E402  (the scripts folder on the path first)


def tracer_cpu(run, configs) -> dict:
    """The tracer's CPU time per step, read with thread CPU clocks around its own methods
    (a separate traced run per config, after the timed rounds: the clocks cost a little)."""
    from specaudit.trace import tracer as T
    acc = {"record": 0.0, "convert": 0.0, "worker": 0.0}
    rec0, work0, conv0 = T.Tracer.record_step, T.Tracer._worker, T.steps_to_arrow

    def record_step(self, **kw):
        c = time.thread_time()
        rec0(self, **kw)
        acc["record"] += time.thread_time() - c

    def worker(self):
        c = time.thread_time()
        try:
            work0(self)
        finally:
            acc["worker"] += time.thread_time() - c

    def convert(*a, **k):
        c = time.thread_time()
        out = conv0(*a, **k)
        acc["convert"] += time.thread_time() - c
        return out
    T.Tracer.record_step, T.Tracer._worker, T.steps_to_arrow = record_step, worker, convert
    out = {}
    try:
        for algo, budget, topk in configs:
            for k in acc:
                acc[k] = 0.0
            steps = run(algo, budget, topk)
            out[f"{algo}-b{budget}-k{topk}"] = {k: round(v / steps * 1e6, 1) for k, v in acc.items()}
    finally:
        T.Tracer.record_step, T.Tracer._worker, T.steps_to_arrow = rec0, work0, conv0
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts per measurement (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median is reported")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, as `specaudit run`)")
    ap.add_argument("--trees", default="15:4,31:4,15:2", help="tree budget:topk list")
    ap.add_argument("--temperatures", default="0.7,1.0", help="sampled chain temperatures ('' to skip)")
    ap.add_argument("--quick", action="store_true")
    add_json_out(ap, "runtime")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.max_new_tokens, args.rounds, args.trees = 1, 64, 1, "15:4"

    import torch
    torch.set_num_threads(args.threads)

    from specaudit.model import default_models
    from specaudit.runtime.engine import greedy_generate, sample_generate
    from specaudit.runtime.sampling import SamplingParams
    from specaudit.traced_run import default_prompts, encode, run_traced

    models = default_models()
    target = models[0]
    prompts = default_prompts()[: args.prompts]
    toks = [encode(p) for p in prompts]
    temps = [float(t) for t in args.temperatures.split(",") if t.strip()]
    configs = [("chain", 7, 1)] + [("tree", int(b), int(k)) for b, k in
                                   (t.split(":") for t in args.trees.split(","))]
    tmp = Path(tempfile.mkdtemp(prefix="bench-runtime-"))
    quiet_machine()
    samples: dict[str, list[float]] = {}
    commit: dict[str, float] = {}
    depth: dict[str, float] = {}
    lossless = True
    reference = None
    for rnd in range(args.rounds):
        outs, wall = greedy_generate(target, toks, args.max_new_tokens, target.eos_id)
        reference = reference or outs
        samples.setdefault("greedy", []).append(sum(len(o) for o in outs) / wall)
        for algo, budget, topk in configs:
            for traced in (False, True):
                name = f"{algo}-b{budget}-k{topk}-{'traced' if traced else 'untraced'}"
                res = run_traced(algo=algo, budget=budget, topk=topk, prompts=prompts,
                                 num_prompts=len(prompts), max_new_tokens=args.max_new_tokens,
                                 models=models, trace=traced, out=tmp if traced else None,
                                 run_id=f"{name}-r{rnd}")
                lossless &= res.outputs == reference
                samples.setdefault(name, []).append(res.summary["tokens"] / res.wall_s)
                commit[name] = res.summary["mean_commit_len"]
                depth[name] = res.summary["mean_accepted_depth"]
        for temp in temps:
            outs, wall = sample_generate(target, toks, args.max_new_tokens, target.eos_id,
                                         SamplingParams(temp, seed=rnd))
            samples.setdefault(f"plain-T{temp}", []).append(sum(len(o) for o in outs) / wall)
            for traced in (False, True):
                name = f"sampled-chain-T{temp}-{'traced' if traced else 'untraced'}"
                res = run_traced(algo="chain", budget=7, topk=1, prompts=prompts, num_prompts=len(prompts),
                                 max_new_tokens=args.max_new_tokens, models=models, trace=traced,
                                 out=tmp if traced else None, run_id=f"{name}-r{rnd}", temperature=temp,
                                 seed=rnd)
                samples.setdefault(name, []).append(res.summary["tokens"] / res.wall_s)
                commit[name] = res.summary["mean_commit_len"]
                depth[name] = res.summary["mean_accepted_depth"]
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    load = load_fields()   # read right after the measured rounds
    cpu = tracer_cpu(lambda algo, budget, topk: run_traced(
        algo=algo, budget=budget, topk=topk, prompts=prompts, num_prompts=len(prompts),
        max_new_tokens=args.max_new_tokens, models=models, trace=True, out=tmp,
        run_id=f"cpu-{algo}-b{budget}-k{topk}").summary["steps"], configs[:2])
    med = {k: statistics.median(v) for k, v in samples.items()}
    base = med["greedy"]
    rows = []
    for algo, budget, topk in configs:
        t, u = f"{algo}-b{budget}-k{topk}-traced", f"{algo}-b{budget}-k{topk}-untraced"
        row = {"config": f"{algo}-b{budget}-k{topk}", "tokens_per_s_traced": round(med[t], 1),
               "tokens_per_s_untraced": round(med[u], 1), "speedup_traced": round(med[t] / base, 3),
               "trace_overhead": round(1 - med[t] / med[u], 4), "mean_commit_len": commit[t],
               "mean_accepted_depth": depth[t]}
        rows.append(row)
        print(json.dumps(row))
    trees = [r for r in rows if r["config"].startswith("tree")]
    best_tree = max(trees, key=lambda r: r["speedup_traced"]) if trees else None
    traced_sum = sum(med[f"{r['config']}-traced"] for r in rows)
    untraced_sum = sum(med[f"{r['config']}-untraced"] for r in rows)
    chain_commit = rows[0]["mean_commit_len"]
    sampled = {}
    for temp in temps:
        t, u, pl = f"sampled-chain-T{temp}-traced", f"sampled-chain-T{temp}-untraced", f"plain-T{temp}"
        row = {"config": f"sampled-chain-b7-T{temp}", "tokens_per_s_traced": round(med[t], 1),
               "tokens_per_s_untraced": round(med[u], 1), "plain_sampling_tokens_per_s": round(med[pl], 1),
               "speedup_traced": round(med[t] / med[pl], 3), "trace_overhead": round(1 - med[t] / med[u], 4),
               "mean_commit_len": commit[t], "mean_accepted_depth": depth[t]}
        sampled[str(temp)] = row
        print(json.dumps(row))
    v2_t = sum(med[f"sampled-chain-T{t}-traced"] for t in temps)
    v2_u = sum(med[f"sampled-chain-T{t}-untraced"] for t in temps)
    summary = {
        "greedy_tokens_per_s": round(base, 1),
        "speedup_chain": rows[0]["speedup_traced"],
        "speedup_best_tree": best_tree["speedup_traced"] if best_tree else None,
        "best_tree": best_tree["config"] if best_tree else None,
        "trace_overhead": round(1 - traced_sum / untraced_sum, 4),
        "mean_commit_len_chain": chain_commit,
        "max_tree_commit_len": max((r["mean_commit_len"] for r in trees), default=None),
        "tree_commits_more_than_chain": any(r["mean_commit_len"] > chain_commit for r in trees),
        "lossless": lossless,
        "speedup_sampled_chain": {k: r["speedup_traced"] for k, r in sampled.items()},
        "trace_overhead_v2": round(1 - v2_t / v2_u, 4) if temps else None,
        "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
        "batch": 1, "torch_threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"),
        "tracer_cpu_us_per_step": cpu,
        **load,
    }
    print(json.dumps(guard_ratios(summary, ["speedup_chain", "speedup_best_tree", "trace_overhead",
                                            "speedup_sampled_chain", "trace_overhead_v2"])))
    record("runtime", summary, args.json_out)


if __name__ == "__main__":
    main()
