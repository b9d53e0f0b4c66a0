"""A/B: two engines' evidence compared fairly, or two runtime configurations run side by side.

Evidence mode, `specaudit ab A B`: A and B are anything `specaudit check` reads (trace
datasets, SGLang/vLLM/llama.cpp logs, JSON records, Prometheus scrape files, or a
Prometheus server's range as URL?match=...&range=6h&step=30s&timeout=30s), each one path, a
comma-separated list or a quoted glob, one engine per side. Nothing is rerun: the
windows of each side are matched by stratum (concurrency, cuda graph, rank, k, topk,
algo, engine, version, model) and compared only where both sides have windows; see
specaudit/audit/ab_evidence/.
  specaudit ab linear.log ddtree.log                      # is B really worse, and is it fair?
  specaudit ab "a-dp0.log,a-dp1.log" b.log --output-format json -o ab.json
  specaudit ab "traces/run_id=chain-*" "traces/run_id=tree-*" --vary algo
  specaudit ab 'http://127.0.0.1:9090?match={job="a"}&range=6h' 'http://127.0.0.1:9090?match={job="b"}&range=6h'
  specaudit ab a.log b.log --baseline-tps 1=98,8=90 --cost-factor 1.5,1.7 --primary commit_len_tput
It prints, first, when the pooled figures disagree with the matched ones (Simpson's
paradox); then per matched stratum each metric for A and B with bootstrap 95% intervals
over windows, B - A and a verdict (same / A better / B better / undecided); the strata
one side only has (never compared); what differs between the sides and how much of the
pooled gap each explains; and one closing sentence. Exit 0 done, 2 bad input (no shared
stratum: what would make them comparable; mixed engines on a side; windows without a
running-request count; empty or unreadable files).

Runtime mode, `--a/--b`: run two configurations of the reference runtime.
Examples:
  # the seed case: must a topk=1 tree equal the chain? (expect "same" acceptance)
  specaudit ab --a="--algo chain --budget 7" --b="--algo tree --budget 7 --branching 1" --out ab/
  # a branching tree against the chain, 4 repeats, on your prompts
  specaudit ab --a="--algo chain" --b="--algo tree --budget 15 --branching 4" --vary algo,budget,topk \\
      --prompts prompts.jsonl --repeats 4 --out ab2/
  # a confounded comparison: warns that concurrency changed along with the algorithm
  specaudit ab --a="--algo chain" --b="--algo tree --branching 1 --concurrency 4" --vary algo --out ab3/

--a and --b take `specaudit run` options (--algo, --budget, --branching, --concurrency,
--max-new-tokens, --inject, --seed, --device, --dtype, --eos-id) as one quoted string; write
--a="..." so the shell and the parser keep it whole. Both arms run the same prompts
(--prompts or the embedded held-out set, --num-prompts of them); the repeats alternate the
order, A B then B A, so a drift of the machine lands on both arms.

For each arm: mean accepted depth, mean commit length (both from the trace rows, not the
engine's counters) and tokens/s, each with a bootstrap 95% interval over requests (and
repeats: a busy machine slows a whole run at once); the difference B - A with its
interval (paired: the same resample for both arms); and a verdict
per metric: same (the interval lies within --same-within of A), A better, B better, or
undecided. Every setting in which A and B differ is named, and a warning says when more
differ than --vary names (concurrency, device, dtype, batch change speed on their own).

Writes OUT/a and OUT/b (trace datasets, one run per repeat; `specaudit diff` them) and
OUT/ab.json. Exit codes: 0 done, 2 usage or input error.
"""
from __future__ import annotations

import argparse
import json
import sys

from specaudit.ab_verdict import SAME_WITHIN
from specaudit.audit.defaults import MIN_WINDOWS, WINDOW_FORWARDS

HELP = ("A/B from evidence (`ab A B`: two engines' logs, scrapes or traces, matched by stratum) or by rerunning "
        "(`ab --a ARGS --b ARGS`: two runtime configurations on the same prompts)")
ORDER = 45


def add_arguments(p) -> None:
    p.add_argument("sides", nargs="*", metavar="SIDE",
                   help="evidence mode: A then B, each a path, comma-separated paths or a quoted glob")
    p.add_argument("--a", metavar="RUN_ARGS", help="runtime mode, arm A: `specaudit run` options, quoted")
    p.add_argument("--b", metavar="RUN_ARGS", help="runtime mode, arm B: `specaudit run` options, quoted")
    p.add_argument("--prompts", metavar="FILE", help="JSONL ({\"prompt\": ...} per line) or text, one prompt a "
                                                     "line (default: the embedded held-out prompts)")
    p.add_argument("--num-prompts", type=int, default=8, help="prompts to run in each arm (default 8)")
    p.add_argument("--repeats", type=int, default=2, help="runs per arm, interleaved (default 2)")
    p.add_argument("--out", metavar="DIR", help="runtime mode (required): output folder: a/, b/ and ab.json")
    p.add_argument("--vary", metavar="SETTING[,SETTING]",
                   help="the setting(s) the experiment means to compare; others that differ are warned about")
    p.add_argument("--primary", choices=["accepted_depth", "commit_len", "tokens_per_s", "accept_len", "accept_rate",
                                         "commit_len_tput"], default=None,
                   help="the metric of the overall verdict (runtime default tokens_per_s: accepted_depth, commit_len, "
                        "tokens_per_s; evidence default accept_len: accept_len, accept_rate, tokens_per_s, "
                        "commit_len_tput)")
    p.add_argument("--same-within", type=float, default=SAME_WITHIN, metavar="FRAC",
                   help="'same' when the 95%% interval of B - A lies within this fraction of A "
                        f"(default {SAME_WITHIN:g})")
    p.add_argument("--bootstrap", type=int, default=2000, metavar="N", help="bootstrap resamples (default 2000)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)   # old spelling of --output-format json
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    g = p.add_argument_group("evidence mode (specaudit ab A B)")
    g.add_argument("--output-format", choices=["text", "json"], default="text",
                   help="text (default) or json (both modes)")
    g.add_argument("-o", "--output", metavar="FILE", help="write the result to FILE (json: the input of "
                                                         "`specaudit report --ab`) instead of stdout")
    g.add_argument("--source", metavar="NAME",
                   help="read every file as this kind of engine output (a `specaudit check --source` name) "
                        "instead of detecting it")
    g.add_argument("--bootstrap-seed", type=int, default=0, metavar="N", help="bootstrap seed (default 0)")
    g.add_argument("--concurrency-bins", choices=["pow2", "exact"], default="pow2",
                   help="running requests binned 1, 2, 3-4, 5-8, ... (default) or matched exactly")
    g.add_argument("--window-forwards", type=int, default=WINDOW_FORWARDS, metavar="N",
                   help=f"trace datasets: verify forwards per window (default {WINDOW_FORWARDS})")
    g.add_argument("--min-windows", type=int, default=MIN_WINDOWS, metavar="N",
                   help=f"windows each side needs in a stratum to compare it (default {MIN_WINDOWS})")
    g.add_argument("--baseline-tps", metavar="TPS|C=TPS,...",
                   help="plain decoding tokens/s per request, one number or per concurrency (1=98,8=90): "
                        "with --cost-factor adds the throughput-derived commit length")
    g.add_argument("--cost-factor", metavar="R|RA,RB", help="verify step cost / plain step, one or one per side")


def main_evidence(args) -> int:
    """`specaudit ab A B`: the library call and its output; exit 0 (bad input raises: exit 2)."""
    from specaudit.audit.ab_evidence import compare_sides
    from specaudit.audit.ab_evidence.text import format_text, to_json
    from specaudit.traced_ab import parse_vary
    if len(args.sides) != 2:
        raise ValueError(f"give two sides, A and B (got {len(args.sides)}); several files on one side go "
                         "comma-separated or as a quoted glob")
    if args.a is not None or args.b is not None:
        raise ValueError("give either two sides (evidence) or --a/--b (runtime arms), not both")
    res = compare_sides(args.sides[0], args.sides[1], source=args.source, vary=parse_vary(args.vary),
                        same_within=args.same_within,
                        n_boot=args.bootstrap, seed=args.bootstrap_seed, primary=args.primary or "accept_len",
                        bins=args.concurrency_bins, window_forwards=args.window_forwards,
                        min_windows=args.min_windows, baseline_tps=args.baseline_tps, cost_factor=args.cost_factor)
    text = to_json(res) if (args.output_format == "json" or args.json) else format_text(res) + "\n"
    if args.output:
        from specaudit.audit.ab_evidence.sides import expand_side
        from specaudit.outfile import write_output
        inputs = [str(p) for side in args.sides for p in expand_side(side)]  # each file of each side
        write_output(args.output, text, inputs=inputs)   # never over a file it read
    else:
        sys.stdout.write(text)
    return 0


def main(args) -> int:
    if args.sides:
        return main_evidence(args)
    if args.a is None or args.b is None:
        raise ValueError("give two sides to compare (specaudit ab A B: logs, scrapes or trace datasets) "
                         "or both --a and --b (runtime arms)")
    if args.out is None:
        raise ValueError("runtime mode (--a/--b) needs --out DIR")
    from specaudit.traced_ab import format_text, run_arms, stderr_log
    res = run_arms(args.a, args.b, out=args.out, prompts_file=args.prompts, num_prompts=args.num_prompts,
                   repeats=args.repeats, vary=args.vary, same_within=args.same_within, n_boot=args.bootstrap,
                   primary=args.primary, log=None if args.no_progress else stderr_log)
    if args.json or args.output_format == "json":
        print(json.dumps(res))
    else:
        print(format_text(res))
        for w in res["warnings"]:
            print(f"specaudit ab: warning: {w}", file=sys.stderr)
    from specaudit.outfile import say_wrote
    say_wrote(f"{args.out}/ab.json")          # beside the a/ and b/ trace datasets
    return 0
