"""Re-derive every counter of trace datasets (or audit engine logs) and report what lies.

Each step row's raw tensors (tree, positions, mask hash, target argmax, accepted path,
commit) are checked against the engine's own counters, each request against its
steps and the requests table, each run's run.json `reported` against the aggregates
re-derived from all its rows. `specaudit rules` lists the catalog.

Examples:
  specaudit check traces/                                 # every run in a dataset
  specaudit check traces/run_id=chain-b7-*/ other/        # run folders, many datasets
  specaudit check traces/ --select SA3,SA5 --ignore SA311 # code prefixes
  specaudit check traces/ --statistics                    # one line per code
  specaudit check traces/ --config ci/specaudit.toml      # settings from this file (else found, see below)
  specaudit check traces/ --output-format sarif -o check.sarif
  specaudit check traces/ --output-format github          # annotations in GitHub Actions
  specaudit check traces/ --invariants my_rules/          # add your own rules (docs/commands/check.md)
  specaudit check sglang_server.log metrics.txt           # engine logs, Prometheus text
  specaudit check server.log --source vllm-log            # force the source kind
  specaudit check --prometheus http://127.0.0.1:9090 --range 6h --match '{job="vllm"}'
                                                          # real engines' series in a Prometheus

Inputs: a folder (dataset or run), a steps-*.parquet / requests.parquet / run.json
file (its run is checked), or a text file that is an engine log or a Prometheus
scrape, a benchmark summary or JSON responses (detected when omitted; --list-sources names
every reader, --source forces one). Each engine input's report starts with its account:
the reader and version recognised, windows read and skipped, each identity checked with
its numbers, and what could not be checked and why.

Settings: [tool.specaudit] in pyproject.toml, or specaudit.toml, found from the working
directory upwards (select, ignore, per-path-ignores, severity, output-format, tolerances;
docs/ci.md). Flags override the file; --isolated ignores it.

A run killed mid-way (no finished_at, no requests table) is checked for what it holds
and reported as incomplete (SA001, info) without failing. Unreadable files are named
with their reason (SA000); the others are still checked.
"""
from __future__ import annotations

import sys

from specaudit.cli_flags import Given

HELP = "check trace datasets (or engine logs) against the invariant catalog"
ORDER = 20

# the engine-output readers' --source names (specaudit.audit.sources.SOURCES; spelled here so
# `check --help` does not import the readers)
SOURCES = ("sglang-log", "vllm-log", "llamacpp-log", "vllm-bench", "tokenspeed-log", "prom-text", "json-records")


def add_arguments(p) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH", help="dataset folders, run folders, trace files or log files")
    p.add_argument("--select", action="append", metavar="CODES",
                   help="only these code prefixes, comma-separated (e.g. SA3,SA501)")
    p.add_argument("--ignore", action="append", metavar="CODES", help="skip these code prefixes")
    p.add_argument("--output-format", choices=["text", "json", "junit", "github", "sarif"], default="text",
                   help="text (default), json, junit (XML), github (workflow annotations), sarif (2.1.0)",
                   action=Given)   # typed, it overrides the configuration file's output-format
    p.add_argument("--config", metavar="FILE",
                   help="read settings from this specaudit.toml or pyproject.toml ([tool.specaudit]) "
                        "instead of the one found from the working directory upwards")
    p.add_argument("--isolated", action="store_true", help="ignore every configuration file")
    p.add_argument("--statistics", action="store_true", help="text: one line per code with its count")
    p.add_argument("--exit-zero", action="store_true", help="exit 0 even when violations are found")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")
    p.add_argument("--invariants", action="append", metavar="DIR", default=[],
                   help="a folder of .py files defining extra rules (repeatable)")
    p.add_argument("--no-entry-points", action="store_true",
                   help="do not load rules from installed packages (entry-point group specaudit.invariants)")
    p.add_argument("--source", choices=SOURCES,
                   help="read every PATH as this kind of engine output instead of detecting it")
    p.add_argument("--list-sources", action="store_true",
                   help="print each engine-output source (--source name) with an example line, and exit")
    p.add_argument("--examples", type=int, default=3, metavar="N",
                   help="text: findings shown per code (default 3; 0 = all kept)")
    p.add_argument("--max-per-code", type=int, default=1000, metavar="N",
                   help="findings kept per code for json/junit/github/sarif; all are counted (default 1000; 0 = all)")
    f = p.add_argument_group("fleet scale (Apache Spark; pip install specaudit[spark], Java 17 or 21)")
    f.add_argument("--engine", choices=["local", "spark"], default="local",
                   help="local (default): this process; spark: the same rules as Spark jobs over PATHs or URIs "
                        "(s3a://, gs://, hdfs://)")
    f.add_argument("--spark-master", metavar="URL",
                   help="Spark master (e.g. local[2], spark://host:7077); default: the one spark-submit gives")
    f.add_argument("--out", metavar="DIR", help="--engine spark: write every finding as a Parquet dataset here")
    g = p.add_argument_group("live engines (Prometheus HTTP API)")
    g.add_argument("--prometheus", metavar="URL", help="read vLLM/SGLang/TensorRT-LLM/llama.cpp spec-decoding series "
                   "from this Prometheus server (e.g. http://127.0.0.1:9090) and run the same source rules")
    g.add_argument("--range", default="6h", metavar="DUR", help="how far back from now (default 6h)")
    g.add_argument("--step", default="30s", metavar="DUR",
                   help="shortest window between two samples used (default 30s; 0 = every scrape)")
    g.add_argument("--match", action="append", default=[], metavar="SELECTOR",
                   help="label matchers, e.g. '{job=\"vllm\"}' (repeatable: any of them)")
    g.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="HTTP header on every request, e.g. 'Authorization: Bearer TOKEN' (repeatable)")
    g.add_argument("--timeout", default="30s", metavar="DUR", help="give up after this long in all (default 30s)")
    g.add_argument("--insecure", action="store_true", help="https: do not verify the server's certificate")
    g.add_argument("--ca-file", metavar="FILE", help="https: trust this CA bundle (PEM)")


def run_check(args, progress=None):
    """The check as the CLI runs it -> (CheckResult, rendered report): specaudit.audit.check_inputs.
    progress: callable(rows), told the trace steps as they are checked."""
    from specaudit.audit.check_inputs import parse_codes, run_check
    from specaudit.config import resolve
    cfg = resolve(args.config, args.isolated)   # flags override the file's select / ignore / format
    fmt = args.output_format if getattr(args, "output_format_given", False) else cfg.output_format or args.output_format
    live = dict(range=args.range, step=args.step, timeout=args.timeout, match=args.match, headers=args.header,
                insecure=args.insecure, ca_file=args.ca_file)
    return run_check(args.paths, select=parse_codes(args.select) if args.select else (cfg.select or ()),
                     ignore=parse_codes(args.ignore) if args.ignore else (cfg.ignore or ()), config=cfg,
                     invariants=args.invariants, entry_points=not args.no_entry_points, source=args.source,
                     max_per_code=args.max_per_code, output_format=fmt,
                     statistics=args.statistics, examples=args.examples, engine=args.engine,
                     spark_master=args.spark_master, out=args.out, prometheus=args.prometheus, live=live,
                     progress=progress)


def main(args) -> int:
    if args.list_sources:
        from specaudit.audit.sources import list_sources
        sys.stdout.write(list_sources())
        return 0
    from specaudit import cli_progress
    from specaudit.audit.check.fallback import debug_to_stderr
    debug_to_stderr()   # SPECAUDIT_DEBUG=1: a fast path that falls back says so on stderr
    with cli_progress.checking() as progress:   # Arrow's pool picked; a step counter on a terminal
        res, text = run_check(args, progress=progress)
    if not res.checked_anything:
        # nothing could be checked: one line per bad input, exit 2
        from specaudit.audit.formats import printable
        for path, reason in res.bad_files:   # a path or reason with ESC or a newline stays one line
            print(f"specaudit check: error: {printable(path)}: {printable(reason)}", file=sys.stderr)
        if not res.bad_files:
            print("specaudit check: error: nothing to check (give PATHs or --prometheus URL)", file=sys.stderr)
        return 2
    if args.output:
        from specaudit.outfile import write_output
        write_output(args.output, text, inputs=args.paths)   # never over a file it read
    else:
        sys.stdout.write(text)
    if args.exit_zero:
        return 0
    return res.exit_code
