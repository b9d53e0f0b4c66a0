"""Benchmark `specaudit ab A B` (specaudit.audit.ab_evidence) on large inputs.

    python scripts/bench_ab_evidence.py                     # 100k log lines a side, 500k trace steps a side
    python scripts/bench_ab_evidence.py --lines 20000 --steps 100000

Writes two SGLang logs (A at two concurrencies, B at one: the seed case's shape) and two
synthetic trace datasets into a temporary folder, then times the whole comparison of
each pair (reading, windows, strata, bootstrap, confounders) in this one process. Prints
one human line per pair and, last, one JSON line with the machine's load beside the
figures (scripts/benchutil.py; no ratios here, so nothing is withheld).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # scripts/: benchutil
from benchutil import add_json_out, load_fields, quiet_machine, record  # noqa: E402  (the scripts folder on the path first)


def sglang_log(path: Path, windows, seed: int, algo: str) -> None:
    r = random.Random(seed)
    with open(path, "w") as f:
        f.write(f"[2026-11-02 10:00:00] server_args=ServerArgs(model_path='m', speculative_algorithm='{algo}', "
                "speculative_num_steps=7, speculative_eagle_topk=1, speculative_num_draft_tokens=8, dp_size=1)\n")
        t = 0
        for c, L, n in windows:
            for _ in range(n):
                t += 3
                acc = r.gauss(L, 0.05)
                tps = c * acc / (0.012 + 0.0004 * c) * r.gauss(1, 0.01)
                f.write(f"[2026-11-02 10:{t // 60 % 60:02d}:{t % 60:02d}] Decode batch, #running-req: {c}, "
                        f"#token: {700 * c}, token usage: 0.01, accept len: {acc:.2f}, accept rate: "
                        f"{(acc - 1) / 7:.2f}, cuda graph: True, gen throughput (token/s): {tps:.2f}, "
                        "#queue-req: 0, \n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000, help="decode lines per log side")
    ap.add_argument("--steps", type=int, default=500_000, help="trace step rows per dataset side")
    ap.add_argument("--bootstrap", type=int, default=2000)
    add_json_out(ap, "ab_evidence")
    args = ap.parse_args()
    from specaudit.audit.ab_evidence import compare_sides
    from specaudit.trace.synth import write_synthetic_dataset

    tmp = Path(tempfile.mkdtemp(prefix="bench_ab_"))
    try:
        n = args.lines
        sglang_log(tmp / "a.log", [(32, 3.9, n * 3 // 4), (1, 2.05, n - n * 3 // 4)], 1, "DFLASH")
        sglang_log(tmp / "b.log", [(1, 2.05, n)], 2, "DDTREE")
        quiet_machine()
        t0, c0 = time.perf_counter(), time.process_time()
        res = compare_sides(str(tmp / "a.log"), str(tmp / "b.log"), n_boot=args.bootstrap)
        log_s, log_cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"logs: {2 * n:,} lines in {log_s:.2f} s ({2 * n / log_s:,.0f} windows/s); {res['conclusion']}")

        write_synthetic_dataset(tmp / "ta", n_steps=args.steps, n_nodes=8, algo="chain", seed=1, concurrency=8)
        write_synthetic_dataset(tmp / "tb", n_steps=args.steps, n_nodes=8, algo="tree", seed=2, concurrency=8)
        t0, c0 = time.perf_counter(), time.process_time()
        res2 = compare_sides(str(tmp / "ta"), str(tmp / "tb"), n_boot=args.bootstrap)
        tr_s, tr_cpu = time.perf_counter() - t0, time.process_time() - c0
        wins = res2["sides"]["A"]["windows"] + res2["sides"]["B"]["windows"]
        print(f"traces: {2 * args.steps:,} step rows -> {wins:,} windows in {tr_s:.2f} s "
              f"({2 * args.steps / tr_s:,.0f} rows/s); {res2['conclusion']}")
        out = {
            "bench": "ab_evidence", "cpu_count": os.cpu_count(),
            "log_lines": 2 * n, "log_seconds": round(log_s, 3), "log_cpu_seconds": round(log_cpu, 3),
            "log_windows_per_s": round(2 * n / log_s), "trace_rows": 2 * args.steps, "trace_windows": wins,
            "trace_seconds": round(tr_s, 3), "trace_cpu_seconds": round(tr_cpu, 3),
            "trace_rows_per_s": round(2 * args.steps / tr_s), "bootstrap": args.bootstrap,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "log_verdict": res["verdict"], "trace_verdict": res2["verdict"], **load_fields(),
        }
        print(json.dumps(out))
        record("ab_evidence", out, args.json_out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
