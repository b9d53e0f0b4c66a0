"""Run chain or tree speculative decoding on the embedded models and trace every step.

Examples:
  specaudit run --algo chain --budget 7 --out traces/
  specaudit run --algo tree --budget 15 --branching 4 --concurrency 4 --oracle --out traces/
  specaudit run --algo chain --inject commit-counter --out traces/   # a known bug
  specaudit run --list-faults
  specaudit run --temperature 0.7 --top-p 0.95 --seed 3 --out traces/   # speculative sampling

Each run adds its own partition (run_id=<id>/) to the dataset folder given by --out,
which many runs may share. --oracle also decodes plainly (greedy) and records the
reference tokens, so `specaudit check` can prove the run lossless, and the summary
shows the speedup over plain greedy.
"""
from __future__ import annotations

import argparse
import json
import sys

from specaudit.runtime.options import (
    add_runtime_arguments,
    add_sampling_arguments,
    apply_host_options,
    model_kwargs,
    resolve_topk,
    sampling_kwargs,
)

HELP = "run the reference runtime (chain or tree) and write a trace dataset"
EXTRA = "runtime"   # torch: pip install specaudit[runtime] (specaudit/commands/_extras.py)
ORDER = 10


def add_arguments(p) -> None:
    add_runtime_arguments(p)
    add_sampling_arguments(p.add_argument_group("speculative sampling"))
    p.add_argument("--num-prompts", type=int, default=8, help="requests to run (default 8)")
    p.add_argument("--prompts", metavar="FILE", help="JSONL ({\"prompt\": ...} per line) or text, one prompt a line "
                                                     "(default: the embedded held-out prompts)")
    p.add_argument("--oracle", action="store_true", help="also decode plainly and record reference_tokens")
    p.add_argument("--out", metavar="DIR", help="dataset folder (required unless --list-faults)")
    p.add_argument("--run-id", help="run id (default: config + timestamp)")
    p.add_argument("--flush-steps", type=int, default=4096, help="flush step rows every N rows (default 4096)")
    p.add_argument("--flush-seconds", type=float, default=5.0, help="... or every S seconds (default 5)")
    p.add_argument("--output-format", choices=["text", "json"], default="text",
                   help="text (default) or json: the summary as one JSON object")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)   # old spelling of --output-format json
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def print_summary(s: dict, file=None) -> None:
    from specaudit.audit.run_summary import summary_line
    print(summary_line(s), file=file or sys.stdout)


def main(args) -> int:
    if not args.out:
        raise ValueError("--out DIR is required (the dataset folder)")
    apply_host_options(args)
    import signal

    from specaudit.interrupts import terminate_as_interrupt
    old = terminate_as_interrupt()   # SIGTERM: the final flush runs (specaudit.traced_run), then exit 143
    try:
        res = _run(args)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    if args.json or args.output_format == "json":
        print(json.dumps(res.summary))
    else:
        print_summary(res.summary)
        print(f"trace: {res.run_dir}")
    return 0


def _run(args):
    from specaudit.traced_run import run_traced
    return run_traced(threads=args.threads, algo=args.algo, budget=args.budget, topk=resolve_topk(args),
                     concurrency=args.concurrency, num_prompts=args.num_prompts,
                     max_new_tokens=args.max_new_tokens, prompts_file=args.prompts, oracle=args.oracle,
                     inject=args.inject, seed=args.seed, device=args.device, dtype=args.dtype,
                     out=args.out, run_id=args.run_id, eos_id=args.eos_id,
                     progress=not args.no_progress and sys.stderr.isatty(),
                     flush_steps=args.flush_steps, flush_s=args.flush_seconds, **sampling_kwargs(args),
                     **model_kwargs(args))
