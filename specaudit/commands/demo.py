"""The main job on the embedded models: run, trace, check, break, estimate, report.

    specaudit demo                      # writes ./specaudit-demo/
    specaudit demo --out /tmp/demo      # somewhere else

1. runs chain speculative decoding (block of 8) and a branching tree on held-out
   prompts with the plain-greedy oracle into ./specaudit-demo/traces/ and prints each
   run's summary (steps, mean accepted depth, mean commit length, tokens/s, speedup);
2. checks those traces with the full invariant catalog (expect: clean, lossless);
3. runs the chain again with the seed bug injected (`--inject commit-counter`: mean
   accepted depth 7 next to mean commit length ~2) into ./specaudit-demo/injected/
   and checks it, to show what a violation looks like;
4. cross-checks both runs' reported commit length against their measured throughput
   (the estimator), and
5. writes ./specaudit-demo/report/report.html over both datasets.
Exit 0 when all of that held: the clean runs checked clean and lossless, the injected bug
named by SA301, SA506 and SA507, the report written; 1 (with the reason) otherwise.
"""
from __future__ import annotations

HELP = "run the main job on the embedded models (chain + tree, traced) and summarise"
EXTRA = "demo"   # torch and matplotlib: pip install specaudit[demo] (specaudit/commands/_extras.py)
ORDER = 5


def add_arguments(p) -> None:
    p.add_argument("--out", default="specaudit-demo", help="demo folder (default ./specaudit-demo)")
    p.add_argument("--num-prompts", type=int, default=4, help="prompts per run (default 4)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens per request (default 128)")
    p.add_argument("--keep", action="store_true", help="keep an existing demo folder's traces (default: replace)")
    from specaudit.runtime.options import add_host_arguments
    add_host_arguments(p.add_argument_group("machine"))


def main(args) -> int:
    from specaudit.demo import run_demo
    from specaudit.runtime.options import apply_host_options
    apply_host_options(args)
    return run_demo(args.out, keep=args.keep, num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens,
                    device=args.device, dtype=args.dtype)
