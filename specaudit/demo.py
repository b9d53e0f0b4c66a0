"""`specaudit demo` as a library call: run, trace, check, break, estimate, report, on the
embedded models (the steps are described in specaudit/commands/demo.py, the command's help).

    rc = run_demo("specaudit-demo", num_prompts=8, max_new_tokens=64)

A composition of every part (the runtime, the checker, the estimator, the report), so it
sits beside the CLI, above the layers it calls; nothing but the command imports it.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

# The seed bug the demo injects, and the codes that must name it: the per-step identity
# (SA301: commit_len = accepted_depth + 1) and both run means against the rows (SA506, SA507).
INJECT = "commit-counter"
EXPECTED_CODES = ("SA301", "SA506", "SA507")


def run_demo(out="specaudit-demo", *, keep=False, num_prompts=4, max_new_tokens=128, device="cpu",
             dtype="float32") -> int:
    """The five steps, printed as they go, then the verdict; -> 0 when the demo showed what it
    promises (demo_problems), else 1. Host options (threads) are the caller's: apply them first."""
    import torch

    from specaudit.audit.check import check_paths
    from specaudit.audit.formats import format_findings
    from specaudit.audit.run_summary import summary_line
    from specaudit.model import default_models
    from specaudit.postmortem.report import build_report
    from specaudit.traced_run import run_traced
    out = Path(out)
    traces, injected = out / "traces", out / "injected"
    for d in (traces, injected):
        if d.exists() and not keep:
            shutil.rmtree(d)
    t0 = time.time()
    models = default_models(device, getattr(torch, dtype))
    common = dict(num_prompts=num_prompts, max_new_tokens=max_new_tokens, oracle=True,
                  models=models, device=device, dtype=dtype, progress=sys.stderr.isatty())

    _head(f"1. speculative decoding on the embedded models -> {traces}/")
    runs = [run_traced(algo="chain", budget=7, topk=1, out=traces, **common),
            run_traced(algo="tree", budget=15, topk=4, out=traces, **common)]
    for r in runs:
        print(summary_line(r.summary))

    _head("2. specaudit check on those traces")
    clean = check_paths([traces])
    print(format_findings(clean.findings, "text", counts=clean.counts, summary=clean.summary(),
                          examples=2), end="")

    _head(f"3. the seed bug, injected (--inject {INJECT}) -> {injected}/")
    bad_run = run_traced(algo="chain", budget=7, topk=1, inject=INJECT, out=injected, **common)
    print(summary_line(bad_run.summary))
    bad = check_paths([injected])
    print(format_findings(bad.findings, "text", counts=bad.counts, summary=bad.summary(), examples=1), end="")

    _head("4. reported commit length against measured throughput")
    _estimate(runs[0], bad_run, models, max_new_tokens, device)

    _head("5. report")
    report = build_report([traces, injected], out / "report", findings=clean.findings + bad.findings,
                          summary=None)
    print(f"report: {report}")
    problems = demo_problems(clean_exit=clean.exit_code, lossless=[bool(r.summary.get("lossless")) for r in runs],
                             injected_counts=bad.counts, report=Path(report))
    print(f"\ndemo finished in {time.time() - t0:.0f}s")
    if problems:
        print("demo FAILED: " + "; ".join(problems))
        return 1
    print(f"demo OK: clean runs clean and lossless; the injected bug caught by {', '.join(EXPECTED_CODES)}; "
          f"report written")
    return 0


def demo_problems(*, clean_exit: int, lossless: list, injected_counts: dict, report: Path) -> list[str]:
    """What the demo promised and did not show: [] when the clean runs checked clean and
    lossless, every code of EXPECTED_CODES named the injected bug, and the report exists."""
    problems = []
    if clean_exit != 0:
        problems.append(f"the clean runs' check exited {clean_exit} (expected 0: no error finding)")
    if not lossless or not all(lossless):
        problems.append("a clean run's output differs from plain greedy (not lossless)")
    missed = [c for c in EXPECTED_CODES if not injected_counts.get(c)]
    if missed:
        problems.append(f"the injected {INJECT} bug was not caught by {', '.join(missed)}")
    if not (report.is_file() and report.stat().st_size > 0):
        problems.append(f"the report {report} was not written")
    return problems


def _head(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _estimate(clean_run, bad_run, models, max_new_tokens: int, device: str = "cpu") -> None:
    """Throughput-derived commit length for both chain runs, as `specaudit calibrate` then
    `specaudit estimate traces/ --profile cost.json --baseline-from-profile` would do.

    The calibrator measures, on its own, the cost factor r (a draft plus a verify of 8
    nodes over one plain decode step, at the runs' context lengths) and the plain step
    time t_ar; it knows nothing of either run's acceptance. Each run's observed tokens/s
    comes from its own trace (steady-state decode steps, not the counters under audit).
    """
    from specaudit.audit.calibrate import measure_profile
    from specaudit.audit.cost_profile import profile_t_ar
    from specaudit.audit.estimate_judge import estimate_and_judge
    from specaudit.audit.observed_throughput import observations_from_traces

    prof = measure_profile(models=models, n_grid=(8,), c_grid=(1,), repeats=3, max_new_tokens=max_new_tokens,
                           device=device)
    r, r_std = prof.lookup(8, 1)
    base_tps = 1 / profile_t_ar(prof, 1)
    print(f"calibrated: plain decode {base_tps:.1f} tokens/s; cost factor r(N=8, c=1) = {r:.2f} +/- {r_std:.2f}")
    busy = busy_reason(*_load())
    for name, run in (("clean chain", clean_run), ("injected chain", bad_run)):
        (o,) = observations_from_traces(run.run_dir)
        res = estimate_and_judge(o, (base_tps, 0.0, "profile t_ar"), (r, r_std, "profile"))
        e = res["estimate"]
        print(f"{name}: {o.tps:.1f} tokens/s in its decode steps -> estimated commit length {e['value']:.2f} "
              f"[{e['low']:.2f}, {e['high']:.2f}]; {busy or res['conclusion']}")


BUSY_PER_CORE = 0.75   # runnable processes per core above which timings are other jobs' (as scripts/benchutil.py)


def _load() -> tuple[float, int]:
    try:
        return os.getloadavg()[0], os.cpu_count() or 1
    except (OSError, AttributeError):   # no load average on this platform: judged as quiet
        return 0.0, 1


def busy_reason(load: float, cores: int) -> str | None:
    """Why the throughput verdict is withheld, or None on a quiet machine.

    The runs were timed minutes before the calibration: when other jobs share the cores,
    their throughput and the calibration's plain decode were slowed by different amounts,
    so the estimate says nothing about the counters (a healthy run would look broken)."""
    if load <= max(BUSY_PER_CORE * cores, 1.25):   # (the demo itself keeps one core busy)
        return None
    return (f"not judged: the machine was busy (load average {load:.1f} on {cores} cores), so the runs' "
            "throughput and the calibration were slowed by different amounts; rerun the demo on a quiet "
            "machine (the per-step check above decides either way)")
