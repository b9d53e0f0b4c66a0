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
"""
from __future__ import annotations

import sys

HELP = "self-contained HTML report with plots (acceptance, commit lengths, calibration, latency, findings)"
ORDER = 62


def add_arguments(p) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="dataset folders, run folders or files")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for report.html and the PNGs")
    p.add_argument("--no-check", action="store_true", help="skip the checker (the report says so)")
    p.add_argument("--title", help="page title (default: specaudit post-mortem report)")
    p.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all cores)")


def main(args) -> int:
    from specaudit.postmortem.report import build_report
    from specaudit.trace.schema import discover

    discover(args.paths)                 # bad paths fail here, before the checker runs
    findings = summary = None
    if not args.no_check:
        from specaudit.audit.check import check_paths
        res = check_paths(args.paths)
        findings, summary = list(res.findings), res.summary()
    path = build_report(args.paths, args.out, findings=findings, summary=summary,
                        threads=args.threads, title=args.title)
    note = "" if summary is None else f" (checker: {summary.get('violations', 0)} violation(s))"
    print(f"report: {path}{note}", file=sys.stdout)
    return 0
