"""SA708-SA710: an engine's accept length against its own throughput.

The estimator's model (specaudit/estimate.py): per request, tps = C / t_step(c, N), so a
window's verify steps per second per request, gen_tps / (c * accept_len), depends only on
the step cost at that concurrency. Honest counters keep that step rate steady across
windows of one configuration; a counter that jumps without the throughput following moves
it. With specaudit's own gauges the live estimate is exported beside the reported figure,
and the two are compared directly.
"""
from __future__ import annotations

import math

from .sa7xx_common import fmt, mean, median, usable, where
from .sa7xx_identities import SourceRule

STEP_RATE_FACTOR = 1.5   # a window whose step rate is off the group's median by more than this
SHIFT = 0.20             # acceptance moving by more than 20% between compared windows
CONC_SHIFT = 0.25        # concurrency moving by more than 25% confounds the comparison
TOLERANCE = 0.1          # the estimator's default verdict tolerance


def _bucket(c):
    """Half-octave bucket of a concurrency: 8 and 9 share one, 4 and 8 do not."""
    return None if not c or c <= 0 else round(2 * math.log2(c))


def groups(reading):
    """(rank, concurrency bucket, graph mode) -> windows with a step rate, in file order."""
    g: dict = {}
    for w in reading.windows:
        if w.step_rate is None or not usable(w):
            continue
        g.setdefault((w.rank, _bucket(w.concurrency), w.cuda_graph), []).append(w)
    return g


class AcceptLenVsThroughput(SourceRule):
    """What: the accept length agrees with the throughput: at one concurrency the implied
    verify steps per second per request, gen throughput / (running requests * accept
    len), stays steady; and specaudit's reported commit length lies inside the band of
    its throughput estimate.

    Why: throughput is measured by the clock, not by the counter under audit. If the
    counter doubles while tokens/s stay put, the counter is wrong (see `specaudit
    estimate` for the same test against a plain-decoding baseline).

    Example: `accept len: 4.00` with 410 token/s at 8 requests, where earlier lines read
    `accept len: 2.00` with 405 token/s at 8 requests.
    """

    code = "SA708"
    name = "accept-len-vs-throughput"
    message = "{what}: {detail}"
    fail_fixture = "sglang_counter_vs_throughput.log"
    pass_fixture = "sglang_clean.log"

    def check(self, reading):
        items = []
        for (rank, _, graph), ws in groups(reading).items():
            if len(ws) < 4:
                continue
            med = median([w.step_rate for w in ws])
            for w in ws:
                ratio = w.step_rate / med
                if ratio > STEP_RATE_FACTOR or ratio < 1 / STEP_RATE_FACTOR:
                    implied = w.gen_tps / (w.concurrency * med)
                    items.append((w, dict(
                        what=f"accept len{where(w)}",
                        detail=f"{fmt(w.accept_len)} at {fmt(w.gen_tps)} tokens/s and {w.concurrency:g} running "
                               f"requests, but the throughput implies {fmt(implied)} tokens per step (the median "
                               f"step rate of the {len(ws)} windows at this concurrency"
                               f"{'' if graph is None else ', cuda graph ' + str(graph)} is {med:.2f} steps/s per "
                               "request): the counter moved without the throughput")))
        items.sort(key=lambda x: x[0].line or 0)
        out = self.emit(reading, items)
        for w in reading.windows:  # specaudit's live gauges: reported vs estimated band
            est, lo, hi = (w.extra.get(k) for k in ("estimated", "estimated_low", "estimated_high"))
            rep = w.extra.get("reported")
            if rep and est and est > 0 and lo and hi:
                if not (lo * (1 - TOLERANCE) <= rep <= hi * (1 + TOLERANCE)):
                    out.append(self.finding(
                        file=reading.path, line=w.line, what=f"reported commit length{where(w)}",
                        detail=f"{fmt(rep)} lies outside the throughput estimate {fmt(est)} "
                               f"[{fmt(lo)}, {fmt(hi)}] (tolerance {TOLERANCE:.0%})"))
        return out


def _compare(reading):
    """Pairs of window sets to compare: by graph mode, else first half vs second half,
    per rank. Yields (label_a, A, label_b, B)."""
    by_rank: dict = {}
    for w in reading.windows:
        if w.accept_len is not None and w.accept_len > 0 and usable(w):
            by_rank.setdefault(w.rank, []).append(w)
    for rank, ws in by_rank.items():
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
        for la, A, lb, B, La, Lb, ca, cb, sa, sb in _shifts(reading):
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
        for la, A, lb, B, La, Lb, ca, cb, sa, sb in _shifts(reading):
            if ca and cb and abs(cb - ca) / max(ca, cb) > CONC_SHIFT:
                out.append(self.finding(file=reading.path, line=B[0].line, direction="fell" if Lb < La else "rose",
                                        La=fmt(La), la=la, ca=f"{ca:.1f}", Lb=fmt(Lb), lb=lb, cb=f"{cb:.1f}"))
        return out
