"""The A/B of two sides' windows, stratum by stratum.

    res = compare_windows(windows_a, windows_b, vary=None, same_within=SAME_WITHIN)
    res["strata"], res["matched"], res["pooled"], res["paradox"], res["confounders"], res["verdict"]

The keys split into matched (equal within a stratum) and varied (what the A/B compares);
each stratum with min_windows on both sides is compared per metric (means, intervals and
the permutation test of specaudit.audit.ab_evidence.stats; the verdict of
specaudit.ab_verdict), then pooled two ways: `matched` weights the compared strata by
nA*nB/(nA+nB), `pooled` takes every window (resampled within strata). When the two
disagree it is said first (Simpson's paradox when they point opposite ways). The caller's
same_within reaches every verdict, the more-windows estimate and the confounder report.
"""
from __future__ import annotations

import numpy as np

from specaudit.ab_verdict import SAME_WITHIN, verdict
from specaudit.audit.ab_evidence.confounders import confounder_report
from specaudit.audit.ab_evidence.stats import mean_replicates, method_for, more_windows, permutation_p
from specaudit.audit.ab_evidence.text import conclusion
from specaudit.audit.ab_evidence.window import (
    DESIGN,
    KEY_LABEL,
    KEYS,
    METRIC_LABEL,
    METRICS,
    OPERATIONAL,
    EvWindow,
    value_order,
    value_text,
)
from specaudit.audit.defaults import MIN_WINDOWS
from specaudit.numfmt import signed as _num
from specaudit.stats import percentile_ci as _ci
from specaudit.trace.safe_io import InputError

KIND = "specaudit-ab-evidence"
VERSION = 1


class NoOverlap(ValueError):
    """The sides share no stratum: nothing can be compared fairly."""


def _vals(ws: list[EvWindow], m: str) -> np.ndarray:
    return np.array([getattr(w, m) for w in ws if getattr(w, m) is not None], dtype=np.float64)


def _compare(xa: np.ndarray, xb: np.ndarray, rng, n_boot: int, same_within: float) -> dict | None:
    """Means, intervals, difference and verdict of two samples of windows (None if empty)."""
    if len(xa) == 0 or len(xb) == 0:
        return None
    ra, rb = mean_replicates(rng, xa, n_boot), mean_replicates(rng, xb, n_boot)
    a, b = float(xa.mean()), float(xb.mean())
    dci = _ci(rb - ra)
    v = verdict(dci, a, same_within)
    out = {"a": {"mean": a, "ci95": _ci(ra), "n": int(len(xa)), "method": method_for(len(xa))},
           "b": {"mean": b, "ci95": _ci(rb), "n": int(len(xb)), "method": method_for(len(xb))},
           "diff_b_minus_a": {"mean": b - a, "ci95": dci},
           "permutation_p": permutation_p(xa, xb, rng),
           "verdict": v, "_reps": (ra, rb)}
    if v == "undecided":
        out["more_windows"] = more_windows(len(xa), len(xb), dci, b - a, a, same_within)
    return out


def _pooled_reps(ws: list, m: str, key, rng, n_boot: int):
    """(mean, [n_boot] replicates) of a side's pooled mean, stratified: each stratum's
    windows are resampled on their own and weighted by their share of the side, so the
    mix of conditions is held as observed (a series that jumps between strata is not
    read as one correlated series). None when no window has the metric."""
    groups: dict = {}
    for w in ws:
        v = getattr(w, m)
        if v is not None:
            groups.setdefault(key(w), []).append(v)
    n = sum(len(v) for v in groups.values())
    if n == 0:
        return None
    reps = np.zeros(n_boot)
    mean = 0.0
    for vals in groups.values():
        x = np.asarray(vals, dtype=np.float64)
        reps += len(x) / n * mean_replicates(rng, x, n_boot)
        mean += len(x) / n * float(x.mean())
    return mean, reps, n


def _pooled(wa, wb, m, key, rng, n_boot, same_within) -> dict | None:
    pa, pb = _pooled_reps(wa, m, key, rng, n_boot), _pooled_reps(wb, m, key, rng, n_boot)
    if pa is None or pb is None:
        return None
    (a, ra, na), (b, rb, nb) = pa, pb
    dci = _ci(rb - ra)
    return {"a": {"mean": a, "ci95": _ci(ra), "n": na}, "b": {"mean": b, "ci95": _ci(rb), "n": nb},
            "diff_b_minus_a": {"mean": b - a, "ci95": dci}, "verdict": verdict(dci, a, same_within)}


def _strip(d: dict | None) -> dict | None:
    if d is None:
        return None
    return {k: v for k, v in d.items() if not k.startswith("_")}


def _stratum_label(key_vals: dict) -> str:
    return ", ".join(f"{KEY_LABEL[k]} {value_text(k, v)}" for k, v in key_vals.items()) or "all windows"


def compare_windows(wa: list[EvWindow], wb: list[EvWindow], *, vary=None, same_within: float = SAME_WITHIN,
                    n_boot: int = 2000, seed: int = 0, primary: str = "accept_len",
                    min_windows: int = MIN_WINDOWS, side_facts: dict | None = None) -> dict:
    """The A/B of two sides' windows (see the module docstring). NoOverlap / ValueError on bad input."""
    if primary not in METRICS:
        raise ValueError(f"--primary for evidence must be one of {', '.join(METRICS)}")
    bad = [v for v in vary or [] if v not in KEYS]
    if bad:
        raise ValueError(f"--vary {','.join(bad)}: not a stratum key; keys are {', '.join(KEYS)}")
    warnings: list[str] = []
    # windows without a running-request count cannot be stratified by concurrency; only a
    # user who names concurrency in --vary (compare across it) may keep them
    across = bool(vary) and "concurrency" in vary
    for lab, ws in (("A", wa), ("B", wb)):
        if not ws:
            raise InputError(None, f"side {lab} has no windows")
        miss = [w for w in ws if w.concurrency is None]
        if across:
            continue
        if len(miss) == len(ws):
            raise InputError(miss[0].file, f"side {lab}: none of its {len(ws)} windows says how many requests were "
                                           "running, so they cannot be matched by concurrency (log the scheduler's "
                                           "running-request count, e.g. vLLM's 'Running: N reqs' engine line; or, "
                                           "knowing both ran the same load, --vary concurrency)")
        if miss:
            warnings.append(f"{lab}: {len(miss)} of {len(ws)} windows have no (or a zero) running-request count "
                            f"(first: {miss[0].file} {miss[0].ref}); left out")
    if not across:
        wa = [w for w in wa if w.concurrency is not None]
        wb = [w for w in wb if w.concurrency is not None]

    def values(ws, k):
        return {w.strata.get(k) for w in ws}

    unknown, varied, matched = {}, {}, []
    explicit = list(vary) if vary else None
    for k in KEYS:
        va, vb = values(wa, k), values(wb, k)
        if va == {None} or vb == {None}:
            if va != vb or (explicit and k in explicit):
                unknown[k] = [lab for lab, v in (("A", va), ("B", vb)) if v == {None}]
            continue
        if explicit is not None:
            if k in explicit:
                varied[k] = {"a": sorted(map(str, va)), "b": sorted(map(str, vb))}
            else:
                matched.append(k)
        elif k in DESIGN and not (va & vb):
            varied[k] = {"a": sorted(map(str, va)), "b": sorted(map(str, vb))}
        else:
            matched.append(k)
    for k, labs in unknown.items():
        warnings.append(f"{KEY_LABEL[k]} is not reported by {' and '.join(labs)}: not matched "
                        "(a difference in it would go unseen)")
    if explicit is not None:
        for k in explicit:
            if k in matched or (k not in varied and k not in unknown):
                warnings.append(f"--vary {k}: A and B have the same {KEY_LABEL[k]}")
        op = [k for k in varied if k in OPERATIONAL]
        if op:
            warnings.append(f"compared across {', '.join(KEY_LABEL[k] for k in op)} (--vary): it changes "
                            "acceptance or speed on its own, so the verdicts include its effect")
    if len(varied) > 1:
        warnings.append("A and B differ throughout in " + ", ".join(KEY_LABEL[k] for k in varied)
                        + ": a difference cannot be pinned on one of them")

    for w in wa + wb:
        w.key = tuple(w.strata.get(k) for k in matched)

    def skey(w):
        return w.key

    groups: dict = {}
    for w in wa + wb:
        groups.setdefault(skey(w), {"A": [], "B": []})[w.side].append(w)
    # keys that take one value in every window are stated once, not in each stratum label
    shown = [k for k in matched if len(values(wa + wb, k)) > 1]
    common = {k: next(iter(values(wa + wb, k))) for k in matched if k not in shown}

    def label(key):
        return {k: v for k, v in zip(matched, key) if k in shown}

    def order(key):
        return tuple((value_order(v), str(v)) for v in key)

    rng = np.random.default_rng(seed)
    strata, one_sided, thin = [], [], []
    for key in sorted(groups, key=order):
        g = groups[key]
        lab = label(key)
        if not g["A"] or not g["B"]:
            side = "A" if g["A"] else "B"
            one_sided.append({"stratum": {k: value_text(k, v) for k, v in lab.items()}, "label": _stratum_label(lab),
                              "side": side, "windows": len(g[side])})
            continue
        if len(g["A"]) < min_windows or len(g["B"]) < min_windows:
            thin.append({"stratum": {k: value_text(k, v) for k, v in lab.items()}, "label": _stratum_label(lab),
                         "windows_a": len(g["A"]), "windows_b": len(g["B"])})
            continue
        mets = {}
        for m in METRICS:
            r = _compare(_vals(g["A"], m), _vals(g["B"], m), rng, n_boot, same_within)
            if r is not None:
                mets[m] = r
        strata.append({"stratum": {k: value_text(k, v) for k, v in lab.items()}, "label": _stratum_label(lab),
                       "windows_a": len(g["A"]), "windows_b": len(g["B"]), "metrics": mets})
    if not strata:
        raise NoOverlap(_no_overlap_reason(wa, wb, matched, one_sided, thin, min_windows))

    # matched: the compared strata pooled with precision weights; pooled: every window
    matched_res, pooled_res = {}, {}
    for m in METRICS:
        have = [s for s in strata if m in s["metrics"]]
        if have:
            wts = np.array([s["windows_a"] * s["windows_b"] / (s["windows_a"] + s["windows_b"]) for s in have])
            wts = wts / wts.sum()
            a = float(sum(wt * s["metrics"][m]["a"]["mean"] for wt, s in zip(wts, have)))
            b = float(sum(wt * s["metrics"][m]["b"]["mean"] for wt, s in zip(wts, have)))
            ra = sum(wt * s["metrics"][m]["_reps"][0] for wt, s in zip(wts, have))
            rb = sum(wt * s["metrics"][m]["_reps"][1] for wt, s in zip(wts, have))
            dci = _ci(rb - ra)
            matched_res[m] = {"a": {"mean": a, "ci95": _ci(ra)}, "b": {"mean": b, "ci95": _ci(rb)},
                              "diff_b_minus_a": {"mean": b - a, "ci95": dci},
                              "verdict": verdict(dci, a, same_within), "strata": len(have)}
        p = _pooled(wa, wb, m, skey, rng, n_boot, same_within)
        if p is not None:
            pooled_res[m] = p
    for s in strata:
        s["metrics"] = {m: _strip(v) for m, v in s["metrics"].items()}

    paradox = []
    for m in METRICS:
        p, q = pooled_res.get(m), matched_res.get(m)
        if not p or not q or p["verdict"] == "undecided" or p["verdict"] == q["verdict"]:
            continue
        reversal = {p["verdict"], q["verdict"]} == {"A better", "B better"}
        paradox.append({
            "metric": m, "pooled_verdict": p["verdict"], "matched_verdict": q["verdict"], "reversal": reversal,
            "message": (f"pooled {METRIC_LABEL[m]} says {p['verdict']} "
                        f"({_num(p['a']['mean'])} vs {_num(p['b']['mean'])}) "
                        f"but the matched strata say {q['verdict']} ({_num(q['a']['mean'])} vs {_num(q['b']['mean'])})"
                        + (": Simpson's paradox, the pooled figures point the wrong way" if reversal else
                           ": the pooled figures compare different conditions"))})

    confounders = confounder_report(wa, wb, primary, matched, varied, pooled_res, matched_res, same_within)
    res = {
        "kind": KIND, "version": VERSION,
        "sides": {lab: {**((side_facts or {}).get(lab) or {}), "windows": len(ws)}
                  for lab, ws in (("A", wa), ("B", wb))},
        "matched_keys": matched, "common": {k: value_text(k, v) for k, v in common.items()},
        "varied": varied, "unknown_keys": unknown,
        "primary": primary, "same_within": same_within, "bootstrap": n_boot, "seed": seed,
        "min_windows": min_windows,
        "paradox": paradox, "pooled": pooled_res, "matched": matched_res,
        "strata": strata, "one_sided": one_sided, "too_few_windows": thin,
        "confounders": confounders, "warnings": warnings,
    }
    res["verdict"] = matched_res.get(primary, {}).get("verdict", "undecided")
    res["conclusion"] = conclusion(res)
    return res


def _no_overlap_reason(wa, wb, matched, one_sided, thin, min_windows) -> str:
    if thin:
        t = thin[0]
        return (f"A and B share strata but none with {min_windows}+ windows on each side ({t['label']}: "
                f"A {t['windows_a']}, B {t['windows_b']}); longer logs (more windows) there would make them comparable")
    parts, fixes = [], []
    for k in matched:
        va = sorted({w.strata.get(k) for w in wa}, key=lambda v: (value_order(v), str(v)))
        vb = sorted({w.strata.get(k) for w in wb}, key=lambda v: (value_order(v), str(v)))
        if set(va) & set(vb):
            continue
        sa = "/".join(value_text(k, v) for v in va)
        sb = "/".join(value_text(k, v) for v in vb)
        parts.append(f"A has {KEY_LABEL[k]} {sa}, B {sb}")
        fixes.append(f"windows of B at {KEY_LABEL[k]} {sa} or of A at {sb}")
    if not parts:
        parts.append("their windows never agree on " + ", ".join(KEY_LABEL[k] for k in matched) + " together")
        fixes.append(f"windows of both sides in one condition (e.g. B at {one_sided[0]['label']})"
                     if one_sided else "windows of both sides in one condition")
    return ("A and B share no stratum: " + "; ".join(parts) + ". To compare them fairly collect "
            + "; ".join(fixes) + " (or name the key with --vary to compare across it, confounded)")
