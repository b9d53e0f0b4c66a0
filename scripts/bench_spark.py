"""Benchmark `specaudit check --engine spark` against the single-process checker, per core.

    python3 scripts/bench_spark.py                      # 5M steps over 8 runs (N = 8 chains)
    python3 scripts/bench_spark.py --steps 500000       # a quick look
    python3 scripts/bench_spark.py --task-bytes -1      # every run by request buckets (the old path)

1. writes a contract-valid synthetic dataset of --steps steps split over --runs runs
   (specaudit.trace.synth; a fleet is many runs), and a one-run dataset of 1000 steps;
2. checks it, each in a fresh process, side by side in this one invocation: the local
   checker (check_paths), then Spark local[1] and local[2] (check_spark, same rules);
   all three must report the same finding counts (asserted);
3. per phase: steps/s of the check alone, Spark's startup (SparkSession creation), the
   peak RSS of the whole process tree (JVM plus Python workers, sampled every 0.2 s) and
   its CPU seconds (`cpu_s`, startup included), and the CPU of the check itself:

   - local: `cpu_s_per_step_local`, the process's CPU seconds (user + system, its
     threads and reaped worker processes: os.times) over the check, per step;
   - Spark: `cpu_s_per_step_spark`, what the executors spent per step: Spark's task
     metrics (Executor CPU Time + Executor Deserialize CPU Time of every task of the
     check's jobs, read from Spark's event log: `cpu_s_spark_jvm_tasks`) for the JVM
     side, plus the CPU of the Python workers that ran the tasks, which Spark's metrics
     do not count: each worker's CPU since it was forked, as its tasks report it
     (check_spark's stats["python_worker_cpu_s"]: imports and Spark's framing included,
     complete because the check is the session's first Python job;
     `cpu_s_spark_python_workers`), of which the task functions themselves spent
     `cpu_s_spark_python_tasks`. The driver's own CPU (listing, combining) is beside it
     (`cpu_s_driver_spark`), a cost paid once per check, not per core.
     From local[1] (one executor core); local[2]'s figure is `cpu_s_per_step_spark_2`.
     It is a fresh session's first check: the JVM's JIT warm-up and the workers'
     imports (about a second of CPU) are in it, a fixed cost that a dataset of a few
     hundred thousand steps does not amortise (measure with the default 5M).

   `spark_over_local_cpu_per_step` is their ratio (the target: 2 or less).

Break-even on a cluster, from those figures: with c_l = cpu_s_per_step_local (one core,
the local checker), c_s = cpu_s_per_step_spark, W executor cores (--cluster-cores) and a
fixed wall cost F = Spark's startup + the wall time of checking the one-run dataset (a
job's fixed cost), Spark takes F + steps x c_s / W seconds against steps x c_l locally,
so it is faster above `break_even_steps` = F / (c_l - c_s / W), and only on more than
c_s / c_l cores (`break_even_min_cores`; `break_even_steps` null below that). The summary carries the load
(scripts/benchutil.py) and withholds the ratios and the break-even (and
spark_2_over_1) when the machine was busy.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # scripts/: benchutil
from benchutil import add_json_out, guard_ratios, load_fields, quiet_machine, record  # noqa: E402  (the scripts folder on the path first)

from specaudit.machine_load import load_avg  # noqa: E402  (benchutil puts the repository root on the path)

CHILD_LOCAL = r"""
import json, os, sys, time
from specaudit.audit.check import check_paths
cpu = lambda: sum(os.times()[:4])           # user, system, and of reaped children (pool workers)
t, c = time.perf_counter(), cpu()
r = check_paths([sys.argv[1]], max_per_code=100)
print(json.dumps({"steps": r.steps, "requests": r.requests, "seconds": time.perf_counter() - t,
                  "check_cpu_s": cpu() - c, "counts": dict(r.counts)}))
"""

CHILD_SPARK = r"""
import glob, json, os, sys, time
from specaudit.audit.spark import check_spark
from specaudit.audit.spark_session import session
data, master, parts, tiny, logdir, task_bytes = sys.argv[1:7]
cpu = lambda: sum(os.times()[:2])           # this (driver) process
t = time.perf_counter()
cores = int(master.strip("local[]") or 1)     # local[N] -> N
s = session(master, shuffle_partitions=int(parts) or cores,
            **{"spark.eventLog.enabled": "true", "spark.eventLog.dir": "file://" + logdir,
               "spark.eventLog.rolling.enabled": "false", "spark.eventLog.compress": "false"})   # one JSON-lines file
s.range(1).count()                      # the JVM and a first task are up
startup = time.perf_counter() - t
sc = s.sparkContext
sc.setJobGroup("check", "the check measured")
stats = {}
t, c = time.perf_counter(), cpu()
r = check_spark(s, [data], max_per_code=100, task_bytes=int(task_bytes), stats=stats)
seconds, driver_cpu = time.perf_counter() - t, cpu() - c
sc.setJobGroup("fixed", "a one-run check: the fixed cost of a job")
t = time.perf_counter()
check_spark(s, [tiny], max_per_code=100)
fixed = time.perf_counter() - t
s.stop()                                # flushes the event log
jobs, tasks = set(), {"cpu_ns": 0, "n": 0}
stages = set()
for line in open(glob.glob(os.path.join(logdir, "*"))[0]):
    ev = json.loads(line)
    if ev["Event"] == "SparkListenerJobStart" and (ev.get("Properties") or {}).get("spark.jobGroup.id") == "check":
        stages.update(ev["Stage IDs"])
    elif ev["Event"] == "SparkListenerTaskEnd" and ev["Stage ID"] in stages:
        m = ev.get("Task Metrics") or {}
        tasks["cpu_ns"] += m.get("Executor CPU Time", 0) + m.get("Executor Deserialize CPU Time", 0)
        tasks["n"] += 1
print(json.dumps({"steps": r.steps, "requests": r.requests, "seconds": seconds, "startup_s": startup,
                  "fixed_check_s": fixed, "jvm_task_cpu_s": tasks["cpu_ns"] / 1e9, "tasks": tasks["n"],
                  "python_task_cpu_s": stats["python_cpu_s"], "python_worker_cpu_s": stats["python_worker_cpu_s"],
                  "driver_cpu_s": driver_cpu, "counts": dict(r.counts),
                  "plan": {k: v for k, v in stats.items() if not k.endswith("cpu_s")}}))
"""


def tree_usage(pid: int) -> tuple[float, float]:
    """(RSS in MB, CPU seconds) of a process and all its descendants, from /proc. CPU
    counts each live process's own time plus its reaped children's (cutime, cstime:
    Spark's Python workers are forked and reaped by the worker daemon), so the largest
    sample over a phase is about the CPU the whole tree (driver, JVM, workers) spent."""
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    cpu: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            kids.setdefault(int(parts[1]), []).append(int(d))
            rss[int(d)] = int(parts[21]) * os.sysconf("SC_PAGE_SIZE")
            cpu[int(d)] = sum(int(x) for x in parts[11:15])   # utime stime cutime cstime (ticks)
        except (OSError, IndexError, ValueError):
            continue
    total, ticks, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        ticks += cpu.get(p, 0)
        todo += kids.get(p, [])
    return total / 2**20, ticks / os.sysconf("SC_CLK_TCK")


def child(code: str, *argv) -> dict:
    """Run a phase in a fresh process; its last stdout line is JSON; peak tree RSS added."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    p = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    peak, cpu = [0.0], [0.0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            rss, c = tree_usage(p.pid)
            peak[0], cpu[0] = max(peak[0], rss), max(cpu[0], c)
            done.wait(0.2)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = p.communicate()
    done.set()
    th.join()
    if p.returncode != 0:
        sys.exit(f"bench_spark: phase {argv} failed (exit {p.returncode}): {err.strip().splitlines()[-1:]}")
    res = json.loads(out.strip().splitlines()[-1])
    res["peak_rss_mb"] = round(peak[0], 1)
    res["cpu_s"] = round(cpu[0], 1)      # the process tree's CPU seconds, startup included (sampled)
    return res


def sig(x: float, n: int = 4) -> float:
    """x to n significant digits (a CPU second per step is ~1e-6)."""
    return float(f"{x:.{n}g}")


def break_even(c_local: float, c_spark: float, fixed_s: float, cores: int) -> int | None:
    """Steps above which W executor cores beat one local process: F / (c_l - c_s / W)
    (module docstring); None when no dataset size is (c_s / W >= c_l)."""
    margin = c_local - c_spark / cores
    return round(fixed_s / margin) if margin > 0 else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--n-nodes", type=int, default=8)
    ap.add_argument("--data", help="reuse (or keep) the dataset in this folder")
    ap.add_argument("--shuffle-partitions", type=int, default=0,
                    help="spark.sql.shuffle.partitions (default 0: the cores of each master, 1 and 2)")
    ap.add_argument("--task-bytes", type=int, default=None,
                    help="check_spark's task budget: a run of at most this many bytes is checked whole by one "
                         "task (default: check_spark's, RUN_TASK_BYTES); -1: every run by request buckets")
    ap.add_argument("--cluster-cores", type=int, default=64,
                    help="executor cores of the cluster the break-even is computed for (default 64)")
    ap.add_argument("--wait-quiet", type=float, default=120.0,
                    help="seconds to wait for a quiet machine before measuring (default 120)")
    add_json_out(ap, "spark")
    args = ap.parse_args(argv)
    from specaudit.audit.spark_plan import RUN_TASK_BYTES
    from specaudit.trace.synth import write_synthetic_dataset
    task_bytes = RUN_TASK_BYTES if args.task_bytes is None else args.task_bytes
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    base = Path(args.data) if args.data else tmp / "data"
    try:
        if not any(base.glob("run_id=*")):
            t = time.perf_counter()
            per = -(-args.steps // args.runs)
            for i in range(args.runs):
                write_synthetic_dataset(base, per, n_nodes=args.n_nodes, seed=i, run_id=f"bench-{i:03d}")
            print(json.dumps({"phase": "write", "seconds": round(time.perf_counter() - t, 1)}), flush=True)
        tiny = write_synthetic_dataset(tmp / "tiny", 1000, n_nodes=args.n_nodes, run_id="bench-tiny").parent
        load0 = quiet_machine(wait_s=args.wait_quiet)
        phases = {"local": child(CHILD_LOCAL, str(base))}
        print(json.dumps({"phase": "local", **phases["local"]}), flush=True)
        for n in (1, 2):
            logs = tmp / f"eventlog-{n}"
            logs.mkdir()
            phases[n] = child(CHILD_SPARK, str(base), f"local[{n}]", str(args.shuffle_partitions), str(tiny),
                              str(logs), str(task_bytes))
            print(json.dumps({"phase": f"spark local[{n}]", **phases[n]}), flush=True)
        load1 = load_avg()
        steps = phases["local"]["steps"]
        for k in (1, 2):
            assert phases[k]["steps"] == steps and phases[k]["counts"] == phases["local"]["counts"], (k, phases[k])
        rate = {k: steps / phases[k]["seconds"] for k in phases}
        c_local = phases["local"]["check_cpu_s"] / steps
        c_spark = {k: (phases[k]["jvm_task_cpu_s"] + phases[k]["python_worker_cpu_s"]) / steps for k in (1, 2)}
        fixed_s = phases[1]["startup_s"] + phases[1]["fixed_check_s"]
        out = guard_ratios({
            "steps": steps, "runs": args.runs, "n_nodes": args.n_nodes, "task_bytes": task_bytes,
            "plan": phases[1]["plan"],
            "cpu_s_per_step_local": sig(c_local), "cpu_s_per_step_spark": sig(c_spark[1]),
            "spark_over_local_cpu_per_step": round(c_spark[1] / c_local, 2),
            "cpu_s_per_step_spark_2": sig(c_spark[2]),
            "cpu_s_spark_jvm_tasks": round(phases[1]["jvm_task_cpu_s"], 2),
            "cpu_s_spark_python_workers": round(phases[1]["python_worker_cpu_s"], 2),
            "cpu_s_spark_python_tasks": round(phases[1]["python_task_cpu_s"], 2),
            "cpu_s_driver_spark": round(phases[1]["driver_cpu_s"], 2),
            "fixed_cost_s": round(fixed_s, 1), "cluster_cores": args.cluster_cores,
            "break_even_steps": break_even(c_local, c_spark[1], fixed_s, args.cluster_cores),
            "break_even_min_cores": round(c_spark[1] / c_local, 2),
            "local_steps_per_s": round(rate["local"]), "spark_steps_per_s_1": round(rate[1]),
            "spark_steps_per_s_2": round(rate[2]), "spark_2_over_1": round(rate[2] / rate[1], 2),
            "spark_startup_s_1": round(phases[1]["startup_s"], 1),
            "spark_startup_s_2": round(phases[2]["startup_s"], 1),
            "peak_rss_mb_local": phases["local"]["peak_rss_mb"], "peak_rss_mb_spark_1": phases[1]["peak_rss_mb"],
            "peak_rss_mb_spark_2": phases[2]["peak_rss_mb"], "cpus": os.cpu_count(),
            "loadavg_1m_before": round(load0, 2), "loadavg_1m_after": round(load1, 2),
            # the last phase, local[2], kept two processes of its own running: the load read
            # after it counts them, so they are allowed for (machine_load's `own`)
            **load_fields(own=2)},
            ["spark_over_local_cpu_per_step", "break_even_steps", "break_even_min_cores", "spark_2_over_1"])
        print(json.dumps(out))
        record("spark", out, args.json_out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
