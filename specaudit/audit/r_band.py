"""Judge reported counters without a guessed cost factor: the r each counter implies.

The throughput model of specaudit.audit.estimate, read the other way round: a counter
that says C tokens per step, with tps observed and tps_base plain decoding at the same
concurrency, implies the step cost factor

    r_implied = C * tps_base / tps          r = (t_draft + t_verify(c, N)) / t_ar(c)

Every input of that is measurable by the user (two throughputs, the counter). What r
may plausibly be comes from what the user knows about the deployment, and the band
says where it comes from:

    profile    measured: `specaudit calibrate` (or any cost profile) at N, c; the band
               is r * exp(+-1.96 s), s = sd / r, widened by the tolerance
    hand       --cost-factor R [--cost-factor-std]: the same band, but the origin says
               it is a number typed by hand, not measured
    hardware   a stated class (HARDWARE), from bounds that need no measurement:
               a step verifies N tokens in one target forward, and runs up to k draft
               forwards (k = N - 1 drafted tokens; a tree drafts at most its budget):
                   verify / t_ar in [1, VERIFY_MAX]   (at least one forward's cost)
                   draft  / t_ar in [0, k * DRAFT_MAX] (a drafter at most as costly as
                                                       the target per forward)
               memory-bound ("gpu", decode at small batch: the weights are read once
               per forward whatever N is, so VERIFY_MAX = 2 covers the attention and
               tree-mask overhead) or compute-bound ("cpu": at most N tokens' work,
               VERIFY_MAX = N). Wide on purpose: a band from a class names a counter
               only when no deployment of that class could give its r (a false alarm
               on a healthy engine costs more trust than a missed bug).

A counter whose implied r (with the 95% interval of the throughputs' spread) misses the
band is contradicted; one inside is possible. Exactly one contradicted of two: that is
the counter named. Both inside: "both possible", and what measurement would decide (a
measured r at this N and c; a plain run at the same concurrency when the baseline is
the weak part). Both outside: the band or the baseline does not describe this run, or
both counters are wrong; one line says so (exit 2, as a calibration mismatch).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from specaudit.numfmt import fixed as _f
from specaudit.stats import Z95

DRAFT_MAX = 1.0           # a draft forward costs at most one target forward (self-speculation)
HARDWARE = {
    "gpu": {"verify_max": lambda n: 2.0,
            "why": "memory-bound decode (weights read once per forward): verify 1-2 plain steps"},
    "cpu": {"verify_max": lambda n: float(n),
            "why": "compute-bound decode: verify 1-N plain steps"},
}
INSIDE, OUTSIDE = "possible", "contradicted"


@dataclass
class RBand:
    """A plausible interval for r and where it comes from."""

    low: float
    high: float
    origin: str          # "profile cost.json at N=8, c=1 (measured r 7.00, sd 0.30)", ...
    kind: str            # profile | hand | hardware
    r: float | None = None   # the measured or given r, when there is one

    def to_dict(self) -> dict:
        return {"low": round(self.low, 4), "high": round(self.high, 4), "origin": self.origin, "kind": self.kind,
                "r": None if self.r is None else round(self.r, 4)}


def band_from_r(r: float, sd: float, tolerance: float, origin: str, kind: str) -> RBand:
    """r * exp(+-1.96 sd / r), widened by the tolerance (what the model leaves out)."""
    s = sd / r if r > 0 else 0.0
    return RBand(r * math.exp(-Z95 * s) * (1 - tolerance), r * math.exp(Z95 * s) * (1 + tolerance),
                 origin, kind, r)


def band_from_hardware(hardware: str, n_nodes: int | None) -> RBand:
    """The class bounds of the module docstring at N verify nodes (k = N - 1 drafts)."""
    if hardware not in HARDWARE:
        raise ValueError(f"--hardware must be one of {', '.join(HARDWARE)}, got {hardware!r}")
    if not n_nodes or n_nodes < 2:
        raise ValueError("--hardware needs the verify width: give --n-nodes N (drafted tokens per step + 1; "
                         "SGLang's speculative_num_draft_tokens), or an engine log that states it")
    k = n_nodes - 1
    h = HARDWARE[hardware]
    hi = h["verify_max"](n_nodes) + k * DRAFT_MAX
    return RBand(1.0, hi, f"hardware class {hardware} at N={n_nodes}, k={k}: {h['why']}, draft 0-{k} "
                          f"(at most one target forward per drafted token)", "hardware")


def implied_r(commit_len: float, tps: float, tps_std: float, base: float, base_std: float) -> dict:
    """The r a counter's commit length implies, with the throughputs' 95% interval."""
    r = commit_len * base / tps
    s = math.hypot(tps_std / tps, base_std / base)
    return {"value": r, "low": r * math.exp(-Z95 * s), "high": r * math.exp(Z95 * s)}


def judge_r(figures: list, tps: float, tps_std: float, base: float, base_std: float, band: RBand) -> dict:
    """Each figure ({counter, reported, as_commit_len}) against the band; the sentence.

    Returns {"band", "figures": [{counter, reported, implied_r, status}], "outcome",
    "conclusion"}; outcome is one of named / both possible / possible / contradicted /
    both excluded / nothing."""
    out = []
    for f in figures:
        ir = implied_r(f["as_commit_len"], tps, tps_std, base, base_std)
        inside = ir["high"] >= band.low and ir["low"] <= band.high
        out.append({"counter": f["counter"], "reported": f["reported"], "as_commit_len": f["as_commit_len"],
                    "implied_r": {k: round(v, 4) for k, v in ir.items()}, "status": INSIDE if inside else OUTSIDE})
    b = f"[{_f(band.low)}, {_f(band.high)}] ({band.origin})"

    def name(x):
        return f"the {x['counter']} counter ({_f(x['reported'])}, implied r {_f(x['implied_r']['value'])})"
    bad = [x for x in out if x["status"] == OUTSIDE]
    ok = [x for x in out if x["status"] == INSIDE]
    if not out:
        outcome, concl = "nothing", "Nothing to judge: no reported figure."
    elif len(out) == 2 and len(bad) == 2:
        outcome = "both excluded"
        concl = (f"The r band {b} excludes both counters (implied r {_f(out[0]['implied_r']['value'])} and "
                 f"{_f(out[1]['implied_r']['value'])}): the band or the baseline does not describe this run, or "
                 "both counters are wrong; measure r on this deployment at this N and concurrency.")
    elif len(out) == 2 and len(bad) == 1:
        outcome = "named"
        concl = (f"The evidence contradicts {name(bad[0])}: outside the r band {b}; {name(ok[0])} is inside it.")
    elif len(out) == 2:
        outcome = "both possible"
        concl = (f"Both possible: {name(out[0])} and {name(out[1])} both lie in the r band {b}. "
                 + decider(out, band))
    elif bad:
        outcome, concl = OUTSIDE, f"The evidence contradicts {name(bad[0])}: outside the r band {b}."
    else:
        outcome = INSIDE
        concl = f"Possible: {name(ok[0])} lies in the r band {b}; a band admits every r inside it."
    return {"band": band.to_dict(), "figures": out, "outcome": outcome, "conclusion": concl}


def decider(out: list, band: RBand) -> str:
    """Which measurement would tell two possible counters apart."""
    r1, r2 = sorted(x["implied_r"]["value"] for x in out)
    mid = math.sqrt(r1 * r2)
    # a measured r separates them when its 95% band (+-1.96 s, relative) misses one of them
    s_need = math.log(mid / r1) / Z95
    what = (f"A measured r decides: r near {_f(r1)} or near {_f(r2)}, with a spread under {s_need:.0%} "
            "(1 sd): `specaudit calibrate` on this deployment's hardware and model at this N and concurrency, "
            "or the step time with drafting on over the step time with drafting off, both at the same "
            "concurrency")
    if band.kind == "hand":
        what += "; the --cost-factor given by hand is not such a measurement"
    return what + "."


def format_r(rj: dict) -> list[str]:
    """The text block's lines for an r judgement."""
    b = rj["band"]
    L = [f"  r band [{b['low']:.2f}, {b['high']:.2f}] from {b['origin']}"]
    for x in rj["figures"]:
        ir = x["implied_r"]
        L.append(f"  {x['counter']} {x['reported']:.2f} implies r = {ir['value']:.2f} [{ir['low']:.2f}, "
                 f"{ir['high']:.2f}]: {x['status']}")
    L.append(f"  {rj['conclusion']}")
    return L
