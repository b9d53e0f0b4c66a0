"""Stream a large engine log through the readers and rules: time and peak memory.

    python scripts/bench_sources.py                 # 100 MiB and 1 GiB vLLM logs (the issue's sizes)
    python scripts/bench_sources.py --mib 256       # one size

Writes a vLLM log of real-shaped lines (the corpus's vllm-ascend-13640 windows, one in 97
broken so the rules keep finding things) into a temporary folder, audits it with
specaudit.audit.sources.audit_file (in parallel from 64 MiB on). The last line printed is one JSON
object per size: the parallel run (SPECAUDIT_WORKERS = the CPUs allowed, or --workers)
and the one-worker run side by side, each with wall and CPU seconds (this process plus
its workers), MiB/s, peak RSS (this process, largest worker) and findings; the wall
speed-up; and the load beside them (benchutil). Every line of this log is a spec line
(the worst case: the readers' prefilter passes all of it).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "engines" / "corpus" / "rendered"


def write_log(path: Path, mib: int) -> int:
    clean = (CORPUS / "vllm-ascend-13640-dspark-k7.log").read_text()
    broken = (CORPUS / "vllm-broken-per-position-rising.log").read_text()
    block = (clean * 48 + broken).encode()
    n = 0
    target = mib * 2**20
    with open(path, "wb") as f:
        while f.tell() < target:
            f.write(block)
            n += block.count(b"\n")
    return n


def _run(path: Path, workers: int) -> dict:
    """audit_file with SPECAUDIT_WORKERS=workers: wall and CPU seconds (this process and its
    workers), peak RSS of this process and of the largest worker."""
    from specaudit.audit.sources import audit_file
    os.environ["SPECAUDIT_WORKERS"] = str(workers)
    self0, kids0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    fs = audit_file(path)
    dt = time.perf_counter() - t0
    self1, kids1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime
           + kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime)
    return {"workers": workers, "seconds": round(dt, 2), "cpu_seconds": round(cpu, 2),
            "rss_peak_mib": round(self1.ru_maxrss / 1024, 1), "worker_rss_peak_mib": round(kids1.ru_maxrss / 1024, 1),
            "findings": len(fs), "error_codes": sorted({f.code for f in fs if f.severity == "error"})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, action="append", help="size of the generated log in MiB (repeatable; "
                                                              "default 100 and 1024)")
    ap.add_argument("--workers", type=int, default=None, help="parallel workers (default: the CPUs allowed)")
    ap.add_argument("--no-sequential", action="store_true", help="skip the one-worker run beside the parallel one")
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))
    from benchutil import add_json_out, load_fields, record
    add_json_out(ap, "sources")
    args = ap.parse_args(argv)

    from specaudit.audit.sources.parallel import workers
    n = args.workers or workers()
    sizes = []
    for mib in args.mib or [100, 1024]:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "vllm.log"
            lines = write_log(path, mib)
            mb = path.stat().st_size / 2**20
            runs = [_run(path, n)] + ([] if args.no_sequential or n == 1 else [_run(path, 1)])
        for r in runs:
            r["mib_per_s"] = round(mb / r["seconds"], 2)
            r["mib_per_cpu_s"] = round(mb / r["cpu_seconds"], 2) if r["cpu_seconds"] else None
        out = {"bench": "sources_stream", "file_mib": round(mb, 1), "lines": lines, "runs": runs,
               "speedup_wall": round(runs[1]["seconds"] / runs[0]["seconds"], 2) if len(runs) > 1 else None,
               "same_findings": len({(r["findings"], tuple(r["error_codes"])) for r in runs}) == 1,
               "pid": os.getpid(), **load_fields()}
        print(json.dumps(out), flush=True)
        sizes.append(out)
    record("sources", {"sizes": sizes}, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
