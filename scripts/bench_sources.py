"""Stream a large engine log through the readers and rules: time and peak memory.

    python scripts/bench_sources.py                 # 100 MiB and 1 GiB vLLM logs (the issue's sizes)
    python scripts/bench_sources.py --mib 256       # one size

Writes a vLLM log of real-shaped lines (the corpus's vllm-ascend-13640 windows, one in 97
broken so the rules keep finding things) into a temporary folder, audits it with
specaudit.audit.sources.audit_file in this process, and measures the peak resident set
(ru_maxrss) against the same process before reading. The last line printed is one JSON
object per size: file size, lines, seconds (wall and CPU of this process), MiB/s (wall
and CPU), peak RSS growth, findings, and the load beside them (benchutil). Every line of
this log is a spec line (the worst case: the readers' prefilter passes all of it).
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, action="append", help="size of the generated log in MiB (repeatable; "
                                                              "default 100 and 1024)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))
    from benchutil import load_fields

    from specaudit.audit.sources import audit_file
    for mib in args.mib or [100, 1024]:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "vllm.log"
            lines = write_log(path, mib)
            size = path.stat().st_size
            base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
            t0, c0 = time.perf_counter(), time.process_time()
            fs = audit_file(path)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        mb = size / 2**20
        out = {"bench": "sources_stream", "file_mib": round(mb, 1), "lines": lines, "seconds": round(dt, 2),
               "cpu_seconds": round(cpu, 2), "mib_per_s": round(mb / dt, 2), "mib_per_cpu_s": round(mb / cpu, 2),
               "rss_before_mib": round(base, 1), "rss_peak_growth_mib": round(peak - base, 1), "findings": len(fs),
               "error_codes": sorted({f.code for f in fs if f.severity == "error"}), "pid": os.getpid(),
               **load_fields()}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
