"""Fixed cost per run of `specaudit check`: N clean tiny runs (one request each),
checked four ways side by side in one process, interleaved (A, B, C, D, A, B, C, D):
pooled with worker processes reading with polars (the default), the same workers
reading file by file with Arrow (POOL_POLARS off), pooled in this process (workers=1,
Arrow), and every run alone (pooling off: the path before issue 19's item 7). Prints
one JSON line.

    python3 scripts/bench_tiny_runs.py --runs 10000        # the issue-19 target: under 20 s

Words: wall = elapsed seconds; cpu = this process's CPU seconds (a worker's CPU is not
in it); per_run_ms = wall / runs. On a shared machine the wall figure moves with other
jobs' load, so the ratios are withheld when the machine was busy (benchutil).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import add_json_out, guard_ratios, load_fields, quiet_machine, record  # noqa: E402  (the scripts folder on the path first)


def make(out: Path, n: int) -> None:
    """n clean tiny runs (one request, a few steps each), written as the Parquet sink
    writes them (zstd, write_parquet_atomic), each run's rows carrying its own run id (a
    copy of one run's files under other folders would be SA108 in every run)."""
    import pyarrow as pa

    from specaudit.trace.parquet import write_parquet_atomic
    from specaudit.trace.synth import synth_run_rows
    s, r, m = synth_run_rows(1, run_id="t", seed=0, max_new_tokens=8)
    for i in range(n):
        d = out / f"run_id=t{i}"
        d.mkdir(parents=True)
        rid = f"t{i}"
        for name, t in (("steps-000000.parquet", s), ("requests.parquet", r)):
            col = pa.array([rid] * t.num_rows, pa.string())
            write_parquet_atomic(d / name, t.set_column(t.schema.get_field_index("run_id"), "run_id", col))
        (d / "run.json").write_text(json.dumps(dict(m, run_id=rid)))


def timed(paths, mode: str) -> dict:
    from specaudit.audit.check import check_paths, pool
    old, old_polars = pool.POOL_RUN_BYTES, pool.POOL_POLARS
    if mode == "alone":
        pool.POOL_RUN_BYTES = 0
    pool.POOL_POLARS = mode != "pooled_arrow"
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        res = check_paths(paths, workers=1 if mode == "pooled_1" else None)
        assert res.exit_code == 0 and not res.findings, res.summary()   # clean runs: nothing to report
        return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "runs": len(res.runs)}
    finally:
        pool.POOL_RUN_BYTES, pool.POOL_POLARS = old, old_polars


MODES = ("pooled", "pooled_arrow", "pooled_1", "alone")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    add_json_out(ap, "tiny_runs")
    args = ap.parse_args()
    from specaudit.audit.check.pool import check_workers
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ds"
        make(out, args.runs)
        quiet_machine()
        got = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for m in MODES:
                got[m].append(timed([out], m))
    best = lambda m, k: min(x[k] for x in got[m])
    res = {"runs": args.runs, "workers": check_workers()}
    for m in MODES:
        res[f"{m}_wall_s"] = round(best(m, "wall_s"), 3)
        res[f"{m}_per_run_ms"] = round(1000 * best(m, "wall_s") / args.runs, 3)
        res[f"{m}_cpu_per_run_ms"] = round(1000 * best(m, "cpu_s") / args.runs, 3)
    res.update(load_fields())
    res["speedup_pooled"] = round(res["alone_wall_s"] / res["pooled_wall_s"], 3)
    res["speedup_pooled_1"] = round(res["alone_wall_s"] / res["pooled_1_wall_s"], 3)
    res["polars_over_arrow"] = round(res["pooled_arrow_wall_s"] / res["pooled_wall_s"], 3)
    print(json.dumps(guard_ratios(res, ["speedup_pooled", "speedup_pooled_1", "polars_over_arrow"])))
    record("tiny_runs", res, args.json_out)


if __name__ == "__main__":
    main()
