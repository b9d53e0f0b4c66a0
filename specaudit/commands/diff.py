"""Find where two runs of the same prompts first diverge, and say why: draft, verify or metric.

Examples:
  specaudit diff traces/run_id=chain-b7-... traces/run_id=tree-b7-k1-...   # should be clean
  specaudit diff clean/ faulty/ --output-format json
  specaudit diff ab/a/run_id=a-r0-... ab/b/run_id=b-r0-... --examples 10

A and B are run folders (run_id=<id>/) or dataset folders that hold one run each, from the
reference runtime or any engine that writes the trace contract. Requests are matched by
prompt (by request_id when both runs hold the same ids with the same prompts), steps by step
index, and each request's first divergence is classified in the order the engine works:

  draft   the drafts differ (node tokens or tree shape)
  verify  same drafts, different target predictions; says whether the positions, the mask
          hash or both differ (neither: the KV cache or the numerics)
  metric  same drafts and predictions, different counters or commit
  none    identical to the end

Step rows mean what the contract says; a manifest's `conventions` (accept length with or
without the bonus, pooled or per-request means) govern its reported figures, which diff
re-derives from the run's own rows and flags when they do not match. A partial overlap is
compared on the requests both runs hold, and says so.

exit codes: 0 no divergence, 1 some request diverged, 2 usage or input error
"""
from __future__ import annotations

import json

from specaudit.audit.defaults import DEFAULT_MARGIN_TOL

HELP = "classify where two runs of the same prompts first diverge: draft, verify or metric"
ORDER = 40


def add_arguments(p) -> None:
    p.add_argument("a", metavar="A", help="run A: a run folder, or a dataset folder holding one run")
    p.add_argument("b", metavar="B", help="run B, the same prompts as A")
    p.add_argument("--output-format", choices=["text", "json"], default="text", help="default text")
    p.add_argument("--examples", type=int, default=5, metavar="N",
                   help="example requests shown per class in text output (default 5)")
    p.add_argument("--margin-tol", type=float, default=DEFAULT_MARGIN_TOL, metavar="X",
                   help="a change of the target's top-1 margin (logits) above X counts as a verify divergence "
                        f"even when the argmax agrees (default {DEFAULT_MARGIN_TOL:g}; 'inf' to ignore margins)")


def main(args) -> int:
    from specaudit.audit.diff import diff_runs, format_text

    if args.examples < 0:
        raise ValueError(f"--examples must be >= 0 (got {args.examples})")
    tol = args.margin_tol
    if not tol >= 0:
        raise ValueError(f"--margin-tol must be >= 0 (got {args.margin_tol})")
    res = diff_runs(args.a, args.b, margin_tol=tol)
    if args.output_format == "json":
        print(json.dumps(res.to_dict(), indent=1))
    else:
        print(format_text(res, examples=args.examples))
    return 0 if res.clean else 1
