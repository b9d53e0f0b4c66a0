"""A/B from evidence: compare two engines' logs, scrapes or trace datasets fairly.

    from specaudit.audit.ab_evidence import compare_sides
    from specaudit.audit.ab_evidence.text import format_text
    res = compare_sides(["linear.log"], ["ddtree.log"])
    res["conclusion"]   # "the pooled gap in accept length 3.45 vs 2.00 is concurrency: ..."

This module is the entry point (compare_sides: check the arguments, read both sides,
compare). The package, one idea a module:
    window        EvWindow and the vocabulary of strata keys and metrics
    sides         a side as typed -> its inputs -> windows (logs, scrapes, traces, URLs)
    stats         intervals of a side's mean (t or moving-block bootstrap, named) and the
                  permutation test
    comparison    strata, per-stratum comparison, matched and pooled, Simpson's paradox
    confounders   what differs between the sides and how much of the gap it explains
    text          the closing sentence, the text report, the JSON
    throughput    the throughput-derived commit length and its two flags

Nothing is rerun. Each side (one or several files of one engine) is cut into windows:

    window     one interval over which the engine reported its figures: one SGLang
               `Decode batch` line, one vLLM `SpecDecoding metrics` line, one Prometheus
               scrape interval (read by specaudit.audit.sources), or, for a trace dataset,
               up to --window-forwards consecutive verify forwards of one run at the same
               batch size (the run's first window is dropped as warm-up when it has 3+)
    stratum    the window's values of what changes acceptance or speed on its own:
               concurrency (running requests, binned 1, 2, 3-4, 5-8, ...; exact with
               concurrency_bins="exact"), cuda graph on/off, data-parallel rank, draft
               tokens per step k, topk, algorithm, engine, engine version, model

Per window, higher is better for every metric:
    accept_len       tokens per verify step, bonus included: the engine's figure for logs
                     (+1 when the source excludes the bonus); for traces re-derived from
                     the rows (committed tokens / steps), never the commit_len counter
    accept_rate      accepted drafts / drafted tokens, from the window's counts, else
                     (accept_len - 1) / k; never the printed rate, whose formula changed
                     between engine versions (SGLang counted the bonus until ~v0.5.11), so
                     two versions' printed rates are not the same quantity; traces: from
                     accepted_path and node_tokens
    tokens_per_s     generation throughput of all running requests; traces: committed
                     tokens / the forwards' step seconds (steady state)
    commit_len_tput  throughput-derived commit length (specaudit.audit.estimate), only
                     with a baseline and a cost factor: (tokens_per_s / c) / baseline(c) * r

Keys are split in two. Matched keys must be equal for two windows to be compared; a
stratum is one combination of their values. Varied keys are what the A/B compares: by
default the design keys (k, topk, algo, engine, version, model) that differ between the
sides throughout; `vary` names them explicitly (an operational key named there is
compared across, and said to be confounded). A key unknown on a side is not matched.

For each stratum with enough windows on both sides, per metric: A's and B's mean over
windows with a 95% interval made by a method fit for the windows' number, named in the
output (specaudit.audit.ab_evidence.stats: below 20 windows Student's t with n - 1 df, their
autocorrelation being impossible to estimate from so few; from 20 a moving-block
bootstrap, blocks of about n^(1/3) or the correlation time of neighbouring windows,
since a burst of load spans several; numpy, seeded), the permutation test of B - A
over windows, B - A with its interval, and a verdict from specaudit.ab_verdict (the project's one A/B
decision: same / A better / B better / undecided). Strata on one side only are listed,
never compared. `matched` pools the compared strata with precision weights
nA*nB/(nA+nB); `pooled` is every window of each side, stratum ignored (its interval
resamples within strata, holding each side's mix as observed). When the two
disagree (Simpson's paradox when they point opposite ways) it is said first.

The confounder report names every key whose distribution over windows differs between A
and B and how much of the pooled gap G = pooled B - pooled A it explains: with G_k the
gap left after standardising on that key alone (per-value differences over the values
both sides hold, weighted by their windows), explains = (G - G_k) / G. A key whose
values the sides never share is inseparable: no window can say what it does.
"""
from __future__ import annotations

from specaudit.ab_verdict import SAME_WITHIN, check_same_within
from specaudit.audit.ab_evidence.comparison import MIN_WINDOWS, compare_windows
from specaudit.audit.ab_evidence.sides import WINDOW_FORWARDS, read_side
from specaudit.audit.ab_evidence.throughput import add_throughput_commit, parse_cost_factor, parse_per_concurrency
from specaudit.audit.ab_evidence.window import METRIC_LABEL, METRICS


def one_sided_metrics(wa, wb) -> dict:
    """Metrics with figures on one side only (e.g. acceptance on the speculative side of an
    off-vs-on A/B): {metric: {"side", "mean", "windows"}}, stated rather than compared."""
    out = {}
    for m in METRICS:
        xa = [getattr(w, m) for w in wa if getattr(w, m) is not None]
        xb = [getattr(w, m) for w in wb if getattr(w, m) is not None]
        if bool(xa) != bool(xb):
            lab, xs = ("A", xa) if xa else ("B", xb)
            out[m] = {"side": lab, "mean": float(sum(xs) / len(xs)), "windows": len(xs)}
    return out


def compare_sides(side_a, side_b, *, source: str | None = None, vary=None, same_within: float = SAME_WITHIN,
                  n_boot: int = 2000, seed: int = 0, primary: str = "accept_len", bins: str = "pow2",
                  window_forwards: int = WINDOW_FORWARDS, min_windows: int = MIN_WINDOWS,
                  baseline_tps=None, cost_factor=None) -> dict:
    """Read both sides and compare them. InputError / ValueError (one line) on bad input."""
    if bins not in ("pow2", "exact"):
        raise ValueError(f"--concurrency-bins must be pow2 or exact (got {bins!r})")
    if n_boot < 100:
        raise ValueError(f"--bootstrap must be at least 100 (got {n_boot})")
    check_same_within(same_within)
    if window_forwards < 2:
        raise ValueError(f"--window-forwards must be at least 2 (got {window_forwards})")
    if min_windows < 2:
        raise ValueError(f"--min-windows must be at least 2 (got {min_windows})")
    base = parse_per_concurrency(baseline_tps, "--baseline-tps")
    cost = parse_cost_factor(cost_factor)
    if (base is None) != (cost is None):
        raise ValueError("the throughput-derived commit length needs both --baseline-tps (plain decoding, "
                         "tokens/s per request) and --cost-factor (step cost / plain step)")
    if primary == "commit_len_tput" and base is None:
        raise ValueError("--primary commit_len_tput needs --baseline-tps and --cost-factor")
    wa, fa = read_side(side_a, "A", source=source, bins=bins, window_forwards=window_forwards)
    wb, fb = read_side(side_b, "B", source=source, bins=bins, window_forwards=window_forwards)
    extra = []
    if base is not None:
        n = add_throughput_commit(wa + wb, base, cost)
        if n == 0:
            raise ValueError("--baseline-tps gives no baseline at the concurrencies of these windows")
        if isinstance(base, float):
            extra.append("one --baseline-tps for every concurrency: the throughput-derived commit length "
                         "ignores how the batch slows a plain step")
    res = compare_windows(wa, wb, vary=vary, same_within=same_within, n_boot=n_boot, seed=seed,
                          primary=primary, min_windows=min_windows, side_facts={"A": fa, "B": fb})
    res["warnings"] += fa["notes"] + fb["notes"] + extra
    res["one_sided_metrics"] = one_sided_metrics(wa, wb)
    for m, d in res["one_sided_metrics"].items():
        res["warnings"].append(f"{METRIC_LABEL[m]} exists on side {d['side']} only ({d['mean']:.4g}, mean of "
                               f"{d['windows']} windows): not compared (the other side has no such figure)")
    if base is not None:
        res["baseline_tps"] = base if isinstance(base, float) else {str(k): v for k, v in base.items()}
        res["cost_factor"] = cost
    return res
