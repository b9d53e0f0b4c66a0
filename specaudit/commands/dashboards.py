"""Write the Grafana dashboards, Prometheus rules and scrape examples to a folder.

Examples:
  specaudit dashboards --out ./monitoring          # then point Grafana and Prometheus at it
  specaudit dashboards --out ./monitoring --force  # replace files edited since

Writes engines.json (real engines: vLLM, SGLang, TensorRT-LLM, llama.cpp) and
specaudit.json (`specaudit serve`) Grafana dashboards; engines_rules.yml (specaudit:
recording rules), engines_alerts.yml and alerts.yml (alerts, each naming its rule code;
runbook `specaudit rules CODE`) with their promtool unit tests; prometheus_engines.yml and
prometheus.yml (scrape configs loading them); provisioning/ for Grafana, its dashboards
path set to the folder. Check them with `promtool check config prometheus_engines.yml`
and `promtool test rules engines_alerts_test.yml` there.
"""
from __future__ import annotations

import sys

HELP = "write Grafana dashboards, Prometheus rules and scrape examples to a folder"
ORDER = 32


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write (created when missing)")
    p.add_argument("--force", action="store_true", help="replace files that differ from the packaged ones")


def main(args) -> int:
    from specaudit.dashboards import export
    from specaudit.outfile import guard_not_in_run_folder
    guard_not_in_run_folder(args.out)   # `report` refuses the same: a run folder holds evidence only
    try:
        written = export(args.out, force=args.force)
    except (OSError, RuntimeError) as e:
        msg = f"{e.filename}: {e.strerror}" if getattr(e, "filename", None) and getattr(e, "strerror", None) else e
        print(f"specaudit dashboards: error: {msg}", file=sys.stderr)
        return 2
    for p in written:
        print(p)
    return 0
