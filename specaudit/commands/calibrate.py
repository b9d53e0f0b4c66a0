"""Measure the step cost factor r(N, c) and write a cost profile for `specaudit estimate`.

r = (t_draft + t_verify(c, N)) / t_ar(c): what one speculative step (draft, verify N nodes
at concurrency c, accept, commit) costs in plain decode steps at the same concurrency.

Examples:
  specaudit calibrate --out cost.json                                # the reference runtime, default grid
  specaudit calibrate --out cost.json --n-nodes 4,8 --concurrency 1,8 --repeats 5
  specaudit calibrate --out cost.json --cost-factor 1.5              # by hand (the seed's r)
  specaudit calibrate --out cost.json --from-traces traces/          # from a trace's draft_s/verify_s
  specaudit estimate traces/ --baseline-tps 400 --profile cost.json

The profile is a small JSON file: one entry per (N, c) with r, r_std (standard error over
the repeats) and the step times behind it. `estimate` interpolates inside the grid and
refuses an N or c outside it.
"""
from __future__ import annotations

import argparse
import json
import sys

from specaudit.audit.defaults import DEFAULT_C, DEFAULT_N, csv

HELP = "measure the step cost factor r(N, c) and write a cost profile"
EXTRA = "runtime"   # torch: pip install specaudit[runtime] (specaudit/commands/_extras.py)
ORDER = 36


def add_arguments(p) -> None:
    from specaudit.runtime.options import add_host_arguments, add_model_arguments
    p.add_argument("--out", metavar="FILE", required=True, help="profile JSON to write")
    g = p.add_argument_group("how (default: measure on the reference runtime)")
    g.add_argument("--cost-factor", type=float, help="write a hand-given r for every (N, c)")
    g.add_argument("--cost-factor-std", type=float, default=None, help="its spread (default 10%% of r)")
    g.add_argument("--from-traces", metavar="DIR", help="derive r from a trace dataset's draft_s + verify_s")
    g = p.add_argument_group("measurement")
    g.add_argument("--n-nodes", default=csv(DEFAULT_N),
                   help=f"verify nodes per step N = budget + 1, comma-separated (default {csv(DEFAULT_N)})")
    g.add_argument("--concurrency", default=csv(DEFAULT_C),
                   help=f"concurrency levels, comma-separated (default {csv(DEFAULT_C)})")
    g.add_argument("--repeats", type=int, default=3, help="measurements per (N, c), on different prompts (default 3)")
    g.add_argument("--max-new-tokens", type=int, default=96, help="tokens decoded per measurement (default 96)")
    add_host_arguments(g, dtype=False)  # --threads defaults to 1, as in run and serve
    add_model_arguments(p.add_argument_group("models (default: the embedded pair)"))
    p.add_argument("--output-format", choices=["text", "json"], default="text",
                   help="text (default) or json: also print the profile as JSON")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)   # old spelling of --output-format json


def main(args) -> int:
    from specaudit.audit.calibrate import format_profile, make_profile, parse_ints
    from specaudit.runtime.options import apply_host_options
    measuring = args.cost_factor is None and not args.from_traces
    if measuring:
        apply_host_options(args)
    show = sys.stderr.isatty()

    def progress(c, n, rep, r):
        if show:
            print(f"  c={c} N={n} repeat {rep + 1}: r = {r:.3f}", file=sys.stderr)
    grids = dict(n_grid=parse_ints(args.n_nodes), c_grid=parse_ints(args.concurrency)) if measuring else {}
    prof = make_profile(cost_factor=args.cost_factor, cost_factor_std=args.cost_factor_std,
                        from_traces=args.from_traces, **grids, repeats=args.repeats, max_new_tokens=args.max_new_tokens,
                        device=args.device, target=args.target, drafter=args.drafter,
                        trust_remote_code=args.trust_remote_code, progress=progress)
    if args.from_traces:
        from specaudit.outfile import guard_output
        guard_output(args.out, [args.from_traces], flag="--out")   # never over a file it read
    prof.save(args.out)
    if args.json or args.output_format == "json":
        print(json.dumps(prof.to_dict()))
        from specaudit.outfile import say_wrote
        say_wrote(args.out)
    else:
        sys.stdout.write(format_profile(prof, args.out))
    return 0
