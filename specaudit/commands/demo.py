"""The main job on the embedded models: run chain and tree, trace, and summarise.

    specaudit demo                      # writes ./specaudit-demo/
    specaudit demo --out /tmp/demo      # somewhere else

Runs chain speculative decoding (block of 8) and a branching tree on held-out prompts
with the plain-greedy oracle, writes both traces into one dataset folder, and prints
each run's summary: steps, mean accepted depth, mean commit length, tokens/s and the
speedup over plain greedy. Takes about a minute on 2 CPU cores.
"""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

HELP = "run the main job on the embedded models (chain + tree, traced) and summarise"
ORDER = 5


def add_arguments(p) -> None:
    p.add_argument("--out", default="specaudit-demo", help="demo folder (default ./specaudit-demo)")
    p.add_argument("--num-prompts", type=int, default=4, help="prompts per run (default 4)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens per request (default 128)")
    p.add_argument("--keep", action="store_true", help="keep an existing demo folder's traces (default: replace)")


def main(args) -> int:
    from ..model import default_models
    from ..run import run_traced
    from .run import print_summary

    out = Path(args.out)
    traces = out / "traces"
    if traces.exists() and not args.keep:
        shutil.rmtree(traces)
    t0 = time.time()
    models = default_models()
    print(f"specaudit demo: traces in {traces}/", flush=True)
    common = dict(num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, oracle=True,
                  out=traces, models=models, progress=sys.stderr.isatty())
    runs = [
        run_traced(algo="chain", budget=7, topk=1, **common),
        run_traced(algo="tree", budget=15, topk=4, **common),
    ]
    for r in runs:
        print_summary(r.summary)
    print(f"demo finished in {time.time() - t0:.0f}s; traces: {traces}")
    return 0
