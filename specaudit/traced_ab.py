"""A/B of two runtime configurations on the same prompts, interleaved, with bootstrap intervals.

    res = run_ab(parse_arm("--algo chain --budget 7"), parse_arm("--algo tree --budget 7 --topk 1"),
                 prompts=texts, repeats=2, out="ab/")
    res["verdict"]          # "same" | "A better" | "B better" | "undecided"

After an untraced warm-up of each arm, each repeat runs both arms on the same prompt list,
alternating the order (A B, then B A, ...): over an even number of repeats a linear drift
of the machine (thermal, another tenant) lands on both arms equally. Every run is traced
into out/a or out/b (one run partition per repeat) and the result is written to out/ab.json.

Per arm, with a bootstrap 95% interval over requests (the resample draws prompts and, with
several repeats, repeats too, since a busy machine slows a whole run at once; the same
draws for both arms, so the difference B - A is paired):
    accepted depth   sum of (len(accepted_path) - 1) / steps     from the trace, not the counters
                     (per step: trace/derived.py, the one definition)
    commit length    sum of len(committed_tokens) / steps
    tokens/s         output tokens / engine seconds, where a request's engine seconds are its
                     prefill plus, for each step, step_s / batch_size (its share of the batch)
The verdict for a metric (higher is better for all three) is specaudit.ab_verdict's, the
one A/B decision: `same` when the 95% interval of B - A lies within +-same_within of A
(default SAME_WITHIN), `B better` / `A better` when it excludes 0, else `undecided` (more
repeats or prompts would decide).

It runs traced runs (specaudit.traced_run.run_traced) and so lives beside that wiring, above
the runtime it drives; A/B from evidence, which reruns nothing, is specaudit.audit.ab_evidence.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from specaudit.ab_verdict import SAME_WITHIN, check_same_within, verdict
from specaudit.numfmt import fixed
from specaudit.stats import percentile_ci as _ci
from specaudit.trace.derived import step_commit, step_depth
from specaudit.trace.safe_io import InputError, atomic_write_bytes

# The settings of one arm (the `specaudit run` runtime options, topk resolved).
SETTINGS = ("algo", "budget", "topk", "concurrency", "max_new_tokens", "inject", "seed", "device",
            "dtype", "eos_id", "threads", "target", "drafter")
# Settings that change speed or acceptance without being the algorithm under test: a
# comparison that varies one of them unnamed is confounded (the seed case's trap).
CONFOUNDERS = ("concurrency", "batch", "device", "dtype", "max_new_tokens", "eos_id", "seed", "inject", "threads",
               "target")
METRICS = ("accepted_depth", "commit_len", "tokens_per_s")
METRIC_LABEL = {"accepted_depth": "mean accepted depth", "commit_len": "mean commit length",
                "tokens_per_s": "tokens/s"}


# ---------------------------------------------------------------------- arm args


class _ArmParser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so a bad --a is one line and exit 2."""

    def error(self, message):
        raise ValueError(f"{self.prog}: {message}")


def parse_arm(text: str, label: str = "a") -> dict:
    """`specaudit run` runtime options (a string) -> the arm's settings dict."""
    from specaudit.runtime.options import add_runtime_arguments, resolve_topk

    p = _ArmParser(prog=f"--{label}", add_help=False)
    add_runtime_arguments(p)
    try:
        argv = shlex.split(text or "")
    except ValueError as e:
        raise ValueError(f"--{label}: cannot split {text!r}: {e}") from None
    ns = p.parse_args(argv)
    from specaudit.bounds import check_args
    try:   # the arm's sizes, bounded as the same flags of `specaudit run` are
        check_args("run", p, ns)
    except ValueError as e:
        raise ValueError(f"--{label}: {e}") from None
    cfg = {k: getattr(ns, k) for k in SETTINGS if k != "topk"}
    cfg["topk"] = resolve_topk(ns)
    if cfg["eos_id"] is None and not cfg.get("target"):
        cfg["eos_id"] = 0  # the embedded model's EOS (specaudit.model.EOS_ID), without importing torch
    if cfg.get("drafter") and not cfg.get("target"):
        raise ValueError(f"--{label}: --drafter needs --target hf:PATH_OR_ID")
    cfg["args"] = text or ""
    return cfg


def settings_differ(a: dict, b: dict) -> dict:
    """setting -> [A, B] for every setting in which the arms differ."""
    return {k: [a.get(k), b.get(k)] for k in SETTINGS if a.get(k) != b.get(k)}


def confounding_warnings(differ: dict, vary: list[str] | None) -> list[str]:
    """Warnings when more settings differ than the experiment names (`vary`)."""
    out = []
    if vary:
        for v in vary:
            if v not in differ:
                out.append(f"--vary {v}: A and B have the same {v}")
        extra = [k for k in differ if k not in vary]
        if extra:
            conf = [k for k in extra if k in CONFOUNDERS]
            out.append(f"A and B also differ in {', '.join(extra)}, which the experiment does not name "
                       f"(--vary {','.join(vary)})" + (f"; {', '.join(conf)} change speed or acceptance on "
                                                       "their own: the comparison is confounded" if conf else ""))
    elif len(differ) > 1:
        conf = [k for k in differ if k in CONFOUNDERS]
        out.append(f"A and B differ in {len(differ)} settings ({', '.join(differ)}): a difference cannot be "
                   "pinned on one of them; name the one under test with --vary"
                   + (f" ({', '.join(conf)} change speed or acceptance on their own)" if conf else ""))
    return out


# ----------------------------------------------------------------- measurement


class Collector:
    """A tracer sink that keeps, per request, what the A/B needs (no re-reading Parquet)."""

    def __init__(self):
        self.req: dict[str, dict] = {}

    def _r(self, rid):
        return self.req.setdefault(rid, {"steps": 0, "depth": 0, "commit": 0, "cost": 0.0, "batch": 0.0,
                                         "reported_depth": 0, "reported_commit": 0, "output": None})

    def write_steps(self, batch) -> None:
        d = batch.to_pydict()
        col = batch.schema.get_field_index
        # [rows] per-step depth and commit: trace/derived.py's definition (the tensors, not the counters)
        depth = step_depth(batch.column(col("accepted_path"))).to_pylist()
        commit = step_commit(batch.column(col("committed_tokens"))).to_pylist()
        for i, rid in enumerate(d["request_id"]):
            r = self._r(rid)
            r["steps"] += 1
            r["depth"] += depth[i]
            r["commit"] += commit[i]
            r["reported_depth"] += d["accepted_depth"][i]
            r["reported_commit"] += d["commit_len"][i]
            r["cost"] += d["step_s"][i] / max(d["batch_size"][i], 1)  # this request's share of the forward
            r["batch"] += d["batch_size"][i]

    def write_request(self, row: dict) -> None:
        r = self._r(row["request_id"])
        r["output"] = list(row["output_tokens"])
        r["cost"] += row["ttft_s"]  # the prefill


def _draws(rng, n_boot: int, n: int) -> np.ndarray:
    """[n_boot, n] how often each of n units is drawn in each bootstrap resample."""
    W = np.zeros((n_boot, n))
    np.add.at(W, (np.arange(n_boot)[:, None], rng.integers(0, n, size=(n_boot, n))), 1.0)
    return W


def _ratio_boot(num: np.ndarray, den: np.ndarray, Wr: np.ndarray, Wp: np.ndarray):
    """Ratio of sums over (repeat, prompt) cells: the point estimate and bootstrap replicates.

    num, den: [R, P] per-cell sums; Wr [B, R] and Wp [B, P] resample counts of repeats and
    prompts (a cell counts Wr * Wp times).
    """
    point = num.sum() / den.sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        reps = np.einsum("br,rp,bp->b", Wr, num, Wp) / np.einsum("br,rp,bp->b", Wr, den, Wp)  # [B]
    return float(point), reps


def summarize(cells: dict[str, np.ndarray], same_within: float, n_boot: int, seed: int = 0) -> dict:
    """Per-arm means with bootstrap 95% intervals, the paired difference and a verdict per metric.

    cells[arm + "_" + quantity] are [R, P] sums per (repeat, prompt): depth, commit, steps,
    tokens, cost. Each resample draws prompts (the requests) and, when there are several,
    repeats: a run-level shift (another process taking the CPU) moves every request of a
    run together, which resampling requests alone would read as certainty. Both arms get
    the same draws, repeat r of A with repeat r of B (adjacent in time): the difference is
    paired.
    """
    R, P = cells["a_steps"].shape
    rng = np.random.default_rng(seed)
    Wp = _draws(rng, n_boot, P)
    Wr = _draws(rng, n_boot, R) if R > 1 else np.ones((n_boot, 1))
    out = {}
    for m, (num, den) in {"accepted_depth": ("depth", "steps"), "commit_len": ("commit", "steps"),
                          "tokens_per_s": ("tokens", "cost")}.items():
        pa_, ra = _ratio_boot(cells[f"a_{num}"], cells[f"a_{den}"], Wr, Wp)
        pb_, rb = _ratio_boot(cells[f"b_{num}"], cells[f"b_{den}"], Wr, Wp)
        dci = _ci(rb - ra)
        out[m] = {"a": {"mean": pa_, "ci95": _ci(ra)}, "b": {"mean": pb_, "ci95": _ci(rb)},
                  "diff_b_minus_a": {"mean": pb_ - pa_, "ci95": dci},
                  "verdict": verdict(dci, pa_, same_within)}
    return out


# ------------------------------------------------------------------------- run


def _default_loader():
    cache = {}

    def load(device, dtype, target=None, drafter=None, budget=7, algo="chain"):
        key = (device, dtype, target, drafter, budget if target else None, algo if target else None)
        if key not in cache:
            if target:  # Hugging Face checkpoints (runtime/hf.py)
                from specaudit.runtime.hf import load_models
                cache[key] = load_models(target, drafter, device=device, dtype=dtype, budget=budget, algo=algo)
            else:
                import torch

                from specaudit.model import default_models
                cache[key] = default_models(device, getattr(torch, dtype))
        return cache[key]
    return load


def _validate(arm: dict, label: str, models, prompts: list[str]) -> None:
    """Refuse a bad arm before anything runs (so no half-written experiment)."""
    from specaudit.runtime.engine import SpecConfig
    from specaudit.tokenizer import encode

    target, drafter, _ = models
    encode = getattr(target, "encode", None) or encode  # a Hugging Face target brings its tokenizer
    try:
        SpecConfig(algo=arm["algo"], budget=arm["budget"], topk=arm["topk"],
                   max_new_tokens=arm["max_new_tokens"], concurrency=arm["concurrency"],
                   eos_id=arm["eos_id"] if arm["eos_id"] is not None else getattr(target, "eos_id", 0),
                   fault=arm["inject"]).validate(drafter.depth)
    except ValueError as e:
        raise ValueError(f"--{label}: {e}") from None
    longest = max(len(encode(t)) for t in prompts)
    if longest + arm["max_new_tokens"] > target.max_seq_len:
        raise ValueError(f"--{label}: a prompt of {longest} tokens + --max-new-tokens {arm['max_new_tokens']} "
                         f"exceeds the context of {target.max_seq_len}")


def _model_keys(arm: dict) -> dict:
    """The loader's model keywords for an arm on Hugging Face checkpoints ({} for the embedded pair)."""
    if not arm.get("target"):
        return {}
    return {"target": arm["target"], "drafter": arm.get("drafter"), "budget": arm["budget"], "algo": arm["algo"]}


def _run_args(arm: dict, prompts: list[str], load) -> dict:
    """run_traced's arguments for one arm (the warm-up and every repeat run the same)."""
    return dict(algo=arm["algo"], budget=arm["budget"], topk=arm["topk"], concurrency=arm["concurrency"],
                num_prompts=len(prompts), max_new_tokens=arm["max_new_tokens"], prompts=list(prompts),
                inject=arm["inject"], seed=arm["seed"], device=arm["device"], dtype=arm["dtype"],
                eos_id=arm["eos_id"], models=load(arm["device"], arm["dtype"], **_model_keys(arm)),
                threads=arm.get("threads", 1))   # the one --threads default (runtime/options.py): 1


def run_ab(a: dict, b: dict, *, prompts: list[str], repeats: int = 2, out, vary: list[str] | None = None,
           same_within: float = SAME_WITHIN, n_boot: int = 2000, primary: str = "tokens_per_s",
           load_models=None, log=None, warmup: bool = True) -> dict:
    """Run arms A and B `repeats` times each, interleaved, traced; return (and write) the result."""
    from specaudit.traced_run import run_traced

    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1 (got {repeats})")
    if not prompts:
        raise ValueError("no prompts")
    if primary not in METRICS:
        raise ValueError(f"--primary must be one of {', '.join(METRICS)}")
    bad = [v for v in vary or [] if v not in SETTINGS]
    if bad:
        raise ValueError(f"--vary {','.join(bad)}: not a setting; settings are {', '.join(SETTINGS)}")
    out = Path(out)
    if (out / "ab.json").exists():
        raise InputError(out, "already holds an A/B result (ab.json); pick another --out")
    for sub in ("a", "b"):
        if (out / sub).exists() and any((out / sub).iterdir()):
            raise InputError(out / sub, "is not empty; pick another --out")
    from specaudit.runtime.host import check_device
    load = load_models or _default_loader()
    arms = {"A": a, "B": b}
    for lab, arm in arms.items():
        try:
            check_device(arm["device"], arm["dtype"])
        except InputError as e:
            raise InputError(None, f"--{lab.lower()}: {e.reason}") from None
        _validate(arm, lab.lower(), load(arm["device"], arm["dtype"], **_model_keys(arm)), prompts)
    differ = settings_differ(a, b)
    warnings = confounding_warnings(differ, vary)
    if len(prompts) < 5:
        warnings.append(f"only {len(prompts)} prompts: the intervals over requests are rough")

    if warmup:  # first-call costs (allocator, thread pools, every prefill shape) must not land on arm A
        for arm in arms.values():
            kw = _run_args(arm, prompts, load)
            kw["max_new_tokens"] = min(16, kw["max_new_tokens"])
            run_traced(**kw, trace=False)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    order, runs = [], {"A": [], "B": []}
    data = {"A": [], "B": []}  # per run: Collector.req
    wall_tps = {"A": [], "B": []}
    reported = {"A": [], "B": []}
    for rep in range(repeats):
        for lab in (("A", "B") if rep % 2 == 0 else ("B", "A")):
            arm = arms[lab]
            col = Collector()
            rid = f"{lab.lower()}-r{rep}-{arm['algo']}-b{arm['budget']}-k{arm['topk']}-c{arm['concurrency']}-{stamp}"
            if log:
                log(f"repeat {rep + 1}/{repeats} {lab}: {arm['args'] or '(defaults)'}")
            res = run_traced(**_run_args(arm, prompts, load), out=out / lab.lower(), run_id=rid,
                             extra_sinks=[col])
            order.append(lab)
            runs[lab].append(res.run_id)
            data[lab].append(col.req)
            wall_tps[lab].append(res.summary["tokens_per_s"])
            reported[lab].append(res.manifest.get("reported") or {})

    P = len(prompts)
    ids = [str(i) for i in range(P)]  # run_traced numbers requests 0..P-1 in prompt order
    cells = {}  # [R, P] per (repeat, prompt); data[lab][r] is repeat r of that arm
    for lab in ("A", "B"):
        for q in ("depth", "commit", "steps", "cost"):
            cells[f"{lab.lower()}_{q}"] = np.array(
                [[run[i][q] if i in run else 0.0 for i in ids] for run in data[lab]], dtype=np.float64)
        cells[f"{lab.lower()}_tokens"] = np.array(
            [[len(run[i]["output"] or []) if i in run else 0 for i in ids] for run in data[lab]], dtype=np.float64)
    metrics = summarize(cells, same_within, n_boot)

    # what else a reader of the result must know
    same_out = sum(all(data["A"][r][i]["output"] == data["B"][r][i]["output"] for r in range(repeats))
                   for i in ids)
    per_step = {}  # arm -> quantity -> its mean per step over all of the arm's runs
    for lab in "AB":
        rows = [x for run in data[lab] for x in run.values()]
        steps = max(sum(x["steps"] for x in rows), 1)
        per_step[lab] = {q: sum(x[q] for x in rows) / steps
                         for q in ("batch", "depth", "commit", "reported_depth", "reported_commit")}
    batch = {lab: per_step[lab]["batch"] for lab in "AB"}
    if abs(batch["A"] - batch["B"]) > 1e-9:
        differ["batch"] = [round(batch["A"], 3), round(batch["B"], 3)]  # observed mean requests per forward
        if vary and "batch" not in vary and "concurrency" not in vary:
            warnings.append(f"the observed batch differs (mean {fixed(batch['A'])} vs {fixed(batch['B'])} requests "
                            "per verify forward), which the experiment does not name")
    for lab in "AB":
        m = per_step[lab]
        if abs(m["reported_depth"] - m["depth"]) > 1e-9 or abs(m["reported_commit"] - m["commit"]) > 1e-9:
            rd, rc, d, c = (fixed(m[k]) for k in ("reported_depth", "reported_commit", "depth", "commit"))
            warnings.append(f"{lab}'s own counters disagree with its trace (reported depth {rd}, "
                            f"commit {rc}; rows {d}, {c}): the "
                            f"figures here come from the rows; run `specaudit check {out / lab.lower()}`")
    result = {
        "a": {"args": a["args"], "settings": {k: a[k] for k in SETTINGS}, "dataset": str(out / "a"),
              "runs": runs["A"], "wall_tokens_per_s": wall_tps["A"], "mean_batch": batch["A"]},
        "b": {"args": b["args"], "settings": {k: b[k] for k in SETTINGS}, "dataset": str(out / "b"),
              "runs": runs["B"], "wall_tokens_per_s": wall_tps["B"], "mean_batch": batch["B"]},
        "prompts": P, "repeats": repeats, "order": order, "vary": vary or [],
        "settings_differ": differ, "warnings": warnings,
        "metrics": metrics, "primary": primary, "verdict": metrics[primary]["verdict"],
        "same_within": same_within, "bootstrap": n_boot,
        "outputs_identical": {"prompts": same_out, "of": P},
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "ab.json", (json.dumps(result, indent=1) + "\n").encode())
    result["path"] = str(out / "ab.json")
    return result


# ------------------------------------------------------------------------ output


def parse_vary(text: str | None) -> list[str] | None:
    """'algo, budget' -> ['algo', 'budget'] (None when not given)."""
    return [v.strip() for v in text.split(",") if v.strip()] if text else None


def run_arms(a: str, b: str, *, out, prompts_file=None, num_prompts: int = 8, repeats: int = 2,
             vary: str | None = None, same_within: float = SAME_WITHIN, n_boot: int = 2000,
             primary: str | None = None, log=None) -> dict:
    """`specaudit ab --a "..." --b "..."`: the arms as typed (run's flags), the prompts (a file,
    or the embedded held-out ones, cycled to num_prompts), checked, then run_ab."""
    from specaudit.traced_run import default_prompts, load_prompts
    primary = primary or "tokens_per_s"
    if primary not in ("accepted_depth", "commit_len", "tokens_per_s"):
        raise ValueError(f"--primary {primary} is an evidence metric; runtime arms have accepted_depth, "
                         "commit_len, tokens_per_s")
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be at least 1 (got {num_prompts})")
    if n_boot < 100:
        raise ValueError(f"--bootstrap must be at least 100 (got {n_boot})")
    check_same_within(same_within)
    arm_a, arm_b = parse_arm(a, "a"), parse_arm(b, "b")
    texts = load_prompts(prompts_file) if prompts_file else default_prompts()
    texts = (texts * (num_prompts // len(texts) + 1))[:num_prompts]
    return run_ab(arm_a, arm_b, prompts=texts, repeats=repeats, out=out, vary=parse_vary(vary),
                  same_within=same_within, n_boot=n_boot, primary=primary, log=log)


def format_text(res: dict) -> str:
    a, b = res["a"], res["b"]
    lines = [f"A: {a['args'] or '(defaults)'}", f"B: {b['args'] or '(defaults)'}",
             f"{res['prompts']} prompts x {res['repeats']} repeats, order {' '.join(res['order'])}"]
    d = res["settings_differ"]
    lines.append("settings that differ: " + (", ".join(f"{k} {x!r} -> {y!r}" for k, (x, y) in d.items())
                                             if d else "none (an A/A run: expect 'same')"))
    for w in res["warnings"]:
        lines.append(f"WARNING: {w}")
    lines.append("")
    lines.append(f"{'metric':<20} {'A [95% CI]':<26} {'B [95% CI]':<26} {'B - A [95% CI]':<28} verdict")
    for m in METRICS:
        x = res["metrics"][m]

        def cell(v, sign=False):
            f = "+.3f" if sign else ".3f"
            return f"{v['mean']:{f}} [{v['ci95'][0]:{f}}, {v['ci95'][1]:{f}}]"
        lines.append(f"{METRIC_LABEL[m]:<20} {cell(x['a']):<26} {cell(x['b']):<26} "
                     f"{cell(x['diff_b_minus_a'], True):<28} {x['verdict']}")
    o = res["outputs_identical"]
    lines.append("")
    lines.append(f"outputs identical in A and B: {o['prompts']}/{o['of']} prompts")
    lines.append(f"verdict ({METRIC_LABEL[res['primary']]}): {res['verdict']}")
    lines.append(f"traces: {a['dataset']}, {b['dataset']}; result: {res.get('path', '')}")
    if a["runs"] and b["runs"]:
        lines.append(f"where the runs part: specaudit diff {a['dataset']}/run_id={a['runs'][0]} "
                     f"{b['dataset']}/run_id={b['runs'][0]}")
    return "\n".join(lines)


def stderr_log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
