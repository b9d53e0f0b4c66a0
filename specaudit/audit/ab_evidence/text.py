"""The A/B-from-evidence result in words: the closing sentence a person can act on
(conclusion), the text report (format_text) and the JSON (to_json: non-finite numbers as null).
"""
from __future__ import annotations

import math

import numpy as np

from specaudit.audit.ab_evidence.stats import METHOD_TEXT
from specaudit.audit.ab_evidence.window import KEY_LABEL, METRIC_LABEL
from specaudit.numfmt import signed as _num


def _mean_and_ci(v: dict | None, sign: bool = False) -> str:
    if not v:
        return "n/a"
    lo, hi = v["ci95"]
    return f"{_num(v['mean'], sign)} [{_num(lo, sign)}, {_num(hi, sign)}]"


def _where(common: dict, stratum: dict) -> str:
    """'at 1 running request with cuda graph on' from a stratum's shown values."""
    c = stratum.get("concurrency", common.get("concurrency"))
    parts = []
    if c is not None:
        parts.append(f"at {c} running request{'' if c == '1' else 's'}")
    rest = [f"{KEY_LABEL[k]} {v}" for k, v in stratum.items() if k != "concurrency"]
    if rest:
        parts.append(("with " if parts else "at ") + ", ".join(rest))
    return " ".join(parts) or "in the windows both sides share"


def conclusion(res: dict) -> str:
    """One sentence a person can act on."""
    m = res["primary"]
    lab = METRIC_LABEL[m]
    pooled, matched = res["pooled"].get(m), res["matched"].get(m)
    if not matched:
        return f"no matched stratum has {lab} on both sides; compare another --primary"
    # the stratum to quote: the one with most windows on the smaller side
    with_m = [s for s in res["strata"] if m in s["metrics"]]
    best = max(with_m, key=lambda s: (min(s["windows_a"], s["windows_b"]), s["windows_a"] + s["windows_b"]))
    x = best["metrics"][m]
    where = _where(res["common"], best["stratum"])
    v = x["verdict"]
    d = x["diff_b_minus_a"]
    gap = (f" by {_num(abs(d['mean']))} ({abs(d['mean']) / abs(x['a']['mean']):.0%} of A; B - A "
           f"{_mean_and_ci(d, True)})" if x["a"]["mean"] else f" (B - A {_mean_and_ci(d, True)})")
    mw = x.get("more_windows")
    undecided = ("undecided: these windows cannot tell; about " + f"{mw} more windows per side at this spread "
                 "would decide it" if mw else "undecided: these windows cannot tell, and more of them at this "
                 "spread would not (the gap is nil; set --same-within to ask for 'same')")
    vtxt = {"same": "the same", "undecided": undecided,
            "A better": "A is better" + gap, "B better": "B is better" + gap}[v]
    quote = f"{where} A gives {_mean_and_ci(x['a'])} and B {_mean_and_ci(x['b'])}, {vtxt}"
    n = len(with_m)
    if n > 1:
        agree = sum(1 for s in with_m if s["metrics"][m]["verdict"] == matched["verdict"])
        quote += f"; over all {n} matched strata: {matched['verdict']} ({agree} of {n} strata say so)"
    para = next((p for p in res["paradox"] if p["metric"] == m), None)
    top = [e for e in res["confounders"] if e.get("explains") is not None and e["key"] != "all matched keys"
           and e["explains"] >= 0.5]
    why = None
    if top:
        names = [KEY_LABEL[top[0]["key"]]] + [KEY_LABEL[k] for k in top[0].get("moves_with", [])]
        why = " and ".join(dict.fromkeys(names))
        if len(names) > 1:
            why += " (they moved together, these windows cannot tell which)"
    tail = ""
    insep = [KEY_LABEL[k] for k in res["varied"]]
    if len(insep) > 1:
        tail = (f"; A and B also differ throughout in {', '.join(insep)}, which these windows cannot separate: "
                "rerun one side with the other's settings to tell them apart")
    gap = f"the pooled gap in {lab} {_num(pooled['a']['mean'])} vs {_num(pooled['b']['mean'])}" if pooled else ""
    if para:
        return f"{gap} is {why or 'the mix of conditions on each side'}: {quote}{tail}."
    if why and pooled:
        tail += f" ({gap} is mostly {why}: explains {top[0]['explains']:.0%})"
    return f"{lab}: {quote}{tail}."


def format_text(res: dict) -> str:
    L = []
    for p in res["paradox"]:
        L.append(f"WARNING: {p['message']}")
    for lab in ("A", "B"):
        s = res["sides"][lab]
        files = s.get("files") or []
        kinds = sorted({f["kind"] for f in files})
        L.append(f"{lab}: {', '.join(f['path'] for f in files)} ({', '.join(kinds)}, engine "
                 f"{s.get('engine') or 'unknown'}): {s['windows']} windows")
    if res["varied"]:
        L.append("compared (differs throughout): " + "; ".join(
            f"{KEY_LABEL[k]} {'/'.join(v['a'])} vs {'/'.join(v['b'])}" for k, v in res["varied"].items()))
    L.append("matched on: " + (", ".join(KEY_LABEL[k] for k in res["matched_keys"]) or "nothing")
             + (" (every window: " + ", ".join(f"{KEY_LABEL[k]} {v}" for k, v in res["common"].items()) + ")"
                if res["common"] else ""))
    for w in res["warnings"]:
        L.append(f"WARNING: {w}")
    L.append("")
    hdr = f"{'metric':<27} {'A [95% CI]':<25} {'B [95% CI]':<25} {'B - A [95% CI]':<27} verdict"
    for s in res["strata"]:
        L.append(f"stratum {s['label']} ({s['windows_a']} A windows, {s['windows_b']} B windows)")
        L.append("  " + hdr)
        for m, x in s["metrics"].items():
            L.append(f"  {METRIC_LABEL[m]:<27} {_mean_and_ci(x['a']):<25} {_mean_and_ci(x['b']):<25} "
                     f"{_mean_and_ci(x['diff_b_minus_a'], True):<27} {x['verdict']}"
                     + (f" ({x['more_windows']} more windows per side would decide)"
                        if x.get("more_windows") else ""))
        L.append("  " + _method_line(s))
    for name, block in (("matched (compared strata, weighted)", res["matched"]),
                        ("pooled (every window, strata ignored)", res["pooled"])):
        L.append(name)
        L.append("  " + hdr)
        for m, x in block.items():
            L.append(f"  {METRIC_LABEL[m]:<27} {_mean_and_ci(x['a']):<25} {_mean_and_ci(x['b']):<25} "
                     f"{_mean_and_ci(x['diff_b_minus_a'], True):<27} {x['verdict']}")
    if res["one_sided"]:
        L.append("on one side only (not compared):")
        for o in res["one_sided"]:
            L.append(f"  {o['label']}: {o['side']} only, {o['windows']} windows")
    if res["too_few_windows"]:
        L.append(f"too few windows to compare (< {res['min_windows']} on a side):")
        for o in res["too_few_windows"]:
            L.append(f"  {o['label']}: A {o['windows_a']}, B {o['windows_b']}")
    if res["confounders"]:
        L.append(f"what differs between A and B (share of the pooled {METRIC_LABEL[res['primary']]} gap it explains):")
        for e in res["confounders"]:
            if e["key"] == "all matched keys":
                L.append(f"  all matched keys together: explains {e['explains']:.0%}")
                continue
            dist = lambda d: ", ".join(f"{v} {s:.0%}" for v, s in d.items())
            ex = f"explains {e['explains']:.0%}" if e["explains"] is not None else e.get("note", "")
            mv = (f"; moved together with {', '.join(KEY_LABEL[k] for k in e['moves_with'])}"
                  if e.get("moves_with") else "")
            L.append(f"  {KEY_LABEL[e['key']]} ({e['role']}): A {dist(e['a'])}; B {dist(e['b'])} -> {ex}{mv}")
    L.append("")
    L.append(f"verdict ({METRIC_LABEL[res['primary']]}, matched): {res['verdict']}")
    L.append(res["conclusion"])
    return "\n".join(L)


def _method_line(s: dict) -> str:
    """How a stratum's intervals were made, and the permutation test of its primary metrics."""
    x = next(iter(s["metrics"].values()), None)
    if x is None:
        return ""
    ms = {x["a"]["method"], x["b"]["method"]}
    how = "; ".join(f"{side} {METHOD_TEXT[x[side.lower()]['method']]}" for side in ("A", "B")) \
        if len(ms) > 1 else METHOD_TEXT[ms.pop()]
    ps = ", ".join(f"{METRIC_LABEL[m]} p={v['permutation_p']:.3g}" for m, v in s["metrics"].items()
                   if v.get("permutation_p") is not None)
    return f"intervals: {how}; permutation test of B - A over windows: {ps}"


def to_json(res: dict) -> str:
    import json

    def clean(o):
        if isinstance(o, float):
            return o if math.isfinite(o) else None
        if isinstance(o, dict):
            return {str(k): clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        if isinstance(o, (np.floating, np.integer)):
            return clean(o.item())
        return o
    return json.dumps(clean(res), indent=1) + "\n"
