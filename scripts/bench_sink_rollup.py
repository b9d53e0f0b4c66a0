"""The Parquet sink's CPU per step with and without rollups, side by side in one run.

    python3 scripts/bench_sink_rollup.py                  # 32 flushes of 4096 steps, 5 rounds
    python3 scripts/bench_sink_rollup.py --flush-steps 512 --flushes 256

The tracer's background thread hands the sink Arrow batches and the sink writes one
steps file per flush; that thread shares the GIL with the decode loop, so the sink's CPU
per step is what tracing takes from decoding. Three sinks write the same batches
(contract-valid rows from specaudit.trace.synth: a chain of 8 nodes and a tree of 13, topk 3,
concurrency 8), interleaved round by round:

    plain      ParquetSink(rollups=False)
    rollup     ParquetSink(): flushes keep their rows' columns (zero-copy), digested into
               partial sums every 32768 rows; one rollup at close
    per_file   each flush also computes and writes its file's own rollup (what the sink
               did before the run rollup): write_with_rollup

CPU is time.process_time() of this process (one thread: the sink's work, without the
decode loop), per step, median over rounds: `flush` the flushes alone, `close` close_run
alone, `total` both per step. rollup_cost = rollup / plain - 1 of the total (the share the
rollup adds to the sink's thread over the run); per_file_cost the same for the per-file
rollups.

The last output line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import add_json_out, guard_ratios, load_fields, quiet_machine, record


def batches(flush_steps: int, flushes: int):
    """flushes x flush_steps rows, half chain, half tree, as record batches of 256 rows
    (what the tracer's worker hands over per conversion)."""
    import pyarrow as pa

    from specaudit.trace.synth import synth_run_rows
    out = []
    for algo, kw in (("chain", {"n_nodes": 8}), ("tree", {"n_nodes": 13, "topk": 3})):
        need = flush_steps * flushes // 2
        steps, _, _ = synth_run_rows(max(need // 40, 8), algo=algo, max_new_tokens=256, concurrency=8,
                                     run_id="bench", **kw)
        while steps.num_rows < need:
            steps = pa.concat_tables([steps, steps])
        steps = steps.slice(0, need).combine_chunks()
        out += steps.to_batches(max_chunksize=256)
    return out


def run_sink(kind: str, root: Path, data, flush_steps: int) -> tuple[float, float, int]:
    """(CPU s of the flushes, CPU s of close_run, steps) for one sink kind."""
    import pyarrow as pa

    from specaudit.trace import parquet as P
    run_id = f"{kind}-{time.monotonic_ns()}"
    sink = P.ParquetSink(root, run_id, flush_steps=flush_steps, flush_s=1e9, rollups=(kind == "rollup"))
    sink.open_run({"run_id": run_id})
    pending, n = [], 0
    c0 = time.process_time()
    for b in data:
        n += b.num_rows
        if kind != "per_file":
            sink.write_steps(b)
            continue
        # the former layout: each steps file and its own rollup, written at flush time
        pending.append(b)
        if sum(x.num_rows for x in pending) >= flush_steps:
            table = pa.Table.from_batches(pending, schema=pending[0].schema)
            P.write_with_rollup(sink.run_dir / f"steps-{sink._seq:06d}.parquet", table, sink.row_group_size)
            sink._seq += 1
            pending = []
    c1 = time.process_time()
    sink.close_run({"run_id": run_id})
    c2 = time.process_time()
    return c1 - c0, c2 - c1, n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flush-steps", type=int, default=4096, help="steps per flush (the sink's default 4096)")
    ap.add_argument("--flushes", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    add_json_out(ap, "sink_rollup")
    args = ap.parse_args(argv)
    data = batches(args.flush_steps, args.flushes)
    root = Path(tempfile.mkdtemp(prefix="specaudit-bench-sink-"))
    kinds = ("plain", "rollup", "per_file")
    flush = {k: [] for k in kinds}
    close = {k: [] for k in kinds}
    total = {k: [] for k in kinds}
    steps = 0
    try:
        run_sink("rollup", root, data[:8], args.flush_steps)      # warm imports
        quiet_machine()
        for rnd in range(args.rounds):
            for k in kinds:
                f, c, steps = run_sink(k, root, data, args.flush_steps)
                flush[k].append(f / steps * 1e6)
                close[k].append(c * 1e3)
                total[k].append((f + c) / steps * 1e6)
            print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(f"{k} {flush[k][-1]:.2f} us/step"
                                                              for k in kinds) + " (flushes)", file=sys.stderr,
                  flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(total[k]) for k in kinds}
    out = {"steps": steps, "flush_steps": args.flush_steps, "rounds": args.rounds,
           "total_cpu_us_per_step": {k: round(v, 3) for k, v in med.items()},
           "flush_cpu_us_per_step": {k: round(statistics.median(flush[k]), 3) for k in kinds},
           "close_cpu_ms": {k: round(statistics.median(close[k]), 1) for k in kinds},
           "rollup_cost": round(med["rollup"] / med["plain"] - 1, 3),
           "per_file_cost": round(med["per_file"] / med["plain"] - 1, 3)}
    out.update(load_fields())
    print(json.dumps(guard_ratios(out, ["rollup_cost", "per_file_cost"])))
    record("sink_rollup", out, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
