"""What differs between A and B, and how much of the pooled gap each key explains.

    confounder_report(windows_a, windows_b, primary, matched, varied, pooled, matched_res, same_within)
    -> [{"key", "a", "b", "distance", "role", "gap_within", "explains", "explains_by_metric", "note"?,
         "moves_with"?}, ...]

For every key whose distribution over windows differs between the sides (total variation
distance): G = pooled B - pooled A, G_k the gap left after standardising on the key alone
(per-value differences over the values both sides hold, weighted by their windows), and
the key explains (G - G_k) / G. A key whose values the sides never share is inseparable;
keys that split a side's windows the same way moved together and cannot be told apart. A
pooled gap within the caller's "same" band (same_within of A; specaudit.ab_verdict) has
nothing to explain.
"""
from __future__ import annotations

import numpy as np

from specaudit.audit.ab_evidence.window import KEYS, METRICS, value_order, value_text


class _Side:
    """One side's windows as arrays: per key an integer code per window, per metric a
    float per window (nan = missing). The confounder report groups with bincount."""

    def __init__(self, ws: list):
        self.n = len(ws)
        self.codes = {}                       # key -> (values in first-seen order, [n] codes)
        for k in KEYS:
            idx: dict = {}
            inv = np.fromiter((idx.setdefault(w.strata.get(k), len(idx)) for w in ws), np.int64, self.n)
            self.codes[k] = (list(idx), inv)
        self.metric = {m: np.fromiter((np.nan if getattr(w, m) is None else getattr(w, m) for w in ws),
                                      np.float64, self.n) for m in METRICS}

    def groups(self, k: str, m: str) -> dict:
        """value -> (mean, windows) of metric m over the windows with that value of k."""
        vals, inv = self.codes[k]
        x = self.metric[m]
        ok = ~np.isnan(x)
        cnt = np.bincount(inv[ok], minlength=len(vals))
        tot = np.bincount(inv[ok], weights=x[ok], minlength=len(vals))
        return {v: (tot[i] / cnt[i], int(cnt[i])) for i, v in enumerate(vals) if cnt[i] > 0}

    def shares(self, k: str) -> dict:
        vals, inv = self.codes[k]
        cnt = np.bincount(inv, minlength=len(vals))
        n = max(self.n, 1)
        out = {value_text(k, v): c / n for v, c in zip(vals, cnt.tolist())}
        return dict(sorted(out.items(), key=lambda kv: (value_order(kv[0]), kv[0])))

    def same_partition(self, k1: str, k2: str) -> bool:
        """k1 and k2 split this side's windows the same way (they moved together)."""
        (v1, c1), (v2, c2) = self.codes[k1], self.codes[k2]
        if len(v1) != len(v2):
            return False
        return len(np.unique(c1 * len(v2) + c2)) == len(v1)


def _gap_within(A: _Side, B: _Side, key: str, m: str):
    """The gap B - A after standardising on `key` alone, and the shared values (None if none)."""
    ga, gb = A.groups(key, m), B.groups(key, m)
    shared = [v for v in ga if v in gb]
    if not shared:
        return None, []
    tot = sum(ga[v][1] + gb[v][1] for v in shared)
    g = sum((ga[v][1] + gb[v][1]) / tot * (gb[v][0] - ga[v][0]) for v in shared)
    return float(g), shared


def confounder_report(wa, wb, primary, matched, varied, pooled, matched_res, same_within: float) -> list[dict]:
    """Every key whose window distribution differs between A and B, with its share of the gap.
    A pooled gap within `same_within` of A (the verdicts' "same" band) has nothing to explain;
    the band has no default here, so no caller can forget to pass the user's."""
    A, B = _Side(wa), _Side(wb)
    out = []
    p = pooled.get(primary)
    G = p["diff_b_minus_a"]["mean"] if p else None
    small = G is None or abs(G) <= 1e-9 or (p and abs(G) <= same_within * abs(p["a"]["mean"]))
    for k in KEYS:
        sa, sb = A.shares(k), B.shares(k)
        if sa == sb:
            continue
        tv = 0.5 * sum(abs(sa.get(v, 0) - sb.get(v, 0)) for v in set(sa) | set(sb))
        if tv < 1e-9:
            continue
        gk, _shared = _gap_within(A, B, k, primary)
        entry = {"key": k, "a": sa, "b": sb, "distance": round(tv, 4),
                 "role": "varied" if k in varied else ("matched" if k in matched else "unmatched"),
                 "gap_within": gk, "explains": None, "explains_by_metric": {}}
        for m, pm in pooled.items():
            g_m = pm["diff_b_minus_a"]["mean"]
            gk_m, _ = _gap_within(A, B, k, m)
            if gk_m is not None and abs(g_m) > same_within * abs(pm["a"]["mean"]) and abs(g_m) > 1e-9:
                entry["explains_by_metric"][m] = (g_m - gk_m) / g_m
        if gk is None:
            entry["note"] = "inseparable: the sides share no value of it, no window can say what it does"
        elif small:
            entry["note"] = "the pooled figures already agree"
        else:
            entry["explains"] = (G - gk) / G
        out.append(entry)
    # keys that moved together on a side (the same partition of its windows) cannot be told apart
    for S in (A, B):
        ks = [e["key"] for e in out]
        for i, k1 in enumerate(ks):
            for k2 in ks[i + 1:]:
                if len(S.codes[k1][0]) > 1 and S.same_partition(k1, k2):
                    for e in out:
                        if e["key"] in (k1, k2):
                            other = k2 if e["key"] == k1 else k1
                            e.setdefault("moves_with", [])
                            if other not in e["moves_with"]:
                                e["moves_with"].append(other)
    out.sort(key=lambda e: (-(e["explains"] if e["explains"] is not None else -1), -e["distance"]))
    if out and p and matched_res.get(primary) and not small:
        gm = matched_res[primary]["diff_b_minus_a"]["mean"]
        out.append({"key": "all matched keys", "explains": (G - gm) / G, "gap_within": gm,
                    "role": "matched", "a": {}, "b": {}, "distance": None})
    return out
