"""Run chain or tree speculative decoding on the embedded models and trace every step.

Examples:
  specaudit run --algo chain --budget 7 --out traces/
  specaudit run --algo tree --budget 15 --topk 4 --concurrency 4 --oracle --out traces/
  specaudit run --algo chain --inject commit-counter --out traces/   # a known bug
  specaudit run --list-faults

Each run adds its own partition (run_id=<id>/) to the dataset folder given by --out,
which many runs may share. --oracle also decodes plainly (greedy) and records the
reference tokens, so `specaudit check` can prove the run lossless, and the summary
shows the speedup over plain greedy.
"""
from __future__ import annotations

import json
import sys

HELP = "run the reference runtime (chain or tree) and write a trace dataset"
ORDER = 10


def add_runtime_arguments(p) -> None:
    """Options shared by run, serve and ab."""
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--algo", choices=["chain", "tree"], default="chain",
                   help="chain: DFlash-style block; tree: DDTree-style best-first tree (default chain)")
    g.add_argument("--budget", type=int, default=7,
                   help="draft nodes per step, root excluded (chain: block size - 1; default 7)")
    g.add_argument("--topk", type=int, default=None,
                   help="most children per tree node (default: 1 for chain, 4 for tree)")
    g.add_argument("--concurrency", type=int, default=1, help="requests verified per batched forward (default 1)")
    g.add_argument("--max-new-tokens", type=int, default=256, help="output tokens per request (default 256)")
    g.add_argument("--inject", metavar="FAULT", default=None,
                   help="inject a known metric/runtime bug (see --list-faults)")
    g.add_argument("--seed", type=int, default=0, help="seed (prompt order; default 0)")
    g.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads on CPU (default 1: decode-sized ops on a small model "
                        "run fastest on one thread, and extra OpenMP threads spin under contention)")
    g.add_argument("--eos-id", type=int, default=None,
                   help="token that ends a request (default: the model's EOS, byte 0)")


def set_threads(args) -> None:
    if args.threads < 1:
        raise ValueError(f"--threads must be at least 1 (got {args.threads})")
    import torch
    torch.set_num_threads(args.threads)


def resolve_topk(args) -> int:
    if args.topk is not None:
        return args.topk
    return 1 if args.algo == "chain" else min(4, args.budget)


def add_arguments(p) -> None:
    add_runtime_arguments(p)
    p.add_argument("--num-prompts", type=int, default=8, help="requests to run (default 8)")
    p.add_argument("--prompts", metavar="FILE", help="JSONL ({\"prompt\": ...} per line) or text, one prompt a line "
                                                     "(default: the embedded held-out prompts)")
    p.add_argument("--oracle", action="store_true", help="also decode plainly and record reference_tokens")
    p.add_argument("--out", metavar="DIR", help="dataset folder (required unless --list-faults)")
    p.add_argument("--run-id", help="run id (default: config + timestamp)")
    p.add_argument("--flush-steps", type=int, default=4096, help="flush step rows every N rows (default 4096)")
    p.add_argument("--flush-seconds", type=float, default=5.0, help="... or every S seconds (default 5)")
    p.add_argument("--list-faults", action="store_true", help="list injectable faults and exit")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def print_summary(s: dict, file=None) -> None:
    line = (f"{s['run_id']}: {s['requests']} requests, {s['steps']} steps, "
            f"mean accepted depth {s['mean_accepted_depth']:.2f}, "
            f"mean commit length {s['mean_commit_len']:.2f}, {s['tokens_per_s']:.1f} tokens/s")
    if "speedup" in s:
        line += (f", {s['speedup']:.2f}x plain greedy ({s['greedy_tokens_per_s']:.1f} tokens/s), "
                 f"lossless: {'yes' if s['lossless'] else 'NO'}")
    print(line, file=file or sys.stdout)


def main(args) -> int:
    if args.list_faults:
        from ..runtime.faults import describe_faults
        print(describe_faults())
        return 0
    if not args.out:
        raise ValueError("--out DIR is required (the dataset folder)")
    from ..run import run_traced
    res = run_traced(threads=args.threads, algo=args.algo, budget=args.budget, topk=resolve_topk(args),
                     concurrency=args.concurrency, num_prompts=args.num_prompts,
                     max_new_tokens=args.max_new_tokens, prompts_file=args.prompts, oracle=args.oracle,
                     inject=args.inject, seed=args.seed, device=args.device, dtype=args.dtype,
                     out=args.out, run_id=args.run_id, eos_id=args.eos_id,
                     progress=not args.no_progress and sys.stderr.isatty(),
                     flush_steps=args.flush_steps, flush_s=args.flush_seconds)
    if args.json:
        print(json.dumps(res.summary))
    else:
        print_summary(res.summary)
        print(f"trace: {res.run_dir}")
    return 0
