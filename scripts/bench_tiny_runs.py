"""Fixed cost per run of `specaudit check`: N tiny runs (one request each), checked
with the small-run path (read inline) and, side by side in the same process, with the
read-ahead thread forced on every run (the old path). Prints one JSON line last.

    python3 scripts/bench_tiny_runs.py --runs 10000        # the issue-19 target: under 20 s

Words: wall = elapsed seconds; cpu = process CPU seconds (all threads); per_run_ms =
wall / runs. On a shared machine the wall figure moves with other jobs' load; the two
paths are interleaved (A, B, A, B) so they see the same load.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import guard_ratios, load_fields, quiet_machine  # noqa: E402  (the scripts folder on the path first)


def make(out: Path, n: int) -> None:
    """n clean tiny runs (one request, a few steps each), each run's rows carrying its own
    run id (a copy of one run's files under other folders would be SA108 in every run)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from specaudit.trace.synth import synth_run_rows
    s, r, m = synth_run_rows(1, run_id="t", seed=0, max_new_tokens=8)
    for i in range(n):
        d = out / f"run_id=t{i}"
        d.mkdir(parents=True)
        rid = f"t{i}"
        for name, t in (("steps-000000.parquet", s), ("requests.parquet", r)):
            col = pa.array([rid] * t.num_rows, pa.string())
            pq.write_table(t.set_column(t.schema.get_field_index("run_id"), "run_id", col), d / name)
        (d / "run.json").write_text(json.dumps(dict(m, run_id=rid)))


def timed(paths, small_bytes: int) -> dict:
    from specaudit.audit import check as C
    old = C.SMALL_RUN_BYTES
    C.SMALL_RUN_BYTES = small_bytes
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        res = C.check_paths(paths)
        return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "runs": len(res.runs)}
    finally:
        C.SMALL_RUN_BYTES = old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ds"
        make(out, args.runs)
        quiet_machine()
        inline, threaded = [], []
        for _ in range(args.rounds):
            inline.append(timed([out], 8 << 20))
            threaded.append(timed([out], 0))
    best = lambda xs, k: min(x[k] for x in xs)
    res = {"runs": args.runs,
           "inline_wall_s": round(best(inline, "wall_s"), 3), "inline_cpu_s": round(best(inline, "cpu_s"), 3),
           "threaded_wall_s": round(best(threaded, "wall_s"), 3),
           "threaded_cpu_s": round(best(threaded, "cpu_s"), 3),
           "inline_per_run_ms": round(1000 * best(inline, "wall_s") / args.runs, 3),
           "threaded_per_run_ms": round(1000 * best(threaded, "wall_s") / args.runs, 3),
           # CPU per run: what a busy machine does not inflate (much)
           "inline_cpu_per_run_ms": round(1000 * best(inline, "cpu_s") / args.runs, 3),
           **load_fields()}
    res["speedup_wall"] = round(res["threaded_wall_s"] / res["inline_wall_s"], 3)
    print(json.dumps(guard_ratios(res, ["speedup_wall"])))


if __name__ == "__main__":
    main()
