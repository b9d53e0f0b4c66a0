"""The test suite's own figures: pytest's wall time with the README's test command, where
the cores went, and which modules hold the time. Prints one JSON line.

    python3 scripts/bench_suite.py                      # the pytest line of scripts/test.sh
    python3 scripts/bench_suite.py --workers 3,4        # the same suite at -n 3 and -n 4, in turn
    python3 scripts/bench_suite.py --log-dir /tmp/suite # each run's whole pytest output kept there

It runs the pytest line of scripts/test.sh (the installs before it are assumed done: run
`bash scripts/test.sh` once first), with `-n` set to each --workers value, while it
reads the machine's CPU counters once a second; tests/conftest.py appends each test's
worker, wall span and CPU seconds (its own and its children's) to a timeline file
(SPECAUDIT_TEST_TIMELINE).

Words: pytest_s = pytest's wall time, start to summary (what scripts/test.sh prints last);
cpu_s = CPU seconds the whole machine spent meanwhile; busy = cpu_s / (wall x cores), the
share of the cores kept busy; idle_core_s = core-seconds left idle; per_worker = each xdist
worker's tests and when it last finished; modules = the modules holding the most wall time on
their worker (wall, own + children's CPU). The load is read
before the run (the suite is the load while it runs); a machine busy before it withholds
the ratio to the target.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import ROOT, add_json_out, guard_ratios, load_fields, quiet_machine, record  # noqa: E402

TARGET_S = 480.0     # issue 35: the suite under 8 minutes of pytest on this machine
# pytest's last line: "2047 passed, 1 skipped in 476.93s (0:07:56)" (-q), maybe between ='s
SUMMARY = re.compile(r"^=*\s*(?P<counts>\d+ (?:passed|failed|errors?|skipped)[^=\n]*?) in (?P<secs>[\d.]+)s", re.M)
# the short summary's lines (-q prints them for every failure): "FAILED tests/a.py::b[x] - AssertionError..."
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def test_sh_pytest() -> list[str]:
    """scripts/test.sh's pytest line as argv ("$@", the extra arguments, dropped)."""
    line = next(ln for ln in (ROOT / "scripts" / "test.sh").read_text().splitlines()
                if ln.startswith("exec ") and " pytest " in ln)
    return [a for a in shlex.split(line)[1:] if a != "$@"]


def pytest_argv(workers: int) -> list[str]:
    """scripts/test.sh's pytest line with -n set to `workers`."""
    argv = test_sh_pytest()
    argv[argv.index("-n") + 1] = str(workers)
    return argv


class CpuSampler:
    """The machine's busy CPU seconds (/proc/stat: all but idle and iowait), once a second."""

    def __init__(self):
        self.samples: list[tuple[float, float]] = []    # (time, busy CPU seconds since start)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _busy() -> float:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")

    def __enter__(self):
        self._b0 = self._busy()
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(1.0):
            self.samples.append((time.time(), self._busy() - self._b0))

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.samples.append((time.time(), self._busy() - self._b0))


def summarise(timeline: list[dict], top: int = 12) -> dict:
    """Per worker (tests, first start, last end) and the modules holding the most wall time."""
    workers: dict = defaultdict(lambda: {"tests": 0, "start": float("inf"), "end": 0.0})
    mods: dict = defaultdict(lambda: [0.0, 0.0, 0])
    for r in timeline:
        w = workers[r["worker"]]
        w["tests"] += 1
        w["start"], w["end"] = min(w["start"], r["start"]), max(w["end"], r["end"])
        m = mods[r["test"].split("::", 1)[0]]
        m[0] += r["end"] - r["start"]
        m[1] += r["cpu_s"] + r.get("children_cpu_s", 0.0)
        m[2] += 1
    t0 = min((w["start"] for w in workers.values()), default=0.0)
    return {
        "per_worker": {k: {"tests": v["tests"], "busy_from_s": round(v["start"] - t0, 1),
                        "last_end_s": round(v["end"] - t0, 1)} for k, v in sorted(workers.items())},
        "modules": [{"module": k, "wall_s": round(v[0], 1), "cpu_s": round(v[1], 1), "tests": v[2]}
                    for k, v in sorted(mods.items(), key=lambda kv: -kv[1][0])[:top]],
    }


def failed_tests(text: str) -> list[str]:
    """The node ids pytest's short summary names FAILED or ERROR, in its order."""
    return list(dict.fromkeys(FAILED.findall(text)))


def run_suite(workers: int, log, log_dir: Path | None = None) -> dict:
    """One run of the suite at -n `workers`; its whole output goes to
    log_dir/pytest-n<workers>.log when log_dir is given."""
    with tempfile.TemporaryDirectory() as tmp:
        tl = Path(tmp) / "timeline.jsonl"
        # a fresh pytest, even when started from inside one (tests/test_bench_suite.py under xdist):
        # a worker's variables would make its conftest think it is that worker
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
        env["SPECAUDIT_TEST_TIMELINE"] = str(tl)
        t0 = time.time()
        kept = Path(log_dir) / f"pytest-n{workers}.log" if log_dir is not None else Path(tmp) / "pytest.log"
        with CpuSampler() as cpu, open(kept, "w+") as out:
            p = subprocess.run(pytest_argv(workers), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            out.seek(0)
            text = out.read()
        wall = time.time() - t0
        timeline = [json.loads(ln) for ln in tl.read_text().splitlines()] if tl.exists() else []
    m = list(SUMMARY.finditer(text))
    if p.returncode != 0 or not m:
        print(text[-3000:], file=log)
        if log_dir is not None:
            print(f"(the whole output: {kept})", file=log)
    cores = os.cpu_count() or 1
    cpu_s = cpu.samples[-1][1]
    return {"workers": workers, "exit_code": p.returncode,
            "result": m[-1]["counts"].strip() if m else None, "failed": failed_tests(text),
            "pytest_s": float(m[-1]["secs"]) if m else None, "wall_s": round(wall, 1),
            "cpu_s": round(cpu_s, 1), "busy": round(cpu_s / (wall * cores), 3),
            "idle_core_s": round(wall * cores - cpu_s, 1), **summarise(timeline)}


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated worker counts, e.g. 2,3")
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--workers", type=_counts, default=None,
                    help="comma-separated -n values, run in turn (default: scripts/test.sh's own)")
    ap.add_argument("--log-dir", type=Path, default=None,
                    help="where each run's whole pytest output goes, as pytest-n<workers>.log "
                         "(default: a new temporary folder, printed)")
    add_json_out(ap, "suite")
    args = ap.parse_args(argv)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="specaudit-bench-suite-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    line = test_sh_pytest()
    own = int(line[line.index("-n") + 1])
    counts = args.workers or [own]
    load_before = quiet_machine()
    quiet = load_fields()["machine_quiet"]
    runs = []
    for n in counts:
        print(f"pytest -n {n} ...", file=sys.stderr)
        runs.append(run_suite(n, sys.stderr, log_dir))
        print(json.dumps({k: runs[-1][k] for k in ("workers", "result", "pytest_s", "busy")}), file=sys.stderr)
    mine = next((r for r in runs if r["workers"] == own), runs[0])
    out = {"test_sh_workers": own, "pytest_s": mine["pytest_s"], "target_s": TARGET_S,
           "of_target": round(mine["pytest_s"] / TARGET_S, 3) if mine["pytest_s"] else None,
           "busy": mine["busy"], "runs": runs, **load_fields(),
           # the load before the run: while it runs, the suite is the load
           "load_avg_1m": round(load_before, 2), "machine_quiet": quiet}
    guard_ratios(out, ["of_target"])
    print(json.dumps(out))
    record("suite", out, args.json_out)
    print(f"pytest's whole output: {log_dir}/pytest-n<workers>.log", file=sys.stderr)
    return 0 if all(r["exit_code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
