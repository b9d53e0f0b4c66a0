"""SA708-SA710: an engine's accept length against its own throughput.

The estimator's model (specaudit/audit/estimate_model.py): per request, tps = C / t_step(c, N), so a
window's verify steps per second per request, gen_tps / (c * accept_len), depends only on
the step cost at that concurrency. Honest counters keep that step rate steady across
windows of one configuration; a counter that jumps without the throughput following moves
it. With specaudit's own gauges the live estimate is exported beside the reported figure,
and the two are compared directly.
"""
from __future__ import annotations

import math
from statistics import median

from specaudit.audit.observed_throughput import MIN_WINDOWS, STEP_RATE_FACTOR, lines, split_by_step_rate  # noqa: F401  (re-exported for the tests)

from .sa7xx_common import fmt, mean, usable, where
from .sa7xx_identities import SourceRule
from .sa7xx_spans import SPAN_S, at_request_end, judged_windows

SHIFT = 0.20             # acceptance moving by more than 20% between compared windows
CONC_SHIFT = 0.25        # concurrency moving by more than 25% confounds the comparison
TOLERANCE = 0.1          # the estimator's default verdict tolerance


def _bucket(c):
    """Half-octave bucket of a concurrency: 8 and 9 share one, 4 and 8 do not."""
    return None if not c or c <= 0 else round(2 * math.log2(c))


def groups(reading):
    """(rank, concurrency bucket, graph mode) -> windows with a step rate, in file order."""
    g: dict = {}
    for w in judged_windows(reading):   # llama.cpp: spans of >= SPAN_S s (request-end counters)
        if w.step_rate is None or not usable(w):
            continue
        g.setdefault((w.rank, _bucket(w.concurrency), w.cuda_graph), []).append(w)
    return g


# the split and the line lists live with the estimator's observed throughput
# (specaudit.audit.observed_throughput), which judges each group of a log on its own; this
# rule and it split windows the same way
def accept_range(ws) -> str:
    a = [w.accept_len for w in ws]
    return f"accept len {fmt(min(a))}" + ("" if fmt(min(a)) == fmt(max(a)) else f"-{fmt(max(a))}")


def baseline_of(reading):
    """(baseline tokens/s, cost factor) when the caller put them in the reading's config
    (keys baseline_tps and cost_factor, as `specaudit estimate FILE --baseline-tps` has them), else None."""
    cfg = reading.config or {}
    b, r = cfg.get("baseline_tps"), cfg.get("cost_factor")
    if isinstance(b, (int, float)) and isinstance(r, (int, float)) and b > 0 and r > 0:
        return float(b), float(r)
    return None


def supported_side(reading, lo, hi):
    """Which side the throughput supports, with a baseline: ('lo'|'hi'|None, sentence)."""
    base = baseline_of(reading)
    if base is None:
        return None, None
    from specaudit.audit.cost_profile import CostProfile
    from specaudit.audit.estimate_model import CONSISTENT, estimate_commit_length, verdict
    b, r = base
    r, r_sd = CostProfile.manual(r).lookup()     # a hand-given factor: the estimator's default spread
    out = {}
    for name, ws in (("lo", lo), ("hi", hi)):
        est = estimate_commit_length(mean([w.gen_tps for w in ws]), b, r, cost_factor_std=r_sd)
        claim = mean([w.accept_len for w in ws]) + (0 if reading.includes_bonus else 1)
        out[name] = (verdict(est, round(claim, 2), TOLERANCE) == CONSISTENT, est.value)
    ok = [k for k, (good, _) in out.items() if good]
    if len(ok) == 1:
        return ok[0], f"the baseline {b:g} tokens/s with cost factor {r:g} gives {fmt(out[ok[0]][1])} tokens per step"
    return None, (f"the baseline {b:g} tokens/s with cost factor {r:g} gives {fmt(out['lo'][1])} tokens per step, "
                  "which supports " + ("both groups" if len(ok) == 2 else "neither group"))


class AcceptLenVsThroughput(SourceRule):
    """What: the accept length agrees with the throughput: at one concurrency the implied
    verify steps per second per request, gen throughput / (running requests * accept
    len), stays steady; and specaudit's reported commit length lies inside the band of
    its throughput estimate.

    Why: throughput is measured by the clock, not by the counter under audit. If the
    counter moves while tokens/s stay put, the counter is wrong somewhere. A gap the
    tokens/s carry more than the counter does (the accept len moved by less than the
    square root of the gap: a busy host, a slower phase) says nothing of the counter and
    is not flagged. Which lines
    are wrong throughput alone cannot say: a majority of lines proves nothing (a
    counter can be wrong most of the time). Without a baseline the finding names both
    groups of lines and what would decide (`specaudit estimate FILE --baseline-tps`, or
    a calibrated profile); with one (baseline_tps and cost_factor in the reading's
    config) it names the group the throughput supports.

    Example: `accept len: 4.00` with 410 token/s at 8 requests, where earlier lines read
    `accept len: 2.00` with 405 token/s at 8 requests.
    """

    code = "SA708"
    name = "accept-len-vs-throughput"
    message = "{what}: {detail}"
    fail_fixture = "sglang_counter_vs_throughput.log"
    pass_fixture = "sglang_clean.log"

    def check(self, reading):
        from specaudit.audit.compare import within
        items = []
        for (_rank, _, graph), ws in groups(reading).items():
            sp = split_by_step_rate(ws)
            if sp is None:
                continue
            lo, hi, factor = sp
            # the counter must carry the gap: factor = (tps_hi / tps_lo) * (accept_lo / accept_hi),
            # and when the accept len moved less than the throughput did (at most the square
            # root of the gap), the tokens/s moved (a busy host, a slower phase), not the counter
            moved = median([w.accept_len for w in lo]) / median([w.accept_len for w in hi])
            if moved <= math.sqrt(factor):
                remarks = getattr(reading, "remarks", None)
                if remarks is not None:   # the account says what was looked at and why it is no finding
                    remarks.append(
                        f"SA708: {lines(lo)} ({accept_range(lo)}) and {lines(hi)} ({accept_range(hi)}) differ by "
                        f"a factor {factor:.2f} in verify steps/s per request, but the accept len moved by "
                        f"{moved:.2f}, at most the square root of that ({math.sqrt(factor):.2f}): the tokens/s "
                        "carry the gap (a busy host, a slower phase), so no counter fault is claimed")
                continue
            tps = mean([w.gen_tps for w in ws])
            conc = mean([w.concurrency for w in ws])
            ctx = f"{'' if graph is None else ', cuda graph ' + str(graph)}"
            if at_request_end(reading):
                ctx += f" (spans of at least {SPAN_S:g} s: these counters move when a request ends)"
            pair = (f"{lines(lo)} ({accept_range(lo)}) and {lines(hi)} ({accept_range(hi)}) disagree by a factor "
                    f"{factor:.2f} in tokens per step at the same throughput (about {fmt(tps, 1)} tokens/s) and "
                    f"{conc:g} running request{'' if conc == 1 else 's'}{ctx}")
            side, why = supported_side(reading, lo, hi)
            if side is not None:
                good, bad = (lo, hi) if side == "lo" else (hi, lo)
                detail = (f"{pair}; {why}: the throughput supports {lines(good)} ({accept_range(good)}), so the "
                          f"counter is wrong at {lines(bad)}")
            else:
                detail = (f"{pair}; the throughput cannot tell which group is right without a baseline"
                          + (f" ({why})" if why else "") + ": decide with `specaudit estimate "
                          f"{reading.path} --baseline-tps TPS --cost-factor R` (plain decoding at the same "
                          "concurrency) or a profile from `specaudit calibrate`")
            first = min(lo + hi, key=lambda w: w.line or 0)
            items.append((first, dict(what=f"accept len{where(first)}", detail=detail)))
        items.sort(key=lambda x: x[0].line or 0)
        out = self.emit(reading, items)
        for w in reading.windows:  # specaudit's live gauges: reported vs estimated band
            est, lo, hi = (w.extra.get(k) for k in ("estimated", "estimated_low", "estimated_high"))
            rep = w.extra.get("reported")
            if rep and est and est > 0 and lo and hi:
                if within(rep, lo * (1 - TOLERANCE), hi * (1 + TOLERANCE)) is False:
                    out.append(self.finding(
                        file=reading.path, line=w.line, what=f"reported commit length{where(w)}",
                        detail=f"{fmt(rep)} lies outside the throughput estimate {fmt(est)} "
                               f"[{fmt(lo)}, {fmt(hi)}] (tolerance {TOLERANCE:.0%})"))
        return out


def _compare(reading):
    """Pairs of window sets to compare: by graph mode, else first half vs second half,
    per rank. Yields (label_a, A, label_b, B)."""
    by_rank: dict = {}
    for w in judged_windows(reading):
        if w.accept_len is not None and w.accept_len > 0 and usable(w):
            by_rank.setdefault(w.rank, []).append(w)
    for _rank, ws in by_rank.items():
        modes = {w.cuda_graph for w in ws if w.cuda_graph is not None}
        if len(modes) == 2:
            a = [w for w in ws if w.cuda_graph is False]
            b = [w for w in ws if w.cuda_graph is True]
            if len(a) >= 2 and len(b) >= 2:
                yield "cuda graph False", a, "cuda graph True", b
                continue
        if len(ws) >= 6:
            h = len(ws) // 2
            yield f"lines {ws[0].line}-{ws[h - 1].line}", ws[:h], f"lines {ws[h].line}-{ws[-1].line}", ws[h:]


def _shifts(reading):
    for la, A, lb, B in _compare(reading):
        La, Lb = mean([w.accept_len for w in A]), mean([w.accept_len for w in B])
        if not La or abs(Lb - La) / La <= SHIFT:
            continue
        ca, cb = mean([w.concurrency for w in A]), mean([w.concurrency for w in B])
        sa, sb = mean([w.step_rate for w in A]), mean([w.step_rate for w in B])
        yield la, A, lb, B, La, Lb, ca, cb, sa, sb


class AcceptanceShift(SourceRule):
    """What: acceptance moved by more than 20% between two sets of windows at the same
    concurrency (the CUDA-graph and eager paths, or the first and second half of the
    file), while the throughput moved with it.

    Why: not a counter bug: the counter agrees with the clock, so the acceptance itself
    changed. A CUDA-graph path once silently lowered real acceptance by a third with an
    honest counter; only the throughput-side view (this rule, `specaudit diff`, the
    estimator) shows it. A warning, to be explained.

    Example: `cuda graph: False` lines at accept len 3.30, `cuda graph: True` lines at
    2.20, both at 8 running requests, throughput down by a third on the graph path.
    """

    code = "SA709"
    name = "acceptance-shift"
    severity = "warning"
    message = "acceptance {direction} from {La} ({la}) to {Lb} ({lb}), {pct} at {conc} running requests; {why}"
    fail_fixture = "sglang_cuda_graph_degraded.log"
    pass_fixture = "sglang_clean.log"

    def check(self, reading):
        out = []
        for la, _A, lb, B, La, Lb, ca, cb, sa, sb in _shifts(reading):
            if ca and cb and abs(cb - ca) / max(ca, cb) > CONC_SHIFT:
                continue  # SA710 reports it
            steady = sa and sb and abs(sb - sa) / sa <= 0.15
            why = ("the throughput moved with it (steady step rate): the counter is honest, the acceptance itself "
                   "changed" if steady else "the step rate moved too: compare the two paths' speed before blaming "
                   "the drafter")
            out.append(self.finding(file=reading.path, line=B[0].line, direction="fell" if Lb < La else "rose",
                                    La=fmt(La), la=la, Lb=fmt(Lb), lb=lb, pct=f"{(Lb - La) / La:+.0%}",
                                    conc=f"{ca:g}" if ca else "?", why=why))
        return out


class ConcurrencyConfounder(SourceRule):
    """What: two sets of windows whose acceptance differs also differ in concurrency by more
    than 25%.

    Why: a comparison across concurrency levels is confounded: batch composition, the
    CUDA-graph path and the scheduler all change with it, so the difference is not
    evidence of a metric bug nor of a drafter regression. Compare windows at the same
    concurrency (or rerun at a fixed one).

    Example: accept len 3.20 at 1 running request, then 2.40 at 16.
    """

    code = "SA710"
    name = "concurrency-confounder"
    severity = "warning"
    message = ("acceptance {direction} from {La} ({la}, {ca} running requests) to {Lb} ({lb}, {cb} running "
               "requests): concurrency changed between the compared windows, a confounder, not a bug")
    fail_fixture = "sglang_concurrency_shift.log"
    pass_fixture = "sglang_clean.log"

    def check(self, reading):
        out = []
        for la, _A, lb, B, La, Lb, ca, cb, _sa, _sb in _shifts(reading):
            if ca and cb and abs(cb - ca) / max(ca, cb) > CONC_SHIFT:
                out.append(self.finding(file=reading.path, line=B[0].line, direction="fell" if Lb < La else "rose",
                                        La=fmt(La), la=la, ca=f"{ca:.1f}", Lb=fmt(Lb), lb=lb, cb=f"{cb:.1f}"))
        return out
