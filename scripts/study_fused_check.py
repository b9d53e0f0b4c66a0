"""A study for issue 35, not the checker: how close to the decode limit could a check come
if it did not sort rows by (request, step)?

    python3 scripts/study_fused_check.py --dir /tmp/benchq/chain    # a bench_check chain dataset
    python3 scripts/study_fused_check.py --dir /tmp/benchq/tree     # a tree N=32 one
    python3 scripts/study_fused_check.py --steps 200000              # a new one, removed after

Today's checker sorts each batch by (request, step), gathers every column in that order and
runs ~30 compiled passes and the numpy around them: its own work per step
(scripts/bench_check.py: check_work_ns_per_step) is about three times what 0.6 of the decode
limit leaves for it (check_work_ns_per_step_for_target). The premise of a redesign: the sink
writes each request's steps in order, so a batch can be checked in batch order, each row
linked to its request's carried state, in one compiled pass (study_fused_check.c) over the
Arrow buffers as decoded. This script runs that pass over a chain or tree dataset (uniform N) with
the checker's reading (same columns, batches, read-ahead thread and Arrow pool) and prints,
as JSON: the decode limit (the list columns decoded alone, fastest of 3), everything read
alone, and the fused pass (median of 3): fused_of_decode_limit and fused_work_ns_per_step.
It covers the core per-row rules only (no requests table, no run rules, no findings, only a
count of bad rows): what the rest of a redesign may spend is the headroom it shows.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchutil import checker_step_batches  # noqa: E402  (this folder on the path first)


def _i32(arr, values: bool = False, offsets: bool = False) -> np.ndarray:
    """An int32 Arrow array's buffer (a list's values or offsets) as numpy, no copy."""
    if values:
        v = arr.values
        return np.frombuffer(v.buffers()[1], dtype=np.int32, count=len(v), offset=v.offset * 4)
    n = len(arr) + (1 if offsets else 0)
    return np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n, offset=arr.offset * 4)


def fused_pass(run: Path, lib) -> tuple[int, int]:
    """The fused pass over a run (fused_chain for a chain batch, fused_tree for a tree's)
    -> (rows, bad rows)."""
    from specaudit.invariants.carry import Carry

    from specaudit.audit.check.stream import _ReadAhead  # the checker's read-ahead thread
    carry, S = Carry(), 1 << 16
    state = [np.zeros(S, np.int32), np.zeros(S, np.int64), np.zeros(S, np.uint8), np.zeros(S, np.int64),
             np.zeros(S, np.uint64)]   # last step, seq_len + commit, seen, output length, fingerprint
    bad = n = 0
    for b in _ReadAhead(checker_step_batches(run)):
        c = {k: b.column(i) for i, k in enumerate(b.schema.names)}
        rid = c["request_id"]
        gidx = np.asarray(carry.index(rid.dictionary.to_pylist()), dtype=np.int64)
        if carry.n > len(state[0]):    # more requests than slots: grow the state
            state = [np.concatenate([a, np.zeros(max(carry.n, 2 * len(a)) - len(a), a.dtype)]) for a in state]
        nt = c["node_tokens"]
        N = (len(nt.values) // len(nt)) if len(nt) else 0
        arrs = [_i32(rid.indices), gidx, _i32(c["step"]), _i32(c["seq_len"]), _i32(nt, values=True),
                _i32(c["parents"], values=True), _i32(c["positions"], values=True),
                _i32(c["target_argmax"], values=True), _i32(c["accepted_path"], offsets=True),
                _i32(c["accepted_path"], values=True), _i32(c["committed_tokens"], offsets=True),
                _i32(c["committed_tokens"], values=True), _i32(c["accepted_depth"]), _i32(c["commit_len"]), *state]
        algo = c["algo"].dictionary[c["algo"].indices[0].as_py()].as_py() if b.num_rows else "chain"
        kernel = lib.fused_chain if algo == "chain" else lib.fused_tree
        bad += kernel(b.num_rows, N, *(a.ctypes.data for a in arrs))
        n += b.num_rows
    return n, bad


def _timed(fn):
    t, c = time.perf_counter(), os.times()
    out = fn()
    c2 = os.times()
    return time.perf_counter() - t, (c2.user - c.user) + (c2.system - c.system), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="a dataset folder holding one run, chain or tree (bench_check's --dir)")
    ap.add_argument("--steps", type=int, default=200_000, help="without --dir: a new dataset of this size")
    ap.add_argument("--algo", choices=["chain", "tree"], default="chain", help="without --dir: its shape")
    ap.add_argument("--n-nodes", type=int, default=8, help="without --dir: nodes per step N (default 8)")
    ap.add_argument("--repeat", type=int, default=3, help="fused passes; the median is reported (default 3)")
    args = ap.parse_args(argv)
    from specaudit.invariants.compiled import library

    from specaudit.audit.check.arrow_pool import use_check_pool
    use_check_pool()   # as `specaudit check` runs
    lib = library(HERE / "study_fused_check.c")
    for fn in (lib.fused_chain, lib.fused_tree):
        fn.argtypes = [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 19
        fn.restype = ctypes.c_int64
    tmp = None
    try:
        base = args.dir
        if base is None:
            from specaudit.trace.synth import write_synthetic_dataset
            base = tmp = Path(tempfile.mkdtemp(prefix="study-fused-"))
            write_synthetic_dataset(base, args.steps, n_nodes=args.n_nodes, algo=args.algo, seed=0)
        runs = sorted(base.glob("run_id=*"))
        if len(runs) != 1:
            print(f"study_fused_check: {base}: one run folder expected, found {len(runs)}", file=sys.stderr)
            return 2
        run = runs[0]
        fused_pass(run, lib)   # warm: the library built, the files in the page cache
        from specaudit.audit.check.stream import _ReadAhead
        dec = min(_timed(lambda: sum(b.num_rows for b in checker_step_batches(run, True)))[:2] for _ in range(3))
        rd = min(_timed(lambda: sum(b.num_rows for b in _ReadAhead(checker_step_batches(run))))[:2]
                 for _ in range(3))
        fu = sorted((_timed(lambda: fused_pass(run, lib)) for _ in range(max(1, args.repeat))),
                    key=lambda x: x[0])[max(1, args.repeat) // 2]
        n, bad = fu[2]
        print(json.dumps({"study": "fused_check", "steps": n, "bad_rows": bad,
                          "decode_lists_seconds": round(dec[0], 3), "read_all_seconds": round(rd[0], 3),
                          "read_all_cpu_seconds": round(rd[1], 3), "fused_seconds": round(fu[0], 3),
                          "fused_cpu_seconds": round(fu[1], 3),
                          "fused_of_decode_limit": round(dec[0] / fu[0], 3) if fu[0] else None,
                          "fused_work_ns_per_step": round((fu[1] - rd[1]) / n * 1e9) if n else None,
                          "load_avg_1m": round(os.getloadavg()[0], 2), "cores": os.cpu_count()}))
        return 0
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
