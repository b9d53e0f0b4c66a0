"""Render the generated pages of the docs site from their sources of truth.

    python3 scripts/render_docs.py           # write docs/rules/*.md and docs/benchmarks.md
    python3 scripts/render_docs.py --check   # exit 1, naming each stale page (tests/test_docs.py)

- docs/rules/: one page per rule of the catalog (What, Why, Example, message, fixtures),
  from the rules' own docstrings and fixtures (invariants/), as `specaudit rules CODE` prints
  them; an index per family, the guide for adding a rule with every home it may touch
  (invariants/homes.py) and the rule x home matrix.
- docs/benchmarks.md: every measured figure of the docs, from the JSON files the benchmark
  scripts write (docs/benchmarks/<name>.json, scripts/benchutil.py record()): the figures
  with the command line, commit, date and machine (cores, load) that produced them. A JSON
  missing a key the page shows is an error naming the file and the key.

Nothing here measures or types a number: change the code or rerun a benchmark, then this.
"""
from __future__ import annotations

import inspect
import json
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BENCH_DIR = DOCS / "benchmarks"
FIXTURES = ROOT / "tests" / "fixtures" / "engines"

# ------------------------------------------------------------------ benchmarks
# the checker's figures, chain (check) and tree (check_tree) alike
CHECK_KEYS = [("steps", "steps"), ("steps_per_s", "steps/s (wall; the median of the checks below)"),
              ("seconds_runs", "measured checks, each a fresh process: seconds"),
              ("arrow_pool", "Arrow memory pool of the measured checks (as `specaudit check` picks it)"),
              ("steps_per_s_default_pool", "steps/s with pyarrow's own pool (interleaved fresh processes)"),
              ("seconds_runs_default_pool", "those checks: seconds"),
              ("check_pool_over_default", "the check's pool over pyarrow's own (wall)"),
              ("steps_per_cpu_s", "steps per CPU second"),
              ("decode_steps_per_s", "decode limit, steps/s"), ("of_decode_limit", "share of the decode limit (wall)"),
              ("of_decode_limit_cpu", "share of the decode limit (CPU)"),
              ("of_decode_limit_ceiling", "share of the decode limit this CPU allows at most (every core busy)"),
              ("steps_per_s_warm", "steps/s, the same process's second check (warm, as the decode is)"),
              ("start_up_seconds", "first check minus warm check: what a process pays once, s"),
              ("of_decode_limit_warm", "share of the decode limit, warm check (wall)"),
              ("of_decode_limit_warm_cpu", "share of the decode limit, warm check (CPU)"),
              ("read_cpu_seconds", "reading what the check reads, alone (lists, scalars, requests table), CPU s"),
              ("check_work_ns_per_step", "the check's own work (warm check's CPU beyond the reading), ns per step"),
              ("check_work_ns_per_step_for_target",
               "the most that work may cost for 0.6 of the decode limit, every core busy, ns per step"),
              ("check_work_ns_per_step_for_target_first",
               "the same for the measured check, a process's first (start-up paid too), ns per step"),
              ("of_decode_limit_reading_alone",
               "share of the decode limit a check that only read would reach, every core busy (warm)"),
              ("of_decode_limit_reading_alone_first", "the same, with a first check's start-up"),
              ("peak_rss_mb", "peak RSS, MB"),
              ("kernels", "compiled kernels used"),
              ("first_check_seconds", "first check on the machine (builds them), s"),
              ("numpy_steps_per_s", "numpy alone (SPECAUDIT_COMPILED=0), steps/s"),
              ("compiled_over_numpy", "compiled over numpy alone (wall)"),
              ("frame_steps_per_s", "without the clean-batch screen (SPECAUDIT_SCREEN=0), steps/s"),
              ("screen_over_frame", "what the screen buys: seconds without it over seconds with it (wall)"),
              ("screened_share", "share of steps the screen passed"),
              ("stages", "where the check's main thread spends its time (an instrumented second check)")]
# (name of docs/benchmarks/<name>.json, title, script, what it measures, [(figure key, label)]).
# Every key listed is required in the JSON's "figures"; null means withheld (busy machine).
BENCHMARKS = [
    ("runtime", "Runtime: speedup, trace overhead, lossless", "scripts/bench_runtime.py",
     "Batch 1 on the embedded models, traced and untraced runs interleaved in rounds (medians); "
     "every output compared with plain greedy.",
     [("greedy_tokens_per_s", "plain greedy, tokens/s"), ("speedup_chain", "chain b7, speedup (traced)"),
      ("best_tree", "best tree"), ("speedup_best_tree", "best tree, speedup (traced)"),
      ("mean_commit_len_chain", "chain, mean commit length"),
      ("max_tree_commit_len", "trees, largest mean commit length"),
      ("trace_overhead", "trace overhead (pooled)"), ("tracer_cpu_us_per_step", "tracer CPU per step, us"),
      ("speedup_sampled_chain", "sampled chain speedup, per temperature"),
      ("trace_overhead_v2", "trace overhead, sampled (v2)"),
      ("lossless", "lossless"), ("prompts", "prompts"), ("max_new_tokens", "new tokens"), ("rounds", "rounds")]),
    ("check", "Checker: steps/s against the decode limit", "scripts/bench_check.py",
     "A synthetic dataset checked with the whole catalog, the same files' list columns decoded alone "
     "(the limit), and a plain per-row Python implementation of the same rules (the baseline). "
     "Targets on this 2-core machine: 3M steps/s and 0.6 of the decode limit measured in the same run "
     "(`of_decode_limit`); `of_decode_limit_ceiling` says whether the check's CPU seconds allow the latter at all. "
     "The measured check is its process's first, as a user's is, while the decode runs warm after it: the "
     "`_warm` figures check the same files again in that process, so both sides are warm, and "
     "`start_up_seconds` is the difference, paid once per process. The decode limit is the fastest of three "
     "passes. `read_cpu_seconds` reads everything the check reads and nothing more; the warm check's CPU beyond "
     "it is the checking itself (`check_work_ns_per_step`), beside what 0.6 of the limit leaves for it with "
     "every core busy (`check_work_ns_per_step_for_target`): the gap in work per step, whatever the scheduling; "
     "`_first`, the same for the measured check, which pays its start-up too (negative: out of reach with no "
     "checking at all). `of_decode_limit_reading_alone` is the ceiling of a check that only read what it reads, "
     "every core busy (`_first`: with the start-up): what this machine allows before any checking. "
     "Each measured check picks Arrow's memory pool as `specaudit check` does (jemalloc, "
     "specaudit/audit/check/arrow_pool.py), and as many fresh processes interleaved with them run with "
     "pyarrow's own pool: `check_pool_over_default`. The decode runs in the same process, with the same pool.",
     [*CHECK_KEYS, ("baseline_steps_per_s", "per-row baseline, steps/s"), ("speedup", "speedup over the baseline")]),
    ("check_tree", "Checker: steps/s against the decode limit, tree N=32", "scripts/bench_check.py",
     "As above on trees of 32 nodes (`--algo tree --n-nodes 32 --json-out docs/benchmarks/check_tree.json`). "
     "Targets: 1M steps/s and 0.6 of the decode limit measured in the same run.",
     CHECK_KEYS),
    ("check_rss", "Checker: memory against the number of requests", "scripts/bench_check.py",
     "Peak RSS of the check at 2M and at 20M steps (`--rss-large 20000000 --json-out "
     "docs/benchmarks/check_rss.json`), each in a fresh process; 1.0 = memory flat in the number of requests.",
     [("steps", "steps"), ("requests", "requests"), ("peak_rss_mb", "peak RSS, MB"),
      ("steps_large", "steps (large)"), ("requests_large", "requests (large)"),
      ("peak_rss_mb_large", "peak RSS (large), MB"), ("rss_large_over_small", "large over small")]),
    ("layout", "Step files: the Parquet layout and the decode limit", "scripts/bench_layout.py",
     "The same synthetic steps (chain N=8, tree N=32) written in each layout and read back one thread per "
     "reader, on the list columns the checker decodes; best of the repeats. Writer options keep the contract; "
     "`fixed_binary` is a study of a layout change (not the contract). Findings must be identical across the "
     "contract layouts. The ratios are per CPU second against the writer's current options "
     "(`specaudit.trace.parquet.STEP_WRITE_OPTIONS`); see docs/trace-layout.md.",
     [("chain_steps", "steps, chain N=8"), ("tree_steps", "steps, tree N=32"),
      ("best_contract_layout_chain", "fastest contract layout, chain"),
      ("best_contract_over_current_chain_N8", "fastest contract layout over current, chain"),
      ("fixed_binary_over_current_chain_N8", "fixed-width study over current, chain"),
      ("best_contract_layout_tree", "fastest contract layout, tree"),
      ("best_contract_over_current_tree_N32", "fastest contract layout over current, tree"),
      ("fixed_binary_over_current_tree_N32", "fixed-width study over current, tree"),
      ("findings_identical", "findings identical across layouts"), ("layouts", "per layout")]),
    ("tiny_runs", "Checker: many tiny runs", "scripts/bench_tiny_runs.py",
     "Runs of one request and a few steps, written as the sink writes them, checked four ways side by side.",
     [("runs", "runs"), ("workers", "workers"), ("pooled_wall_s", "pooled, workers with polars: wall s"),
      ("pooled_arrow_wall_s", "pooled, workers with Arrow: wall s"), ("pooled_1_wall_s", "pooled, one process: wall s"),
      ("alone_wall_s", "every run alone: wall s"), ("pooled_per_run_ms", "pooled: ms per run"),
      ("speedup_pooled", "pooled over alone"), ("polars_over_arrow", "polars over Arrow")]),
    ("sources", "Engine logs: streaming reader", "scripts/bench_sources.py",
     "Worst-case vLLM logs (every line a SpecDecoding line), read in parallel and with one worker.",
     [("sizes", "per size: MiB, lines, runs (workers, seconds, CPU seconds, MiB/s, peak RSS), same findings")]),
    ("estimator", "Estimator: accuracy against the truth", "scripts/bench_estimator.py",
     "Per configuration: calibrate r on other prompts, play a load generator timed from outside, estimate "
     "the commit length from client-side tokens/s; the truth is the runtime's pooled mean commit length.",
     [("max_rel_error", "largest relative error"), ("mean_rel_error", "mean relative error"), ("target", "target"),
      ("within_target", "within target"), ("covered", "95% intervals covering the truth"),
      ("min_true_commit_len", "smallest true commit length"), ("max_true_commit_len", "largest true commit length"),
      ("configs", "per configuration")]),
    ("scrape", "Serving: what a 10 Hz scrape of /metrics costs", "scripts/bench_scrape.py",
     "`specaudit serve` under load, phases with and without a scrape alternating in one run.",
     [("scrape_overhead", "throughput loss (median of pairs)"), ("scrape_cpu_share", "server CPU share for /metrics"),
      ("scrape_cpu_us_per_scrape", "server CPU per scrape, us"), ("tokens_per_s_scrape", "tokens/s with scrapes"),
      ("tokens_per_s_no_scrape", "tokens/s without"), ("scrapes", "scrapes"), ("metrics_bytes", "bytes per scrape")]),
    ("query", "Post-mortem: canned queries and the report", "scripts/bench_query.py",
     "A synthetic dataset; every canned query and the report timed with its own connect, from rollups.",
     [("steps", "steps"), ("rollup_files", "rollup files"), ("max_query_s", "slowest canned query, wall s"),
      ("max_query_cpu_s", "slowest canned query, CPU s"), ("report_s", "report, wall s"),
      ("report_cpu_s", "report, CPU s"),
      ("slowest_query", "slowest canned query"), ("queries", "per query, wall s")]),
    ("sink_rollup", "Trace sink: what the rollup costs", "scripts/bench_sink_rollup.py",
     "CPU per step of the Parquet sink without a rollup, with one rollup per run, and with one per flushed file.",
     [("steps", "steps"), ("flush_steps", "steps per flush"), ("total_cpu_us_per_step", "CPU per step, us"),
      ("rollup_cost", "rollup per run: added cost"), ("per_file_cost", "rollup per file: added cost")]),
    ("ab_evidence", "A/B from evidence: throughput", "scripts/bench_ab_evidence.py",
     "Two generated SGLang logs and two synthetic trace datasets compared with `specaudit ab`.",
     [("log_lines", "log lines"), ("log_windows_per_s", "log windows/s"), ("trace_rows", "trace rows"),
      ("trace_rows_per_s", "trace rows/s"), ("peak_rss_mb", "peak RSS, MB"), ("log_verdict", "log verdict"),
      ("trace_verdict", "trace verdict")]),
    ("spark", "Fleet: the checker on Spark", "scripts/bench_spark.py",
     "The same dataset checked locally and on Spark local[1] and local[2]; findings must be equal. CPU per step: "
     "the local process's, against Spark's executors' (task metrics for the JVM, the Python workers' own CPU).",
     [("steps", "steps"), ("plan", "how Spark cut the job"), ("cpu_s_per_step_local", "local, CPU s per step"),
      ("cpu_s_per_step_spark", "Spark local[1], executors' CPU s per step"),
      ("spark_over_local_cpu_per_step", "Spark over local, CPU per step (target 2 or less)"),
      ("fixed_cost_s", "Spark's fixed cost (startup and a one-run check), s"),
      ("break_even_steps", "break-even on the cluster below, steps"), ("cluster_cores", "cluster executor cores"),
      ("local_steps_per_s", "local, steps/s"), ("spark_steps_per_s_1", "Spark local[1], steps/s"),
      ("spark_steps_per_s_2", "Spark local[2], steps/s"), ("spark_2_over_1", "local[2] over local[1]"),
      ("spark_startup_s_1", "Spark startup, s")]),
    ("suite", "The test suite: pytest's wall time on this machine", "scripts/bench_suite.py",
     "The pytest line of `scripts/test.sh` (the README's test command, installs done), run with the "
     "timeline of tests/conftest.py on; CPU read from /proc/stat once a second. `busy` is the share of "
     "the cores kept busy; per run, the modules holding the most wall time on their worker (wall, own and "
     "children's CPU). The load shown is read before the run: while it runs, the suite is the load.",
     [("pytest_s", "pytest wall time, s"), ("target_s", "target, s"), ("of_target", "of the target"),
      ("test_sh_workers", "xdist workers (scripts/test.sh)"), ("busy", "cores kept busy"), ("runs", "runs")]),
    ("kernels", "Triton audit kernels (GPU)", "scripts/bench_kernels.py",
     "On CUDA, each kernel against its torch reference (eager and CUDA-graph replay) and a host-sync "
     "implementation; the fused audit at B=256, N=64 against its target.",
     [("device", "device"), ("fused_audit_b256_n64_us", "fused audit, B=256, N=64, eager, us"),
      ("fused_audit_b256_n64_graph_us", "fused audit, B=256, N=64, CUDA-graph replay, us"),
      ("target_us", "target, us"), ("meets_target_graph", "meets the target (graph replay)"),
      ("meets_target_eager", "meets the target (eager)"),
      ("audit_faster_than_torch_everywhere", "fused audit faster than torch at every size")]),
]
PROVENANCE = ("command", "commit", "date", "machine")
MACHINE = ("cores", "load_avg_1m")


class BenchmarkError(ValueError):
    """A benchmark JSON the page cannot be rendered from (names the file and the key)."""


def _fmt(v) -> str:
    if v is None:
        return "withheld"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if _is_rows(v):
        return "(table below)"
    if isinstance(v, (dict, list)):
        return "`" + json.dumps(v, separators=(", ", ": ")) + "`"
    return str(v)


def _is_rows(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _is_keyed_rows(v) -> bool:
    """A dict of records ({"gw0": {...}, "gw1": {...}}): a table keyed by its keys."""
    return isinstance(v, dict) and bool(v) and all(isinstance(x, dict) for x in v.values())


def _rows_table(label: str, rows: list[dict]) -> list[str]:
    """A list of records (per configuration, per size) as its own table; a column whose
    cells are records themselves (a run's modules, its workers) becomes one table per row
    below it, named by the row's first column, instead of a JSON cell too wide to read."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    nested = [c for c in cols if any(_is_rows(r.get(c)) or _is_keyed_rows(r.get(c)) for r in rows)]
    flat = [c for c in cols if c not in nested]
    out = ["", f"{label}:", "", "| " + " | ".join(flat) + " |", "|" + "---|" * len(flat)]
    for r in rows:
        out.append("| " + " | ".join(_fmt(r[c]) if c in r else "" for c in flat) + " |")
    for c in nested:
        for i, r in enumerate(rows):
            v = r.get(c)
            if _is_keyed_rows(v):
                v = [{"": k, **x} for k, x in v.items()]
            if _is_rows(v):
                name = f"{flat[0]} {_fmt(r.get(flat[0]))}" if flat else f"row {i + 1}"
                out += _rows_table(f"{c} ({name})", v)
    return out


def render_benchmark(name: str, doc: dict, title: str, script: str, what: str, keys) -> str:
    """One section of the benchmarks page; BenchmarkError when a required key is missing."""
    where = f"docs/benchmarks/{name}.json"
    for k in PROVENANCE:
        if k not in doc:
            raise BenchmarkError(f"{where}: missing key {k!r}")
    for k in MACHINE:
        if k not in doc["machine"]:
            raise BenchmarkError(f"{where}: missing key 'machine.{k}'")
    figs = doc.get("figures")
    if not isinstance(figs, dict):
        raise BenchmarkError(f"{where}: missing key 'figures'")
    for k, _ in keys:
        if k not in figs:
            raise BenchmarkError(f"{where}: missing key 'figures.{k}'")
    m = doc["machine"]
    commit = (doc["commit"] or "unknown")[:12] + (" (uncommitted changes)" if doc.get("dirty") else "")
    # the load read while measuring (the figures' own, which decided what was withheld) over the
    # one read when the JSON was written, after the work
    quiet = figs.get("machine_quiet", m.get("machine_quiet"))
    load = (f"load average {figs.get('load_avg_1m', m['load_avg_1m'])} on {m['cores']} cores"
            + ("" if quiet is None else " (quiet)" if quiet else " (busy: ratios withheld)"))
    lines = [f"## {title} {{#{name.replace('_', '-')}}}", "", what, "",
             f"`{doc['command']}` at commit `{commit}`, {doc['date']}, {m.get('cpu', 'unknown CPU')}, {load}.", "",
             "| figure | value |", "|---|---|"]
    lines += [f"| {label} (`{k}`) | {_fmt(figs[k])} |" for k, label in keys]
    for k, label in keys:
        if _is_rows(figs[k]):
            lines += _rows_table(f"{label} (`{k}`)", figs[k])
    if figs.get("withheld"):
        lines += ["", f"Withheld: {figs['withheld']}"]
    for note in ("load_note",):
        if figs.get(note):
            lines += ["", f"Note: {figs[note]}"]
    return "\n".join(lines) + "\n"


def render_benchmarks(bench_dir: Path = BENCH_DIR) -> str:
    from specaudit.machine_load import DEFAULT_PER_CORE, ENV
    out = ["# Benchmarks", "",
           "Every measured figure of these docs, rendered by `scripts/render_docs.py` from the JSON files",
           "the benchmark scripts write to `docs/benchmarks/` (`scripts/benchutil.py`), each with the",
           "command line, commit, date and machine that produced it. On a busy machine (load average",
           f"above {DEFAULT_PER_CORE} per core, or `{ENV}`'s value: `specaudit/machine_load.py`) a",
           "benchmark withholds its ratios rather than print noise. Rerun a script, then",
           "`python3 scripts/render_docs.py`; `tests/test_docs.py` fails when this page is stale or",
           "shows a figure that no JSON holds.", ""]
    missing = []
    for name, title, script, what, keys in BENCHMARKS:
        path = bench_dir / f"{name}.json"
        if not path.exists():
            missing.append((name, title, script))
            continue
        try:
            doc = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise BenchmarkError(f"docs/benchmarks/{name}.json: not JSON ({e})") from None
        out.append(render_benchmark(name, doc, title, script, what, keys))
    for name, title, script in missing:
        out += [f"## {title} {{#{name.replace('_', '-')}}}", "",
                f"Not recorded yet: no `docs/benchmarks/{name}.json`, so no figure of it is shown. "
                f"Run `python3 {script}`.", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------- rules
def _sections(doc: str) -> dict:
    """'What: ...\\n\\nWhy: ...\\n\\nExample: ...' -> {"What": ..., "Why": ..., "Example": ...}."""
    parts, cur = {}, None
    for line in doc.splitlines():
        head = line.split(":", 1)[0]
        if head in ("What", "Why", "Example") and ":" in line:
            cur = head
            parts[cur] = [line.split(":", 1)[1].strip()]
        elif cur:
            parts[cur].append(line)
        else:
            parts.setdefault("What", []).append(line)
    return {k: "\n".join(v).strip() for k, v in parts.items()}


def _overrides(rule, method: str) -> bool:
    from specaudit.invariants import Rule
    return getattr(type(rule), method) is not getattr(Rule, method)


def _fixture_text(rel: str) -> str:
    path = FIXTURES / rel
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = text.splitlines()
    shown = "\n".join(line[:200] for line in lines[:12]) + ("\n..." if len(lines) > 12 else "")
    return f"`tests/fixtures/engines/{rel}`:\n\n```text\n{shown}\n```\n"


def render_rule(rule) -> str:
    from specaudit.invariants.catalog import FAMILIES
    s = _sections(rule.doc())
    fam = rule.code[:3]
    out = [f"# {rule.code} {rule.name}", "",
           f"**{rule.severity}** · scope `{rule.scope}` · family {fam}xx ({FAMILIES.get(fam, '')})"
           + (f" · also runs live: {', '.join(f'`{x}`' for x in rule.live)}" if rule.live else ""), ""]
    for k in ("What", "Why", "Example"):
        text = s.get(k) or "(not documented)"
        out += [f"## {k}", "", text[:1].upper() + text[1:], ""]
    out += ["## Message", "", f"`{rule.message}`", "", "## Fixtures", ""]
    fail, ok = getattr(rule, "fail_fixture", None), getattr(rule, "pass_fixture", None)
    if fail or ok:
        out += ["Real engine output; `tests/test_sources.py` checks that the failing excerpt reports this "
                "code and the passing one nothing."]
        if fail:
            out += ["", "Fails: " + _fixture_text(fail)]
        if ok:
            out += ["", "Passes: " + _fixture_text(ok)]
    elif _overrides(rule, "fail"):
        out += [f"Each rule mutates a small valid synthetic {rule.fixture_algo} run "
                "(`invariants/fixtures.py`); `tests/test_invariants.py` checks that the failing run "
                "reports this code and the passing run no error.", "",
                "Fails (`fail`):", "", "```python", textwrap.dedent(inspect.getsource(type(rule).fail)).rstrip(), "```"]
        if _overrides(rule, "passing"):
            out += ["", "Passes (`passing`):", "", "```python",
                    textwrap.dedent(inspect.getsource(type(rule).passing)).rstrip(), "```"]
    else:
        out += ["This rule is about the input itself or a pair of sources; its cases are tested in "
                "`tests/` (grep for the code)."]
    out += ["", f"`specaudit rules {rule.code}` prints the same text; `--select {rule.code}` / "
            f"`--ignore {rule.code}` choose it in `specaudit check`.", ""]
    return "\n".join(out)


def _builtin_rules():
    from specaudit.invariants.registry import builtin_codes, load_rules
    codes = builtin_codes()
    return [r for r in load_rules(entry_points=False) if r.code in codes]


def render_rules_index(rules) -> str:
    from specaudit.invariants.catalog import FAMILIES
    out = ["# Rules", "",
           "The invariant catalog, one page per rule, generated from the rules themselves",
           "(`invariants/`, by `scripts/render_docs.py`): the same What / Why / Example as",
           "`specaudit rules CODE`, the message, and the fixtures that prove the rule.",
           "Families and how to write your own: [`specaudit check`](../commands/check.md).", ""]
    fam = None
    for r in rules:
        if r.code[:3] != fam:
            fam = r.code[:3]
            out += ["", f"## {fam}xx: {FAMILIES.get(fam, '')}", "",
                    "| code | name | severity | what |", "|---|---|---|---|"]
        out.append(f"| [{r.code}]({r.code}.md) | {r.name} | {r.severity} | {r.summary().replace('|', '/')} |")
    return "\n".join(out) + "\n"


def render_homes(rules) -> str:
    """The guide for adding a rule (every place it touches, the homes read from their own
    declarations: invariants/homes.py) and the rule x home matrix."""
    from specaudit.invariants.homes import HOMES, render_matrix
    out = ["", "## Adding a rule: every place it touches", "",
           "A rule's identity (code, name, severity, message, documentation) and its fixtures live in",
           "the catalog alone. A built-in rule touches:", "",
           "1. `invariants/saN_<family>.py`: the `Rule` subclass with its What / Why / Example docstring",
           "   and `check()` (defining it registers it; the full guide is the docstring of",
           "   `invariants/__init__.py`).",
           "2. Its fixtures: `fail(run)` and, for an edge case, `passing(run)` (SA7xx source rules:",
           "   `fail_fixture` / `pass_fixture` files); `tests/test_invariants.py` runs them through",
           "   `specaudit check`.",
           "3. Every home below where the rule belongs too. Each home declares the codes it computes in",
           "   its own module; `tests/test_rule_homes.py` runs each claimed rule's own pass and fail",
           "   fixtures through that home, and fails on a claim the home does not keep.", ""]
    for h in HOMES:
        out += [f"    - **{h.name}**, `{h.path}` ({', '.join(h.scopes)} rules; declared in `{h.declares}`):",
                f"      {h.what}. A new rule there: {h.how}."]
    out += ["",
            "4. `specaudit/audit/compare.py`, when the rule compares a reported figure with a derived",
            "   one: call `compare.agrees`, never a tolerance of its own (it is the comparison, not a home).",
            "5. `docs/commands/check.md`: the families table names the family's codes. This page and each",
            "   rule's own page are generated: `python3 scripts/render_docs.py`.", "",
            "## Where each rule runs", "",
            "Read from the homes' declarations: `x` the home computes the rule, blank it could (the rule's",
            "scope is one the home consumes) but does not, `-` it cannot (another scope). Rules of scopes",
            "no home consumes (source) are left out.", "",
            render_matrix(rules).rstrip("\n")]
    return "\n".join(out) + "\n"


def render_all() -> dict[Path, str]:
    """{path: text} of every generated page."""
    rules = _builtin_rules()
    pages = {DOCS / "rules" / "index.md": render_rules_index(rules) + render_homes(rules)}
    pages.update({DOCS / "rules" / f"{r.code}.md": render_rule(r) for r in rules})
    pages[DOCS / "benchmarks.md"] = render_benchmarks()
    return pages


def stale(pages: dict[Path, str]) -> list[str]:
    """Pages whose file differs from the render, and rule pages no rule has any more."""
    bad = [str(p.relative_to(ROOT)) for p, text in pages.items() if not p.exists() or p.read_text() != text]
    bad += [str(p.relative_to(ROOT)) for p in sorted((DOCS / "rules").glob("*.md")) if p not in pages]
    return bad


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(ROOT))
    try:
        pages = render_all()
    except BenchmarkError as e:
        print(f"render_docs.py: error: {e}", file=sys.stderr)
        return 2
    if "--check" in argv:
        bad = stale(pages)
        for p in bad:
            print(f"stale: {p} (python3 scripts/render_docs.py)", file=sys.stderr)
        return 1 if bad else 0
    (DOCS / "rules").mkdir(parents=True, exist_ok=True)
    for p in sorted((DOCS / "rules").glob("*.md")):
        if p not in pages:
            p.unlink()
    for p, text in pages.items():
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
            print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
