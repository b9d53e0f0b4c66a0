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

HELP = "measure the step cost factor r(N, c) and write a cost profile"
ORDER = 36


def _ints(s: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {s!r}") from None
    if not out or any(x < 1 for x in out):
        raise ValueError(f"expected positive integers, got {s!r}")
    return out


def add_arguments(p) -> None:
    from specaudit.runtime.options import add_host_arguments, add_model_arguments
    p.add_argument("--out", metavar="FILE", required=True, help="profile JSON to write")
    g = p.add_argument_group("how (default: measure on the reference runtime)")
    g.add_argument("--cost-factor", type=float, help="write a hand-given r for every (N, c)")
    g.add_argument("--cost-factor-std", type=float, default=None, help="its spread (default 10%% of r)")
    g.add_argument("--from-traces", metavar="DIR", help="derive r from a trace dataset's draft_s + verify_s")
    g = p.add_argument_group("measurement")
    g.add_argument("--n-nodes", default=",".join(map(str, (2, 4, 8, 9, 13, 16))),
                   help="verify nodes per step N = budget + 1, comma-separated (default 2,4,8,9,13,16)")
    g.add_argument("--concurrency", default="1,4,8", help="concurrency levels, comma-separated (default 1,4,8)")
    g.add_argument("--repeats", type=int, default=3, help="measurements per (N, c), on different prompts (default 3)")
    g.add_argument("--max-new-tokens", type=int, default=96, help="tokens decoded per measurement (default 96)")
    add_host_arguments(g, dtype=False)  # --threads defaults to 1, as in run and serve
    add_model_arguments(p.add_argument_group("models (default: the embedded pair)"))
    p.add_argument("--output-format", choices=["text", "json"], default="text",
                   help="text (default) or json: also print the profile as JSON")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)   # old spelling of --output-format json


def main(args) -> int:
    from specaudit.audit.estimate import CostProfile
    from specaudit.runtime.options import apply_host_options
    if sum(x is not None for x in (args.cost_factor, args.from_traces)) > 1:
        raise ValueError("give at most one of --cost-factor and --from-traces")
    if args.cost_factor is not None:
        prof = CostProfile.manual(args.cost_factor, args.cost_factor_std)
    elif args.from_traces:
        from specaudit.audit.calibrate import profile_from_traces
        prof = profile_from_traces(args.from_traces, device=args.device)
    else:

        from specaudit.audit.calibrate import measure_profile
        apply_host_options(args)
        n_grid, c_grid = _ints(args.n_nodes), _ints(args.concurrency)
        show = sys.stderr.isatty()

        def progress(c, n, rep, r):
            if show:
                print(f"  c={c} N={n} repeat {rep + 1}: r = {r:.3f}", file=sys.stderr)
        models = None
        if args.target:  # Hugging Face checkpoints: the drafter drafts up to the largest N - 1
            from specaudit.runtime.hf import load_models
            models = load_models(args.target, args.drafter, device=args.device, budget=max(n_grid) - 1,
                                 trust_remote_code=args.trust_remote_code)
        elif args.drafter:
            raise ValueError("--drafter needs --target hf:PATH_OR_ID")
        prof = measure_profile(models=models, n_grid=n_grid, c_grid=c_grid, repeats=args.repeats,
                               max_new_tokens=args.max_new_tokens, device=args.device, progress=progress)
    if args.from_traces:
        from specaudit.outfile import guard_output
        guard_output(args.out, [args.from_traces], flag="--out")   # never over a file it read
    prof.save(args.out)
    if args.json or args.output_format == "json":
        print(json.dumps(prof.to_dict()))
    else:
        print(f"cost profile ({prof.source}, {prof.coverage()}) -> {args.out}")
        for e in prof.entries:
            where = "any N, any c" if e.n_nodes is None else f"N={e.n_nodes:<3d} c={e.concurrency:<3d}"
            times = (f"  t_ar {e.t_ar_s * 1e3:.2f} ms" if e.t_ar_s else "")
            print(f"  {where}  r = {e.r:.3f} (sd {e.r_std:.3f}){times}")
    return 0
