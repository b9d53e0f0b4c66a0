"""Run two runtime configurations on the same prompts, interleaved, and say which is better.

Examples:
  # the seed case: must a topk=1 tree equal the chain? (expect "same" acceptance)
  specaudit ab --a="--algo chain --budget 7" --b="--algo tree --budget 7 --topk 1" --out ab/
  # a branching tree against the chain, 4 repeats, on your prompts
  specaudit ab --a="--algo chain" --b="--algo tree --budget 15 --topk 4" --vary algo,budget,topk \\
      --prompts prompts.jsonl --repeats 4 --out ab2/
  # a confounded comparison: warns that concurrency changed along with the algorithm
  specaudit ab --a="--algo chain" --b="--algo tree --topk 1 --concurrency 4" --vary algo --out ab3/

--a and --b take `specaudit run` options (--algo, --budget, --topk, --concurrency,
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

import json
import sys

HELP = "A/B two runtime configurations on the same prompts, interleaved, with bootstrap intervals"
ORDER = 45


def add_arguments(p) -> None:
    p.add_argument("--a", required=True, metavar="RUN_ARGS", help="arm A: `specaudit run` options, quoted")
    p.add_argument("--b", required=True, metavar="RUN_ARGS", help="arm B: `specaudit run` options, quoted")
    p.add_argument("--prompts", metavar="FILE", help="JSONL ({\"prompt\": ...} per line) or text, one prompt a "
                                                     "line (default: the embedded held-out prompts)")
    p.add_argument("--num-prompts", type=int, default=8, help="prompts to run in each arm (default 8)")
    p.add_argument("--repeats", type=int, default=2, help="runs per arm, interleaved (default 2)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder: a/, b/ and ab.json")
    p.add_argument("--vary", metavar="SETTING[,SETTING]",
                   help="the setting(s) the experiment means to compare; others that differ are warned about")
    p.add_argument("--primary", choices=["accepted_depth", "commit_len", "tokens_per_s"], default="tokens_per_s",
                   help="the metric of the overall verdict (default tokens_per_s)")
    p.add_argument("--same-within", type=float, default=0.02, metavar="FRAC",
                   help="'same' when the 95%% interval of B - A lies within this fraction of A (default 0.02)")
    p.add_argument("--bootstrap", type=int, default=2000, metavar="N", help="bootstrap resamples (default 2000)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")


def main(args) -> int:
    from specaudit.audit.ab import format_text, parse_arm, run_ab, stderr_log
    from specaudit.run import default_prompts, load_prompts

    if args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be at least 1 (got {args.num_prompts})")
    if args.bootstrap < 100:
        raise ValueError(f"--bootstrap must be at least 100 (got {args.bootstrap})")
    if not 0 <= args.same_within < 1:
        raise ValueError(f"--same-within must be a fraction in [0, 1) (got {args.same_within})")
    a, b = parse_arm(args.a, "a"), parse_arm(args.b, "b")
    texts = load_prompts(args.prompts) if args.prompts else default_prompts()
    texts = (texts * (args.num_prompts // len(texts) + 1))[:args.num_prompts]
    vary = [v.strip() for v in args.vary.split(",") if v.strip()] if args.vary else None
    log = None if args.no_progress else stderr_log
    res = run_ab(a, b, prompts=texts, repeats=args.repeats, out=args.out, vary=vary,
                 same_within=args.same_within, n_boot=args.bootstrap, primary=args.primary, log=log)
    if args.json:
        print(json.dumps(res))
    else:
        print(format_text(res))
        for w in res["warnings"]:
            print(f"specaudit ab: warning: {w}", file=sys.stderr)
    return 0
