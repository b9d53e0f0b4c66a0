"""Is speculative sampling lossless? Compare its output distribution with plain sampling.

Examples:
  specaudit lossless --temperature 0.8 --samples 400 --positions 8             # the reference runtime
  specaudit lossless --temperature 0.8 --algo tree --budget 12 --branching 3
  specaudit lossless --temperature 0.8 --inject temperature-one-side            # must exit 1
  specaudit lossless A/ B/ --positions 8          # two trace datasets with sampled output

With no datasets, each held-out prompt runs --samples times with plain sampling from
the target (A) and with speculative sampling (B), same transform (temperature, top-p,
top-k), and the token at each of the first --positions output positions is tested for
one distribution across the arms (chi-square test of homogeneity per prompt, summed
over prompts, Bonferroni over positions). With two datasets, their requests are grouped
by prompt; both must have sampled with the same parameters. The report gives the
p-value and how many samples per prompt and arm would detect --distortion of
probability moved between the two most likely tokens (power 0.8).

exit codes: 0 no difference detected, 1 the distributions differ, 2 usage or input error
"""
from __future__ import annotations

import json

from specaudit.cli_vocab import add_list_faults, hidden_alias

HELP = "test whether speculative sampling keeps the target's output distribution (two-sample test)"
EXTRA = "runtime"   # torch: pip install specaudit[runtime] (specaudit/commands/_extras.py)
ORDER = 35


def add_arguments(p) -> None:
    from specaudit.runtime.options import add_sampling_arguments
    p.add_argument("datasets", nargs="*", metavar="DATASET",
                   help="two trace datasets with sampled output (default: run the reference runtime)")
    p.add_argument("--positions", type=int, default=8, help="output positions tested (default 8)")
    p.add_argument("--alpha", type=float, default=0.01, help="significance level (default 0.01)")
    p.add_argument("--distortion", type=float, default=0.05,
                   help="probability moved between the two most likely tokens the sample size is "
                        "computed for (default 0.05)")
    p.add_argument("--output-format", choices=["text", "json"], default="text")
    g = p.add_argument_group("reference runtime (no datasets)")
    add_sampling_arguments(g)
    g.add_argument("--algo", choices=["chain", "tree"], default="chain")
    g.add_argument("--budget", type=int, default=7, help="draft nodes per step (default 7)")
    g.add_argument("--branching", dest="topk", type=int, default=None, metavar="N",
                   help="children per tree node (default: 1 chain, 3 tree); not the sampling --top-k")
    hidden_alias(g, "--topk", "topk", type=int)          # old spelling, one release
    g.add_argument("--samples", type=int, default=400, help="samples per prompt and arm (default 400)")
    g.add_argument("--num-prompts", type=int, default=2, help="held-out prompts (default 2)")
    g.add_argument("--prompt-len", type=int, default=48, help="each prompt's last N tokens (default 48)")
    g.add_argument("--concurrency", type=int, default=32, help="requests per batched forward (default 32)")
    g.add_argument("--seed", type=int, default=0, help="seed of arm A (arm B uses seed + 1)")
    g.add_argument("--inject", metavar="FAULT", default=None, help="run arm B with a fault (see --list-faults)")
    add_list_faults(g)
    g.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")


def main(args) -> int:
    from specaudit.audit import lossless

    if args.datasets and len(args.datasets) != 2:
        raise ValueError(f"give two datasets (A and B) or none, not {len(args.datasets)}")
    if args.datasets:
        res = lossless.compare_datasets(args.datasets[0], args.datasets[1], args.positions,
                                        alpha=args.alpha, distortion=args.distortion)
    else:
        from specaudit.runtime.host import set_torch_threads
        set_torch_threads(args.threads)
        topk = args.topk if args.topk is not None else (1 if args.algo == "chain" else min(3, args.budget))
        res = lossless.run_reference(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                     algo=args.algo, budget=args.budget, topk=topk, samples=args.samples,
                                     num_prompts=args.num_prompts, positions=args.positions, seed=args.seed,
                                     concurrency=args.concurrency, inject=args.inject, alpha=args.alpha,
                                     distortion=args.distortion, prompt_len=args.prompt_len)
    if args.output_format == "json":
        print(json.dumps(res.to_dict(), indent=1))
    else:
        print(res.text())
    return res.exit_code
