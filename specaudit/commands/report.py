"""Write a self-contained post-mortem report (report.html + one PNG per plot).

Examples:
  specaudit report traces/ --out report/
  specaudit report traces/run_id=chain-b7-k1-c1-20261130T140000-ab12 --out /tmp/r --no-check

Runs the checker on the traces (unless --no-check), then writes DIR/report.html with the
run configs and the checker's summary on top and six plots: acceptance by depth,
commit-length histogram, acceptance against draft confidence, draft/verify/other latency,
commit length over time, violations by code. Each plot is also DIR/<name>.png. The page
is one file with everything inlined (no network, no scripts): mail it, attach it to the
incident. `specaudit query PATH NAME` prints the data behind each plot (the caption names
the canned query). Reads the traces read-only; writes only into DIR.

An A/B result (`specaudit ab A B --output-format json -o ab.json`, or the ab.json that
`specaudit ab --a ... --b ... --out DIR` writes) given among the PATHs adds an A/B
section: A and B per stratum with their intervals and verdicts (ab.png), the Simpson's
paradox and confounder warnings and the closing sentence. Given alone, the page holds
only that section:
  specaudit report ab.json --out report/

Exit codes (as `specaudit check`): 0 written and the checker found no error, 1 written
and the checker found errors (--exit-zero: 0), 2 bad input (nothing written).
"""
from __future__ import annotations

import sys

HELP = "self-contained HTML report with plots (acceptance, commit lengths, calibration, latency, findings)"
ORDER = 62


def add_arguments(p) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="dataset folders, run folders or files")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for report.html and the PNGs")
    p.add_argument("--no-check", action="store_true", help="skip the checker (the report says so; exit 0)")
    p.add_argument("--exit-zero", action="store_true",
                   help="exit 0 even when the checker finds errors (default: 1, as `specaudit check`)")
    p.add_argument("--title", help="page title (default: specaudit post-mortem report)")
    p.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all cores)")


def load_ab_result(path):
    """The A/B result in a .json PATH (evidence or runtime), or None when it is not one."""
    import json
    from pathlib import Path
    p = Path(path)
    if p.suffix != ".json" or p.name == "run.json" or not p.is_file():
        return None
    try:
        d = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: not an A/B result: {e}") from None
    if isinstance(d, dict) and (d.get("kind") == "specaudit-ab-evidence"
                                or {"a", "b", "metrics", "verdict"} <= set(d)):
        return d
    raise ValueError(f"{p}: a JSON file that is neither a run.json nor an A/B result (specaudit ab)")


def main(args) -> int:
    from specaudit.outfile import guard_output_dir
    from specaudit.postmortem.report import build_ab_report, build_report
    from specaudit.trace.schema import discover
    guard_output_dir(args.out, args.paths)   # never into a run folder it reads
    abs_ = [(p, load_ab_result(p)) for p in args.paths]
    ab = next((d for _, d in abs_ if d is not None), None)
    if sum(d is not None for _, d in abs_) > 1:
        raise ValueError("give one A/B result per report")
    args.paths = [p for p, d in abs_ if d is None]
    if not args.paths and ab is not None:
        path = build_ab_report(ab, args.out, title=args.title)
        print(f"report: {path}", file=sys.stdout)
        return 0
    discover(args.paths)                 # bad paths fail here, before the checker runs
    findings = summary = None
    if not args.no_check:
        from specaudit.audit.check import check_paths
        res = check_paths(args.paths)
        findings, summary = list(res.findings), res.summary()
    path = build_report(args.paths, args.out, findings=findings, summary=summary,
                        threads=args.threads, title=args.title, ab=ab)
    note = "" if summary is None else f" (checker: {summary.get('violations', 0)} violation(s))"
    print(f"report: {path}{note}", file=sys.stdout)
    # the README's rule: 1 when the checker found errors (the report is written either way)
    return 0 if (args.no_check or args.exit_zero) else res.exit_code
