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

Engine outputs (logs, scrapes, AIPerf / JSON records) among the PATHs add an "Engine
outputs" section: per file, version and concurrency the windows and the mean figures
printed, the readers' findings by code (exit 1 on an error, as `specaudit check`) and
accept length / throughput per window (engine_windows.png); given alone, the page holds
only that section:
  specaudit report sglang.log --out report/

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
EXTRA = "report"   # matplotlib: pip install specaudit[report]
ORDER = 62


def add_arguments(p) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="dataset folders, run folders or files")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for report.html and the PNGs")
    p.add_argument("--no-check", action="store_true", help="skip the checker (the report says so; exit 0)")
    p.add_argument("--exit-zero", action="store_true",
                   help="exit 0 even when the checker finds errors (default: 1, as `specaudit check`)")
    p.add_argument("--title", help="page title (default: specaudit post-mortem report)")
    p.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all cores)")


def _checker(paths):
    """The checker for the report (the command layer composes the two readers), run as
    `specaudit check` runs it (cli_progress.checking: its memory pool, its step counter)."""
    from specaudit import cli_progress
    from specaudit.audit.check import check_paths
    with cli_progress.checking() as progress:
        res = check_paths(paths, progress=progress)
    return list(res.findings), res.summary(), res.exit_code


def main(args) -> int:
    from specaudit.postmortem.report_inputs import run_report
    path, summary, rc = run_report(args.paths, args.out, checker=None if args.no_check else _checker,
                                   title=args.title, threads=args.threads)
    note = "" if summary is None else f" (checker: {summary.get('violations', 0)} violation(s))"
    print(f"report: {path}{note}", file=sys.stdout)
    # the documented rule (docs/commands/report.md): 1 when the checker found errors (the report is written either way)
    return 0 if args.exit_zero else rc
