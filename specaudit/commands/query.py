"""Ask a trace dataset, an engine log, a scrape or an AIPerf export anything in SQL:
DuckDB views, read-only and offline.

Examples:
  specaudit query --list                                   # the canned queries
  specaudit query traces/ acceptance_by_depth              # run one by name
  specaudit query traces/ a_vs_b --param a="chain b7 k1 c1" --param b="tree b15 k4 c1"
  specaudit query traces/ "SELECT config, run_id, reported_mean_commit_len FROM runs"
  specaudit query traces/ "SELECT * FROM nodes WHERE NOT accepted AND parent_accepted LIMIT 20"
  specaudit query traces/ throughput_over_time --output-format csv -o over_time.csv
  specaudit query traces/ violations_by_code               # runs the checker first
  specaudit query traces/                                  # interactive duckdb shell
  # engine outputs (SGLang/vLLM/llama.cpp logs, Prometheus scrapes, JSON/AIPerf records)
  specaudit query sglang.log "SELECT concurrency, avg(accept_len), count(*) FROM windows GROUP BY ALL"
  specaudit query sglang.log "SELECT code, line, message FROM findings"

Views: steps (the contract's step rows), requests, runs (one row per run: config label,
models, reported_* counters, the manifest as JSON), nodes (one row per node: node,
depth from parents, token, parent, position, draft_logprob, target_argmax,
target_margin, accepted, parent_accepted) and violations (the checker's findings:
code, name, severity, message, run_id, request_id, step, file, line, values as JSON).
The checker runs only when the SQL names `violations` (and for the shell); --no-check
skips it. Engine outputs given as PATHs (any file that is not part of a trace) become
two more: windows (one row per log line or scrape interval: file, source, engine,
version, line, time, concurrency, rank, cuda_graph, k, and every figure read:
accept_len, accept_rate, verify_steps, drafted, accepted, gen_tps, per_pos, histogram,
...; NULL where the engine printed nothing) and findings (the engine readers' SA7xx
findings, with the checker's on traces; empty with --no-check). Traces and logs may be
given together.

Read-only and offline, also when the SQL asks otherwise: COPY, EXPORT, ATTACH,
INSTALL/LOAD and friends are refused with one line (exit 2), DuckDB can read nothing
but the trace's own Parquet files, extensions cannot be installed or loaded, and SET
cannot undo any of it. The only file written is -o FILE. The interactive shell (needs
the `duckdb` CLI: pip install duckdb-cli) gets the same views and settings plus the
CLI's safe mode; DuckDB there still lets COPY ... TO name a trace file itself, so use
the shell on a copy when that matters.

Output: --output-format text (default: a table; at most --max-rows rows), csv, json (an array
of objects) or parquet (needs -o). SQL errors: DuckDB's message on one line, exit 2.
"""
from __future__ import annotations

HELP = ("SQL over traces (views steps/requests/runs/nodes/violations) and engine logs, scrapes, AIPerf "
        "exports (views windows/findings), and canned queries")
ORDER = 60


def add_arguments(p) -> None:
    _intermixed(p)
    p.add_argument("args", nargs="*", metavar="PATH... [SQL|NAME]",
                   help="dataset folders, run folders or files, then SQL or a canned query name")
    p.add_argument("--list", action="store_true", help="list the canned queries and exit")
    p.add_argument("--show", metavar="NAME", help="print a canned query's SQL (with its documentation) and exit")
    p.add_argument("-f", "--file", metavar="SQLFILE", help="read the SQL from a file")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="set a variable for getvariable('KEY') (canned queries list theirs)")
    p.add_argument("--output-format", choices=["text", "csv", "json", "parquet"], default="text",
                   type=lambda v: "text" if v == "table" else v,      # `table`: the old name of text
                   help="text (default: an aligned table), csv, json or parquet (parquet needs -o)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the result here (atomically) instead of stdout")
    p.add_argument("--max-rows", type=int, default=1000,
                   help="table format: rows to print (default 1000; 0 = all)")
    p.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all cores)")
    p.add_argument("--no-check", action="store_true",
                   help="do not run the checker: the violations view stays empty")


# --------------------------------------------------------------------- arguments

def _intermixed(p) -> None:
    """Let options and positionals mix (`query PATH --no-check "SQL"`): argparse's
    subcommand dispatch calls parse_known_args, which stops collecting PATH... at the
    first option; the intermixed variant does not."""
    plain = p.parse_known_args

    def intermixed(args=None, namespace=None):
        p.parse_known_args = plain           # the intermixed parser calls it twice inside
        try:
            return p.parse_known_intermixed_args(args, namespace)
        finally:
            p.parse_known_args = intermixed
    p.parse_known_args = intermixed


# ----------------------------------------------------------------------- checker

def run_checker(paths):
    """The checker's findings and summary for these paths (the command layer composes
    the two readers: query never imports check)."""
    from specaudit.audit.check import check_paths
    res = check_paths([str(p) for p in paths])
    summary = res.summary() if hasattr(res, "summary") else {}
    return list(res.findings), summary


# -------------------------------------------------------------------------- main

def main(args) -> int:
    from specaudit.postmortem.query_dataset import run_query
    fmt = "table" if args.output_format == "text" else args.output_format
    return run_query(args.args, sql_file=args.file, params=args.param, output_format=fmt,
                     output=args.output, max_rows=args.max_rows, threads=args.threads,
                     checker=None if args.no_check else run_checker, list_canned=args.list, show_canned=args.show)
