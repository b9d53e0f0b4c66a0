"""Judging reported counters against one throughput estimate, in one sentence.

Two counters at once (the seed question): given a reported commit length and a reported
mean accepted depth, each is judged on its own (the depth as depth + 1 tokens per step),
the identity commit = depth + 1 (per unfinished step, chain or tree; over a run's means the
commit sits at most IDENTITY_CUT_SLACK below, as the steps that end requests are cut at EOS
or the token limit) is checked between them, and `judge` ends with one sentence: which
counter the throughput supports, which it contradicts, or that it cannot tell and why (a
band *admits* every figure inside it: a counter is *supported* only when the band tells it
from the alternative; from a trace, the commit length re-derived from the committed tokens
is one, and when the band holds it beside a counter it disagrees with, the sentence says
throughput cannot tell them apart and that the per-step check decides).
`estimate_and_judge` takes one observation through the model and this judgement (the
result dict the CLI prints); `r_band_judgement` judges each counter by the r it implies
when no cost factor is known (specaudit.audit.r_band).
"""
from __future__ import annotations

from specaudit.audit.estimate_model import (
    CONSISTENT,
    DEFAULT_TOLERANCE,
    INCONSISTENT,
    MAX_REL_STD,
    MISMATCH,
    NOT_ENOUGH_DATA,
    Estimate,
    estimate_commit_length,
    range_problem,
    verdict,
)
from specaudit.audit.observed_throughput import Observation
from specaudit.numfmt import fixed as _f  # two decimals, as engines print their figures

# How far below mean depth + 1 a mean commit length may sit (the cut last steps of requests)
# before the identity counts as broken between two reported means.
IDENTITY_CUT_SLACK = 0.1


def _rivals(est: Estimate, ok: list, derived, tolerance: float, n_nodes) -> list:
    """The admitted figures that a derived commit length inside the band disagrees with. A
    depth counter agrees when the derived commit length sits where the identity puts it
    (depth + 1, or at most IDENTITY_CUT_SLACK below: the cut last steps of requests)."""
    if derived is None or not ok:
        return []
    from specaudit.audit.compare import agrees
    if verdict(est, derived, tolerance, n_nodes) != CONSISTENT:
        return []

    def fits(f):
        c = f["as_commit_len"]
        return bool(agrees(c, derived)) or (f["counter"] == "accepted depth"
                                            and c * (1 - IDENTITY_CUT_SLACK) <= derived <= c)
    return [f for f in ok if not fits(f)]


def _figures(reported_commit_len, reported_accept_depth, commit_from: str, depth_from: str) -> list:
    figs = []
    if reported_commit_len is not None:
        figs.append({"counter": "commit length", "reported": reported_commit_len,
                     "as_commit_len": reported_commit_len, "from": commit_from})
    if reported_accept_depth is not None:
        figs.append({"counter": "accepted depth", "reported": reported_accept_depth,
                     "as_commit_len": reported_accept_depth + 1, "from": depth_from})
    return figs


def identity_sentence(reported_commit_len, reported_accept_depth) -> str | None:
    """commit = depth + 1 between two reported means (None unless both are given)."""
    if reported_commit_len is None or reported_accept_depth is None:
        return None
    from specaudit.audit.compare import agrees
    d1 = reported_accept_depth + 1
    word = ("per unfinished step; a mean sits at most "
            f"{IDENTITY_CUT_SLACK:.0%} below, the cut last steps of requests")
    # means over a run: the step that ends a request is cut at EOS or the token limit, so
    # the mean commit length sits at or a little below mean depth + 1 (IDENTITY_CUT_SLACK)
    holds = bool(agrees(reported_commit_len, d1)) or (
        d1 * (1 - IDENTITY_CUT_SLACK) <= reported_commit_len <= d1)
    return (f"commit length = accepted depth + 1 ({word}): {_f(reported_commit_len)} against "
            f"{_f(reported_accept_depth)} + 1 = {_f(d1)}: "
            + ("holds" if holds else "broken, so at least one of the two counters is wrong"))


def judge(est: Estimate, *, reported_commit_len=None, reported_accept_depth=None,
          tolerance: float = DEFAULT_TOLERANCE, n_nodes: int | None = None, algo: str | None = None,
          commit_from: str = "reported", depth_from: str = "reported", derived_commit_len=None) -> dict:
    """Judge one or both counters against one estimate; the answer ends in one sentence.

    Returns {"verdict", "figures": [{counter, reported, as_commit_len, from, verdict}],
    "identity": sentence or None, "conclusion": sentence}. The overall verdict is the
    worst figure's (inconsistent > calibration mismatch > not enough data > consistent).

    Wording: a band that holds a figure *admits* it; the evidence *supports* a counter only
    when it tells it apart from the alternative (the other counter falls outside the band,
    and no other figure in the band disagrees with it). `derived_commit_len` (a trace's
    committed tokens per step, re-derived from the raw tensors) is such an alternative:
    when the band holds it beside an admitted counter that it disagrees with, throughput
    cannot tell the two apart, and the conclusion says so and what decides."""
    figs = _figures(reported_commit_len, reported_accept_depth, commit_from, depth_from)
    for f in figs:
        f["verdict"] = verdict(est, f["as_commit_len"], tolerance, n_nodes)
    band = f"[{_f(est.low * (1 - tolerance))}, {_f(est.high * (1 + tolerance))}]"
    identity = identity_sentence(reported_commit_len, reported_accept_depth)
    problem = range_problem(est, n_nodes)
    if problem:
        overall = MISMATCH
        conclusion = f"Cannot judge the engine: {problem}."
    elif not figs:
        overall = NOT_ENOUGH_DATA
        conclusion = ("Nothing to judge: no reported figure (give --reported-commit-len and/or "
                      "--reported-accept-depth).")
    elif est.rel_std > MAX_REL_STD:
        overall = NOT_ENOUGH_DATA
        conclusion = (f"Cannot tell: the throughput estimate {_f(est.value)} is too uncertain (relative sd "
                      f"{est.rel_std:.0%}) to tell any two figures apart; a measured cost profile "
                      "(`specaudit calibrate`) or more windows would decide.")
    else:
        ok = [f for f in figs if f["verdict"] == CONSISTENT]
        bad = [f for f in figs if f["verdict"] == INCONSISTENT]
        overall = INCONSISTENT if bad else CONSISTENT

        def name(f):
            return (f"the {f['counter']} counter ({_f(f['reported'])}"
                    + (f", i.e. {_f(f['as_commit_len'])} tokens per step)" if f["counter"] == "accepted depth"
                       else ")"))
        est_s = f"the throughput estimate {_f(est.value)} tokens per step (band {band})"
        # the re-derived figure, when the band holds it and it disagrees with an admitted counter:
        # throughput cannot tell that counter from the truth the trace's raw tensors give
        rivals = _rivals(est, ok, derived_commit_len, tolerance, n_nodes)
        if rivals:
            d = _f(derived_commit_len)
            head = (f"The evidence contradicts {name(bad[0])}; " if bad else "")
            conclusion = (head + f"{est_s} admits {' and '.join(name(f) for f in rivals)} but also holds the "
                          f"derived {d} tokens per step (the trace's committed tokens), so throughput cannot tell "
                          f"{'them' if len(rivals) > 1 else 'the two'} apart; the per-step trace decides: "
                          "`specaudit check` compares each counter with the committed tokens (SA5xx), or a "
                          "narrower band (a measured profile, more windows).")
            conclusion = conclusion[0].upper() + conclusion[1:]
        elif len(figs) == 2 and len(ok) == 1:
            conclusion = (f"The evidence supports {name(ok[0])} and contradicts {name(bad[0])}: "
                          f"{est_s} says the {bad[0]['counter']} counter is the wrong one.")
        elif len(figs) == 2 and len(bad) == 2:
            conclusion = f"The evidence contradicts both counters: {est_s} matches neither."
        elif len(figs) == 2 and identity and "broken" in identity:
            overall = NOT_ENOUGH_DATA   # one of them is wrong, and the evidence cannot say which
            conclusion = (f"Cannot tell which counter is wrong: {est_s} admits both, although they break the "
                          "identity; a narrower estimate (a measured profile, more windows) would decide.")
        elif len(figs) == 2:
            conclusion = f"The evidence admits both counters: {est_s} holds them, and they agree."
        elif bad:
            conclusion = f"The evidence contradicts {name(bad[0])}: {est_s}."
        else:
            conclusion = (f"The evidence admits {name(ok[0])}: {est_s} holds it (a band admits every figure "
                          "inside it; it tells this counter from none other).")
    return {"verdict": overall, "figures": figs, "identity": identity, "conclusion": conclusion}


def _reported(obs: Observation, reported_commit_len, reported_accept_depth):
    """The counters to judge: the ones given on the command line win over the input's."""
    if reported_commit_len is not None or reported_accept_depth is not None:
        return reported_commit_len, "--reported-commit-len", reported_accept_depth, "--reported-accept-depth"
    return (obs.reported_commit_len, f"from {obs.source}", obs.reported_accept_depth, f"from {obs.source}")


R_STATUS = {CONSISTENT: "possible", INCONSISTENT: "contradicted"}
R_VERDICT = {"named": INCONSISTENT, "contradicted": INCONSISTENT, "possible": CONSISTENT,
             "both excluded": MISMATCH, "nothing": NOT_ENOUGH_DATA}


def r_band_judgement(obs: Observation, base: tuple, band, *, reported_commit_len=None,
                     reported_accept_depth=None, tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """No cost factor: each counter's implied r against a band for r (specaudit.audit.r_band).
    The result has the keys estimate_and_judge's has where they mean something here."""
    from specaudit.audit.r_band import judge_r
    b, b_sd, b_label = base
    rep, rep_from, dep, dep_from = _reported(obs, reported_commit_len, reported_accept_depth)
    figs = _figures(rep, dep, rep_from, dep_from)
    rj = judge_r(figs, obs.tps, obs.tps_std, b, b_sd, band)
    identity = identity_sentence(rep, dep)
    v = R_VERDICT.get(rj["outcome"])
    if rj["outcome"] == "both possible":
        v = NOT_ENOUGH_DATA if identity and "broken" in identity else CONSISTENT
    for f, x in zip(figs, rj["figures"]):
        f["verdict"] = {"possible": CONSISTENT, "contradicted": INCONSISTENT}[x["status"]]
        f["implied_r"] = x["implied_r"]
    return {"label": obs.label, "source": obs.source, "concurrency": obs.concurrency, "n_nodes": obs.n_nodes,
            "samples": obs.samples, "mode": "r band", "observed_tps": obs.tps, "observed_std": obs.tps_std,
            "baseline_tps": b, "baseline_std": b_sd, "baseline_from": b_label, "r_band": rj, "figures": figs,
            "verdict": v, "tolerance": tolerance, "identity": identity, "conclusion": rj["conclusion"]}


def estimate_and_judge(obs: Observation, base: tuple, cost: tuple, *, reported_commit_len=None,
                       reported_accept_depth=None, tolerance: float = DEFAULT_TOLERANCE,
                       algo: str | None = None, band=None) -> dict:
    """One observation through the model and the judgement: the result dict that the CLI
    prints (text or JSON). base = (tps, sd, label), cost = (r, sd, label). Figures given
    here win over the ones the observation carries."""
    b, b_sd, b_label = base
    r, r_sd, r_label = cost
    est = estimate_commit_length(obs.tps, b, r, cost_factor_std=r_sd, tps_std=obs.tps_std, baseline_std=b_sd)
    rep, rep_from, dep, dep_from = _reported(obs, reported_commit_len, reported_accept_depth)
    j = judge(est, reported_commit_len=rep, reported_accept_depth=dep, tolerance=tolerance, n_nodes=obs.n_nodes,
              algo=algo or obs.extra.get("algo"), commit_from=rep_from, depth_from=dep_from,
              derived_commit_len=obs.extra.get("derived_commit_len"))
    main = j["figures"][0] if j["figures"] else None
    res = {"label": obs.label, "source": obs.source, "concurrency": obs.concurrency, "n_nodes": obs.n_nodes,
           "samples": obs.samples, "cost_factor_from": r_label, "baseline_from": b_label,
           "estimate": est.to_dict(), "reported_commit_len": main["as_commit_len"] if main else None,
           "reported_from": main["from"] if main else None, "verdict": j["verdict"], "tolerance": tolerance,
           "figures": j["figures"], "identity": j["identity"], "conclusion": j["conclusion"]}
    for f in j["figures"]:
        pv, plo, phi = est.predicted_tps(f["as_commit_len"])
        f["predicted_tps"] = {"value": round(pv, 3), "low": round(plo, 3), "high": round(phi, 3)}
    if main:
        res["predicted_tps"] = main["predicted_tps"]
    if obs.extra.get("derived_commit_len") is not None:
        res["derived_commit_len"] = round(obs.extra["derived_commit_len"], 4)
    if range_problem(est, obs.n_nodes):
        res["note"] = range_problem(est, obs.n_nodes)
    if obs.extra.get("confounder"):
        res["confounder"] = obs.extra["confounder"]
    if band is not None and j["figures"]:
        # how much the verdict rests on r: the r each counter implies, beside r's band; the
        # statuses are the estimate's verdicts (the same model read the other way round)
        from specaudit.audit.r_band import judge_r
        rj = judge_r(j["figures"], obs.tps, obs.tps_std, b, b_sd, band)
        for f, x in zip(j["figures"], rj["figures"]):
            x["status"] = R_STATUS.get(f["verdict"], f["verdict"])
            f["implied_r"] = x["implied_r"]
        rj.pop("conclusion")
        rj.pop("outcome")
        res["r_band"] = rj
    return res
