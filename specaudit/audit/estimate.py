"""`specaudit estimate` as a library call: inputs -> observations -> estimate -> judgement.

`run_estimate` is the whole pipeline for the CLI (the model: audit/estimate_model.py; the
observed throughput: audit/observed_throughput.py; r: audit/cost_profile.py or a band from
audit/r_band.py; the judgement of one or both counters: audit/estimate_judge.py);
`live_judgement` the same estimate-then-verdict for a live server's window; `format_text`
one result as the CLI's text block.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from specaudit.audit.compare import Printed
from specaudit.audit.cost_profile import CostProfile, profile_t_ar
from specaudit.audit.estimate_judge import estimate_and_judge, r_band_judgement
from specaudit.audit.estimate_model import (
    CONSISTENT,
    DEFAULT_TOLERANCE,
    INCONSISTENT,
    MISMATCH,
    NOT_ENOUGH_DATA,
    finite_positive,
)
from specaudit.audit.observed_throughput import Observation, gather, observation_from_load_json
from specaudit.audit.r_band import RBand
from specaudit.numfmt import fixed as _f  # two decimals, as engines print their figures

# exit status of `specaudit estimate` per verdict (worst result wins)
EXIT_CODES = {CONSISTENT: 0, INCONSISTENT: 1, NOT_ENOUGH_DATA: 2, MISMATCH: 2}
SEVERITY = {CONSISTENT: 0, NOT_ENOUGH_DATA: 1, MISMATCH: 2, INCONSISTENT: 3}


def reported_figure(name: str, x) -> float | None:
    """A reported mean given by a user: None, or a finite number above 0 (ValueError otherwise:
    a commit length is at least 1 token per step, a depth at least 0 but an engine reporting
    exactly 0 has not speculated)."""
    if x is None:
        return None
    v = finite_positive(name, x, "above 0 (a mean per verify step)")
    return x if isinstance(x, Printed) else v      # as typed: its digits say its precision


def baseline_for(obs: Observation, *, baseline_tps=None, baseline_std=0.0, baseline_file=None,
                 baseline_from_profile=False, profile=None, concurrency=None) -> tuple[float, float, str]:
    """(plain decoding tokens/s, its sd, where it came from)."""
    if baseline_tps is not None and baseline_file:
        raise ValueError("give either --baseline-tps or --baseline FILE, not both")
    if baseline_file:
        o = observation_from_load_json(baseline_file)
        return o.tps, o.tps_std, o.label
    if baseline_tps is not None:
        return baseline_tps, baseline_std or 0.0, "--baseline-tps"
    if profile and baseline_from_profile:
        c = concurrency or obs.concurrency
        prof = profile if isinstance(profile, CostProfile) else CostProfile.load(profile)
        t_ar = profile_t_ar(prof, c)
        return c / t_ar, 0.0, f"c / t_ar({c}) of the profile"
    raise ValueError("no baseline: give --baseline-tps (plain decoding tokens/s at the same concurrency), "
                     "--baseline FILE, or --baseline-from-profile")


def cost_for(obs: Observation, *, cost_factor=None, cost_factor_std=None, profile=None, n_nodes=None,
             concurrency=None) -> tuple[float, float, str]:
    """(r, its sd, where it came from)."""
    if cost_factor is not None and profile:
        raise ValueError("give either --cost-factor or --profile, not both")
    if cost_factor is not None:
        r, sd = CostProfile.manual(cost_factor, cost_factor_std).lookup()
        return r, sd, "by hand" + ("" if cost_factor_std is not None else ", spread 10% of r")
    if profile:
        prof = profile if isinstance(profile, CostProfile) else CostProfile.load(profile)
        n = n_nodes or obs.n_nodes
        c = concurrency or obs.concurrency
        r, sd = prof.lookup(n, c)
        return r, sd, f"profile {Path(prof.path or 'profile').name} at N={n}, c={c}"
    raise ValueError("no cost factor: give --profile FILE (measured by `specaudit calibrate`), --hardware gpu|cpu "
                     "(judge each counter by the r it implies), or --cost-factor R")


def band_for(*, profile=None, cost_factor=None, cost_factor_std=None, hardware=None, n_nodes=None,
             concurrency=None, tolerance: float = DEFAULT_TOLERANCE) -> RBand | None:
    """The r band from what the user gave (profile > hand > hardware class), or None."""
    from specaudit.audit.r_band import band_from_hardware, band_from_r
    if profile is not None:
        prof = profile if isinstance(profile, CostProfile) else CostProfile.load(profile)
        r, sd = prof.lookup(n_nodes, concurrency)
        how = "measured" if prof.source == "measured" else prof.source
        return band_from_r(r, sd, tolerance, f"profile {Path(prof.path or 'profile').name} at N={n_nodes}, "
                                             f"c={concurrency}: {how} r {_f(r)}, sd {_f(sd)}", "profile")
    if cost_factor is not None:
        prof = CostProfile.manual(cost_factor, cost_factor_std)
        r, sd = prof.lookup()
        return band_from_r(r, sd, tolerance, f"--cost-factor {_f(r)} by hand (sd {_f(sd)}): a guess unless "
                                             "measured", "hand")
    if hardware is not None:
        return band_from_hardware(hardware, n_nodes)
    return None


@dataclass
class EstimateReport:
    """What `specaudit estimate` answers: one result per observation, the worst verdict."""

    results: list
    verdict: str

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "results": self.results}


def run_estimate(input=None, *, observed_tps=None, observed_std=0.0, load=None, source=None, baseline_tps=None,
                 baseline_std=0.0, baseline_file=None, baseline_from_profile=False, cost_factor=None,
                 cost_factor_std=None, profile=None, n_nodes=None, concurrency=None, reported_commit_len=None,
                 reported_accept_depth=None, tolerance: float = DEFAULT_TOLERANCE,
                 hardware: str | None = None, budget: int | None = None) -> EstimateReport:
    """The whole estimator: inputs -> observations -> estimate -> judgement of one or both
    counters. Without a cost factor or a profile, `hardware` (a class of
    specaudit.audit.r_band.HARDWARE) judges each counter by the r it implies instead.
    ValueError / InputError (one line) for bad input."""
    if tolerance is None or not (0 <= tolerance < 1):
        raise ValueError(f"--tolerance must be in [0, 1), got {tolerance}")
    reported_commit_len = reported_figure("--reported-commit-len", reported_commit_len)
    reported_accept_depth = reported_figure("--reported-accept-depth", reported_accept_depth)
    if budget is not None:
        if budget < 1:
            raise ValueError(f"--budget must be at least 1 drafted token per step, got {budget}")
        if n_nodes is not None and n_nodes != budget + 1:
            raise ValueError(f"--budget {budget} means N = {budget + 1} verify nodes, but --n-nodes is {n_nodes}")
        n_nodes = budget + 1
    if n_nodes is not None and n_nodes < 1:
        raise ValueError(f"--n-nodes must be at least 1, got {n_nodes}")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
    obs = gather(input, observed_tps=observed_tps, observed_std=observed_std, load=load, source=source,
                 concurrency=concurrency, n_nodes=n_nodes)
    prof = CostProfile.load(profile) if profile else None
    results = []
    for o in obs:
        if n_nodes is not None:
            o.n_nodes = n_nodes
        base = baseline_for(o, baseline_tps=baseline_tps, baseline_std=baseline_std, baseline_file=baseline_file,
                            baseline_from_profile=baseline_from_profile, profile=prof, concurrency=concurrency)
        if hardware is not None and (cost_factor is not None or prof is not None):
            raise ValueError("give one source of r: --cost-factor, --profile or --hardware")
        band = band_for(profile=prof, cost_factor=cost_factor, cost_factor_std=cost_factor_std, hardware=hardware,
                        n_nodes=n_nodes or o.n_nodes, concurrency=concurrency or o.concurrency, tolerance=tolerance)
        if hardware is not None:
            results.append(r_band_judgement(o, base, band, reported_commit_len=reported_commit_len,
                                            reported_accept_depth=reported_accept_depth, tolerance=tolerance))
            continue
        cost = cost_for(o, cost_factor=cost_factor, cost_factor_std=cost_factor_std, profile=prof, n_nodes=n_nodes,
                        concurrency=concurrency)
        results.append(estimate_and_judge(o, base, cost, reported_commit_len=reported_commit_len,
                                          reported_accept_depth=reported_accept_depth, tolerance=tolerance,
                                          band=band))
    overall = max((r["verdict"] for r in results), key=lambda v: SEVERITY[v])
    return EstimateReport(results, overall)


def live_judgement(tps: float, tps_std: float, *, concurrency: int, n_nodes: int, profile: CostProfile,
                   baseline_tps: float, reported_commit_len=None, tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """A live server's window through the same pipeline as `specaudit estimate`: the
    estimate, its verdict on the reported mean commit length, and the sentence. profile:
    a CostProfile (CostProfile.manual(r) for a hand-given factor); baseline_tps: plain
    decoding tokens/s of the same kind as tps (per request or aggregate) at concurrency."""
    obs = Observation(source="live", tps=tps, tps_std=tps_std if math.isfinite(tps_std) else 0.0,
                      concurrency=concurrency, n_nodes=n_nodes, reported_commit_len=reported_commit_len,
                      label="live window")
    r, r_sd = profile.lookup(n_nodes, concurrency)
    return estimate_and_judge(obs, (baseline_tps, 0.0, "baseline"), (r, r_sd, "profile"), tolerance=tolerance)


def _format_r_only(res: dict) -> str:
    from specaudit.audit.r_band import format_r
    where = ", ".join(f"{k}={res[v]}" for k, v in (("c", "concurrency"), ("N", "n_nodes")) if res.get(v))
    head = res["label"] + (f" ({where})" if where else "")
    out = [f"{head}:",
           f"  observed {res['observed_tps']:.1f} tokens/s (sd {res['observed_std']:.1f}), baseline "
           f"{res['baseline_tps']:.1f} tokens/s (sd {res['baseline_std']:.1f}, {res['baseline_from']}); "
           "no cost factor: each counter's implied r = commit length * baseline / observed"]
    rl = format_r(res["r_band"])
    out += rl[:-1]
    if res.get("identity"):
        out.append(f"  identity: {res['identity']}")
    out.append(f"  verdict: {res['verdict']}")
    out.append(rl[-1])
    return "\n".join(out) + "\n"


def format_text(res: dict) -> str:
    """One result as the CLI's text block."""
    if res.get("mode") == "r band":
        return _format_r_only(res)
    e = res["estimate"]
    head = res["label"] + (f" (c={res['concurrency']}, N={res['n_nodes']})"
                           if res.get("concurrency") or res.get("n_nodes") else "")
    out = [f"{head}:",
           f"  observed {e['observed_tps']:.1f} tokens/s (sd {e['tps_std']:.1f}), baseline {e['baseline_tps']:.1f} "
           f"tokens/s (sd {e['baseline_std']:.1f}), cost factor r = {e['cost_factor']:.3f} (sd "
           f"{e['cost_factor_std']:.3f}, {res['cost_factor_from']})",
           f"  estimated commit length {e['value']:.2f}  95% [{e['low']:.2f}, {e['high']:.2f}]  "
           f"= {e['observed_tps']:.1f} / {e['baseline_tps']:.1f} * {e['cost_factor']:.3f}"]
    for f in res.get("figures") or ():
        p = f["predicted_tps"]
        as_c = f" (= {f['as_commit_len']:.2f} tokens per step)" if f["counter"] == "accepted depth" else ""
        out.append(f"  reported {f['counter']} {f['reported']:.2f}{as_c} ({f['from']}) would give {p['value']:.1f} "
                   f"tokens/s [{p['low']:.1f}, {p['high']:.1f}]: {f['verdict']}")
    if res.get("derived_commit_len") is not None:
        out.append(f"  derived commit length {res['derived_commit_len']:.2f} (committed tokens per step, from the "
                   "trace's raw tensors)")
    if res.get("r_band"):
        from specaudit.audit.r_band import format_r
        out += format_r({**res["r_band"], "conclusion": ""})[:-1]
        out.append("  (the verdict rests on r: each counter above holds for the r it implies)")
    if res.get("identity"):
        out.append(f"  identity: {res['identity']}")
    for k in ("note", "confounder"):
        if res.get(k) and not (k == "note" and res["verdict"] == MISMATCH):   # the conclusion says it
            out.append(f"  {k}: {res[k]}")
    out.append(f"  verdict: {res['verdict']} (tolerance {res['tolerance']:.0%})")
    out.append(f"  {res['conclusion']}")
    return "\n".join(out) + "\n"
