"""Benchmark the DuckDB views, every canned query and the report on a large trace dataset.

    python3 scripts/bench_query.py                      # 2,000,000 steps (development size)
    python3 scripts/bench_query.py --steps 20000000     # the issue's size (about 3 GB on disk)
    python3 scripts/bench_query.py --dataset DIR        # an existing dataset (nothing generated)
    taskset -c 0,1 python3 scripts/bench_query.py --threads 2 ...   # pin to 2 cores

The dataset comes from specaudit.trace.synth (contract-valid rows, vectorised): four runs,
two chains of 8 nodes (concurrency 1 and 8), a chain of 16 nodes and a branching tree of 13
nodes (topk 3), each a quarter of --steps. It is generated once into --workdir and reused
while --steps and --seed match. DuckDB runs on --threads threads (default 2, the target).
Each canned query is timed as a user meets it: open the views (connect) + run + fetch, on
a fresh connection. The report is timed end to end (build_report, all six plots).
--check also runs the checker (timed separately) and hands its findings to the report.

The generated runs carry rollups (specaudit/trace/rollup.py, written by the same code as
the Parquet sink: one rollup-steps.parquet per run and requests.parquet's), so the views
answer from them; a dataset generated before a rollup change gets its rollups rewritten
(refresh_rollups) before timing; --raw times every query and the report
from the raw step rows instead (rollups ignored: what a dataset without them costs), and
--compare-raw times both in one run and prints the raw figures under raw_*.

The last output line is one JSON object:
    {"steps": N, "max_query_s": ..., "report_s": ..., "queries": {name: seconds}, ...}
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import add_json_out, load_fields, quiet_machine, record

# (algo, nodes, topk, concurrency): each run gets a quarter of the steps
RUNS = [("chain", 8, 1, 1), ("chain", 8, 1, 8), ("chain", 16, 1, 4), ("tree", 13, 3, 4)]


def _gen_run(ds: Path, k: int, algo: str, n: int, topk: int, conc: int, seed: int) -> None:
    from specaudit.trace.synth import write_synthetic_dataset
    print(f"generating {algo} n={n} topk={topk} c={conc}: {k:,} steps", file=sys.stderr, flush=True)
    write_synthetic_dataset(ds, k, n_nodes=n, algo=algo, seed=seed, topk=topk, concurrency=conc,
                            run_id=f"bench-{algo}-n{n}-k{topk}-c{conc}", max_new_tokens=256)


def make_dataset(root: Path, steps: int, seed: int, jobs: int = 1) -> tuple[Path, float]:
    """The dataset folder for (steps, seed), generated (runs in parallel with jobs > 1)
    unless already complete."""
    from concurrent.futures import ProcessPoolExecutor
    ds = root / f"steps-{steps}-seed{seed}"
    done = ds / ".complete"
    if done.exists():
        from specaudit.trace.rollup import refresh_rollups
        t0 = time.time()
        n = refresh_rollups(ds)     # a dataset from before a rollup change: its rollups rewritten
        if n:
            print(f"rewrote {n} stale rollups in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        return ds, 0.0
    if ds.exists():
        shutil.rmtree(ds)
    ds.mkdir(parents=True)
    t0 = time.time()
    per = steps // len(RUNS)
    todo = [(ds, per + (steps - per * len(RUNS) if i == 0 else 0), algo, n, topk, conc, seed + i)
            for i, (algo, n, topk, conc) in enumerate(RUNS)]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            for f in [ex.submit(_gen_run, *t) for t in todo]:
                f.result()
    else:
        for t in todo:
            _gen_run(*t)
    done.write_text("ok\n")
    return ds, time.time() - t0


def cpu_s() -> float:
    """CPU seconds of this process and its finished children (the report's drawing helper)."""
    r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2_000_000, help="steps in the dataset (default 2,000,000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "specaudit-bench-query"),
                    help="where datasets are generated and kept (default: $TMPDIR/specaudit-bench-query)")
    ap.add_argument("--dataset", help="benchmark this dataset instead of generating one")
    ap.add_argument("--threads", type=int, default=2, help="DuckDB threads (default 2)")
    ap.add_argument("--jobs", type=int, default=1, help="processes generating runs (default 1)")
    ap.add_argument("--generate-only", action="store_true", help="make the dataset and stop")
    ap.add_argument("--check", action="store_true", help="also run the checker and pass its findings to the report")
    ap.add_argument("--repeat", type=int, default=1, help="runs per query; the slowest counts (default 1)")
    ap.add_argument("--raw", action="store_true", help="ignore rollups: every figure from the raw step rows")
    ap.add_argument("--compare-raw", action="store_true", help="time with rollups and from raw rows, side by side")
    add_json_out(ap, "query")
    args = ap.parse_args(argv)

    from specaudit.postmortem.canned import canned_queries
    from specaudit.postmortem.dataset import find_dataset
    from specaudit.postmortem.report import build_report
    from specaudit.postmortem.sql_guard import fetch_arrow
    from specaudit.postmortem.views import connect

    if args.dataset:
        ds, gen_s = Path(args.dataset), 0.0
    else:
        ds, gen_s = make_dataset(Path(args.workdir), args.steps, args.seed, args.jobs)
    if args.generate_only:
        print(json.dumps({"dataset": str(ds), "dataset_bytes": du(ds), "generate_s": round(gen_s, 1)}))
        return 0
    paths = [str(ds)]

    quiet_machine()
    t0 = time.time()
    con = connect(paths, threads=args.threads)
    connect_s = time.time() - t0
    n_steps = fetch_arrow(con, "SELECT count(*) AS n FROM steps").column(0)[0].as_py()
    n_nodes = int(fetch_arrow(con, "SELECT sum(len(node_tokens))::BIGINT FROM steps").column(0)[0].as_py())
    con.close()

    findings, check_s = None, None
    if args.check:
        from specaudit.audit.check import check_paths
        t0 = time.time()
        res = check_paths(paths)
        check_s = time.time() - t0
        findings = res.findings
        print(f"checker: {check_s:.1f} s, {res.summary()}", file=sys.stderr, flush=True)

    def timed(rollups: bool, label: str) -> dict:
        times, cpus = {}, {}
        for name, q in canned_queries().items():
            worst, worst_cpu = 0.0, 0.0
            for _ in range(max(args.repeat, 1)):
                t0, c0 = time.time(), cpu_s()
                con = connect(paths, findings, threads=args.threads, rollups=rollups)
                rows = fetch_arrow(con, q.sql).num_rows
                con.close()
                worst, worst_cpu = max(worst, time.time() - t0), max(worst_cpu, cpu_s() - c0)
            times[name], cpus[name] = round(worst, 3), round(worst_cpu, 3)
            print(f"{label}{name:32s} {worst:7.2f} s wall  {worst_cpu:7.2f} s cpu  ({rows} rows)",
                  file=sys.stderr, flush=True)
        out = Path(args.workdir) / ("report" if rollups else "report-raw")
        t0, c0 = time.time(), cpu_s()
        build_report(paths, out, findings=findings, threads=args.threads, rollups=rollups)
        report_s, report_cpu = time.time() - t0, cpu_s() - c0
        print(f"{label}{'report':32s} {report_s:7.2f} s wall  {report_cpu:7.2f} s cpu  ({out / 'report.html'})",
              file=sys.stderr, flush=True)
        return {
            "max_query_s": max(times.values()), "slowest_query": max(times, key=times.get),
            "report_s": round(report_s, 2), "queries": times,
            # CPU seconds of this process (all DuckDB threads); cpu / threads is the wall time
            # on that many dedicated cores with perfect scaling: a machine shared with other
            # work (a loaded CI box) inflates wall time but not this
            "max_query_cpu_s": max(cpus.values()), "report_cpu_s": round(report_cpu, 2), "queries_cpu_s": cpus,
        }

    found = find_dataset(paths)
    res = {
        "steps": n_steps, "nodes": n_nodes, "threads": args.threads,
        "dataset_bytes": du(ds), "generate_s": round(gen_s, 1), "connect_s": round(connect_s, 3),
        "rollups": not args.raw, "rollup_files": len(set(found.rollups.values())),
        "data_files": len(found.step_files) + len(found.request_files),
        **timed(not args.raw, ""),
    }
    if args.compare_raw and not args.raw:
        raw = timed(False, "raw ")
        res.update({f"raw_{k}": v for k, v in raw.items()})
        res["query_speedup"] = round(raw["max_query_s"] / max(res["max_query_s"], 1e-9), 1)
        res["report_speedup"] = round(raw["report_s"] / max(res["report_s"], 1e-9), 1)
    res.update(load_fields())
    if check_s is not None:
        res["check_s"] = round(check_s, 1)
    print(json.dumps(res))
    record("query", res, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
