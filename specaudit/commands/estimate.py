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
  # the seed question: which of two counters lies? Without a guessed r: each counter's
  # implied r = commit * baseline / observed (2.00 -> r 1.80, 7.00 -> r 7.19) against a band
  # for r, measured (--profile from `specaudit calibrate`) or from a hardware class
  specaudit estimate --observed-tps 109 --baseline-tps 98 --reported-commit-len 2 \\
      --reported-accept-depth 7 --profile cost.json --n-nodes 8 --concurrency 1
  specaudit estimate --observed-tps 109 --baseline-tps 98 --reported-commit-len 2 \\
      --reported-accept-depth 7 --hardware gpu --budget 7      # both possible: says what decides

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

Every result shows the r each counter implies beside a band for r and where the band
comes from (a measured profile, a hand-given factor, or --hardware gpu|cpu: bounds that
need no measurement); a counter is named only when its r is outside the band
(specaudit.audit.r_band).

Give both --reported-commit-len and --reported-accept-depth (a trace's run.json gives both)
and each is judged on its own, the identity commit = depth + 1 is checked, and the answer
ends with one sentence: which counter the throughput supports, which it contradicts, or
that it cannot tell and why. An estimate below 1 or above N (the verify width) is a
calibration or baseline mismatch, not a verdict on the engine. The library call is
specaudit.audit.estimate.run_estimate(...); this command only parses arguments.

Exit codes: 0 consistent, 1 inconsistent, 2 bad input, not enough data or calibration mismatch.
"""
from __future__ import annotations

import json
import sys

from specaudit.audit.compare import Printed
from specaudit.audit.estimate_model import DEFAULT_TOLERANCE  # numpy-free: read at CLI start-up

HELP = ("estimate the commit length from throughput; judge each reported counter by the step cost r it implies "
        "against a measured, given or hardware-class band")
ORDER = 35


def number(text: str) -> Printed:
    """A figure as typed (argparse's type: "invalid number value" names what is not one; a
    number out of range is refused by the library, which says what the range is)."""
    return Printed(text)


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
    g.add_argument("--profile", metavar="FILE",
                   help="cost profile JSON written by `specaudit calibrate` (measured r)")
    g.add_argument("--hardware", choices=["gpu", "cpu"],
                   help="no measured r: judge each counter by the r it implies against the plausible band of "
                        "this hardware class (gpu: memory-bound decode; cpu: compute-bound); needs --n-nodes "
                        "or a log that states N")
    g.add_argument("--n-nodes", type=int, help="verify nodes per step N = draft budget + 1 (for --profile, "
                                               "--hardware)")
    g.add_argument("--budget", type=int, help="drafted tokens per step (chain: k; tree: its node budget), "
                                              "the same as --n-nodes BUDGET+1")
    g.add_argument("--concurrency", type=int, help="running requests c (for --profile; for a log, use only "
                                                   "windows at this concurrency)")
    g = p.add_argument_group("the figure under audit")
    # a reported figure keeps the digits it was typed with: 7.0000 stands for 7.0000 +- 0.00005, 7.0
    # for 6.95 to 7.05 (specaudit.audit.compare.precision), as a figure read off a log line does
    g.add_argument("--reported-commit-len", type=number,
                   help="reported mean commit length / accept length, bonus token included (> 0); as printed: "
                        "its digits are its precision (2.0 stands for 1.95 to 2.05, 2.000 for 1.9995 to 2.0005)")
    g.add_argument("--reported-accept-depth", type=number,
                   help="reported mean accepted depth (drafts only, > 0); judged as depth + 1; may be given "
                        "with --reported-commit-len to ask which of the two counters is wrong")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help="relative slack around the interval for what the model leaves out "
                        f"(default {DEFAULT_TOLERANCE})")
    p.add_argument("--output-format", choices=["text", "json"], default="text")


# ------------------------------------------------------------------- main


def main(args) -> int:
    from specaudit.audit.estimate import format_text, run_estimate
    rep = run_estimate(args.input, observed_tps=args.observed_tps, observed_std=args.observed_std, load=args.load,
                       source=args.source, baseline_tps=args.baseline_tps, baseline_std=args.baseline_std,
                       baseline_file=args.baseline, baseline_from_profile=args.baseline_from_profile,
                       cost_factor=args.cost_factor, cost_factor_std=args.cost_factor_std, profile=args.profile,
                       n_nodes=args.n_nodes, budget=args.budget, concurrency=args.concurrency,
                       reported_commit_len=args.reported_commit_len,
                       reported_accept_depth=args.reported_accept_depth, tolerance=args.tolerance,
                       hardware=args.hardware)
    if args.output_format == "json":
        print(json.dumps(rep.to_dict()))
    else:
        sys.stdout.write("".join(format_text(r) for r in rep.results))
    return rep.exit_code
