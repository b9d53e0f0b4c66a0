"""What every benchmark shares: the machine's load, read beside the figures.

A ratio measured while other processes compete for the cores is noise, not a
regression. The busy rule itself is the library's (specaudit/machine_load.py, shared with
the demo: load average above SPECAUDIT_BENCH_LOAD, default 0.75, x cores).
`quiet_machine()` waits (up to `wait_s`) for the machine to be quiet and returns the load
it saw; `load_fields()` (machine_load's) gives the keys every benchmark's JSON line
carries; `guard_ratios()` withholds the ratios of a run that stayed busy, so a noisy
figure is never mistaken for a result.

    from benchutil import guard_ratios, load_fields, quiet_machine
    quiet_machine()                          # before measuring
    out = {...figures...}
    out.update(load_fields())                # load_avg_1m, cores, load_threshold, machine_quiet
    guard_ratios(out, ["trace_overhead"])    # busy: the ratio becomes null, with the reason
    record("runtime", out, args.json_out)    # docs/benchmarks/runtime.json (add_json_out)

`record()` writes the figures with what produced them (command line, commit, date,
machine: cores and load) to docs/benchmarks/<name>.json, which scripts/render_docs.py
renders into the docs' benchmarks page: no figure is typed into the docs by hand.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

# The busy rule (load average above SPECAUDIT_BENCH_LOAD, default 0.75, x cores), the load
# reading and the load keys are the library's (specaudit/machine_load.py), shared with the demo.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repository root: specaudit
from specaudit import machine_load  # noqa: E402  (the repository root on the path first)
from specaudit.machine_load import load_fields  # noqa: E402,F401  (what every benchmark imports from here)


def quiet_machine(wait_s: float = 120.0, poll_s: float = 5.0, log=sys.stderr) -> float:
    """Wait until the load average is below the threshold (at most wait_s, or the
    SPECAUDIT_BENCH_WAIT_S environment variable's seconds); return the load."""
    wait_s = float(os.environ.get("SPECAUDIT_BENCH_WAIT_S", wait_s))
    t0 = time.time()
    load = machine_load.load_avg()
    while machine_load.is_busy(load) and time.time() - t0 < wait_s:
        print(f"machine busy: load average {load:.2f} > {machine_load.threshold():.2f} "
              f"({machine_load.per_core()} x {machine_load.cores()} cores); waiting", file=log)
        time.sleep(poll_s)
        load = machine_load.load_avg()
    return load


def guard_ratios(out: dict, keys) -> dict:
    """Null the ratios in `keys` when the machine was busy, and say why in `withheld`."""
    if out.get("machine_quiet", True):
        return out
    held = [k for k in keys if out.get(k) is not None]
    for k in held:
        out[k] = None
    if held:
        out["withheld"] = (f"{', '.join(held)}: load average {out.get('load_avg_1m')} above "
                           f"{out.get('load_threshold')} while measuring; rerun on a quiet machine")
    return out


ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "docs" / "benchmarks"


def add_json_out(parser, name: str) -> None:
    """--json-out PATH (default docs/benchmarks/<name>.json; '-' writes none)."""
    parser.add_argument("--json-out", default=str(BENCH_DIR / f"{name}.json"),
                        help=f"where the figures go with their provenance (default docs/benchmarks/{name}.json; "
                             "'-' for none): scripts/render_docs.py renders the docs' benchmarks page from them")


def _git(*args) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(argv=None) -> dict:
    """What produced a figure: the command line, the commit (and whether the tree had
    uncommitted changes), the date (UTC) and the machine (cores, load, CPU, Python)."""
    argv = sys.argv if argv is None else argv
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"command": " ".join(["python3", *map(shlex.quote, argv)]),
            "commit": _git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {**load_fields(), "cpu": _cpu_model(), "python": platform.python_version(),
                        "platform": platform.platform(terse=True)}}


def record(name: str, figures: dict, path: str | os.PathLike | None = None, argv=None) -> Path | None:
    """Write {benchmark, provenance..., figures} to `path` (default docs/benchmarks/<name>.json;
    '-' writes nothing); -> the path written."""
    if path == "-":
        return None
    path = Path(path) if path else BENCH_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": name, **provenance(argv), "figures": figures}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    print(f"figures written to {path}", file=sys.stderr)
    return path


def checker_step_batches(run_dir, lists_only: bool = False):
    """A run folder's step files read as `specaudit check` reads them: the same columns
    (its list columns only, with lists_only), batch size and thread policy (the check's
    decode limit and reading in scripts/bench_check.py)."""
    from pathlib import Path

    import pyarrow.parquet as pq

    from specaudit.audit.check.core import BATCH_ROWS
    from specaudit.audit.check.stream import STEP_READ_COLUMNS, is_big_file, proven_diagnostics
    for f in sorted(Path(run_dir).glob("steps-*.parquet")):
        pf = pq.ParquetFile(f, read_dictionary=["run_id", "request_id", "algo"])
        skip = proven_diagnostics(pf.metadata)
        cols = [c for c in STEP_READ_COLUMNS if c in pf.schema_arrow.names and c not in skip
                and (not lists_only or str(pf.schema_arrow.field(c).type).startswith("list"))]
        yield from pf.iter_batches(batch_size=BATCH_ROWS, columns=cols, use_threads=is_big_file(f))
