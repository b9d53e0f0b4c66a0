"""SA700-SA707, SA711: identities that hold in an engine's own log lines and counters.

Scope "source": check(reading) gets a specaudit.audit.sources.Reading (see that package for the
vocabulary: accept_len, accept_rate, drafts, draft_tokens, accepted_tokens, per_pos).
Each rule names one bug class of shared/spec/metric-bug-classes.md; the fixtures under
tests/fixtures/engines/ show one log or scrape per class (`fail_fixture`) and the clean
files they must stay quiet on (`pass_fixture`).
"""
from __future__ import annotations

from .base import FileRule
from .sa7xx_common import LEN_TOL, PCT_TOL, RATE_TOL, count, fmt, mean, pos_tol, usable, where

MAX_PER_RULE = 10  # findings listed per rule and file; the rest are summarised in one more


class SourceRule(FileRule):
    """Base of the SA7xx rules: iterate windows, cap the findings per file."""

    fail_fixture: str = ""
    pass_fixture: str = ""

    def emit(self, reading, items):
        """items: iterable of (window, values) -> Findings, at most MAX_PER_RULE, plus a summary."""
        out, extra, first_extra = [], 0, None
        for w, values in items:
            if len(out) < MAX_PER_RULE:
                out.append(self.finding(file=reading.path, line=w.line, **values))
            else:
                extra += 1
                first_extra = first_extra or w.line
        if extra:
            f = self.finding(file=reading.path, line=first_extra, **values)
            f.message = f"{extra} more windows break {self.code} ({self.name}); first at line {first_extra}"
            out.append(f)
        return out

    def windows(self, reading):
        if hasattr(reading, "usable_windows"):  # sources.Reading: computed once for all rules
            return reading.usable_windows()
        return [w for w in reading.windows if usable(w)]


class UnreadableLine(SourceRule):
    """What: a line that looks like a spec-decoding log line or a metric but cannot be read
    (cut off, a field missing, a value that is not a number), or a counter that went
    down between two scrapes (a restart).

    Why: a reader that silently skips such lines reports figures over a different window
    than the engine did; a reset counter makes interval deltas negative.

    Example: `Decode batch, #running-req: 8, #token: 9120, token usage: 0.04, accept le`
    """

    code = "SA700"
    name = "unreadable-line"
    severity = "warning"
    message = "{reason}: {text}"
    fail_fixture = "sglang_truncated.log"
    pass_fixture = "sglang_clean.log"

    def check(self, reading):
        out = [self.finding(file=n["file"], line=n["line"], reason=n["reason"],
                            text=(n["text"][:100] + "...") if len(n["text"]) > 100 else n["text"])
               for n in reading.notes]
        for w in reading.windows:
            if w.extra.get("counter_reset"):
                out.append(self.finding(file=reading.path, line=w.line,
                                        reason=f"a counter went down since the previous scrape{where(w)}: the "
                                               "server restarted (this interval is skipped)", text=w.text))
        return out


class AcceptRateAboveOne(SourceRule):
    """What: an acceptance rate (overall or per position) is above 1.

    Why: a rate is accepted drafts over drafted tokens; above 1 means the numerator counts
    something that was never drafted, usually the bonus token counted as an accepted draft,
    or counters read without a lock while they move (vllm-mlx PR 473: transient rates > 1).

    Example: `Avg Draft acceptance rate: 114.3%`, or SGLang `accept rate: 1.12`.
    """

    code = "SA701"
    name = "accept-rate-above-one"
    message = "{what} = {value}, above 1: an acceptance rate cannot exceed 1 (is the bonus token counted as a draft?)"
    fail_fixture = "vllm_rate_above_one.log"
    pass_fixture = "vllm_clean.log"

    def check(self, reading):
        def items():
            for w in self.windows(reading):
                if w.printed_rate_pct is not None and w.printed_rate_pct > 100 + PCT_TOL:
                    yield w, dict(what=f"Avg Draft acceptance rate{where(w)}", value=f"{w.printed_rate_pct:.1f}%")
                elif w.printed_rate_pct is None and w.accept_rate is not None and w.accept_rate > 1 + RATE_TOL:
                    yield w, dict(what=f"accept rate{where(w)}", value=fmt(w.accept_rate))
                for i, r in enumerate(w.per_pos or []):
                    if r > 1 + pos_tol(w):
                        yield w, dict(what=f"per-position acceptance rate at position {i}{where(w)}", value=fmt(r, 3))
                        break
        return self.emit(reading, items())


class AcceptedExceedsDrafted(SourceRule):
    """What: more draft tokens accepted than drafted, or a position accepted more often than
    there were drafts.

    Why: every accepted draft token was drafted first; accepted > drafted is the counter
    form of a rate above one. A replayed correction token counted as an accepted draft on
    a checkpoint restore (llama.cpp PR 26320) pushes accepted past drafted once restores pile up.

    Example: `Accepted: 1203 tokens, Drafted: 1050 tokens`.
    """

    code = "SA702"
    name = "accepted-exceeds-drafted"
    message = "{what}: accepted {accepted} > drafted {drafted}"
    fail_fixture = "vllm_accepted_over_drafted.prom"
    pass_fixture = "vllm_clean.prom"

    def check(self, reading):
        def items():
            for w in self.windows(reading):
                if w.accepted_tokens is not None and w.draft_tokens is not None \
                        and w.accepted_tokens > w.draft_tokens and w.accepted_tokens >= 0:
                    yield w, dict(what=f"accepted draft tokens{where(w)}", accepted=count(w.accepted_tokens),
                                  drafted=count(w.draft_tokens))
                elif w.per_pos_counts and w.per_pos_drafted:
                    for i, (c, d) in enumerate(zip(w.per_pos_counts, w.per_pos_drafted)):
                        if c > d + 0.5:
                            yield w, dict(what=f"position {i}{where(w)} (accepted vs drafted at that position)",
                                          accepted=count(c), drafted=count(d))
                            break
                elif w.per_pos_counts and w.drafts is not None:
                    for i, c in enumerate(w.per_pos_counts):
                        if c > w.drafts:
                            yield w, dict(what=f"position {i}{where(w)} (accepted per position vs drafts)",
                                          accepted=count(c), drafted=count(w.drafts))
                            break
        return self.emit(reading, items())


class AcceptRateRecomputed(SourceRule):
    """What: the reported acceptance rate differs from the rate recomputed from the same
    window's counts: accepted drafts / drafted tokens.

    Why: the known bias puts the bonus token in the numerator and the root in the
    denominator, rate = (accepted + steps) / (steps * verify nodes): biased upward at every
    value (0.25 when nothing is ever accepted on a 4-node draft). SGLang's log computes
    `accept rate` as accept len / speculative_num_draft_tokens. With the draft shape known
    (SGLang's server_args line) the rate is recomputed as (accept len - 1) / (nodes - 1);
    without it, a ratio accept len / accept rate that stays one integer over many lines
    gives the same bias away.

    Example: speculative_num_draft_tokens=4, `accept len: 2.40, accept rate: 0.60`
    (the drafts' rate is 1.40 / 3 = 0.47).
    """

    code = "SA703"
    name = "accept-rate-recomputed"
    message = "{what}: reported {reported}, recomputed {recomputed} from {how}{hint}"
    fail_fixture = "sglang_rate_bonus_root.log"
    pass_fixture = "sglang_clean.log"

    def check(self, reading):
        ws = self.windows(reading)
        D = reading.config.get("num_draft_tokens")
        biased_hint = ("; the reported figure equals accept len / verify nodes: the bonus token is in the "
                       "numerator and the root in the denominator")

        ws = [w for w in ws if not _own_bonus_formula(reading, w)]

        def items():
            for w in ws:
                if w.printed_rate_pct is not None and w.draft_tokens and w.draft_tokens > 0 \
                        and w.accepted_tokens is not None and w.printed_rate_pct <= 100 + PCT_TOL:
                    rec = 100.0 * w.accepted_tokens / w.draft_tokens
                    if abs(rec - w.printed_rate_pct) > PCT_TOL + 1e-9:
                        hint = ""
                        if w.drafts and abs(100.0 * (w.accepted_tokens + w.drafts) / w.draft_tokens
                                            - w.printed_rate_pct) <= 0.2:
                            hint = "; it equals (accepted + drafts) / drafted: the bonus token is in the numerator"
                        yield w, dict(what=f"Avg Draft acceptance rate{where(w)}",
                                      reported=f"{w.printed_rate_pct:.1f}%",
                                      recomputed=f"{rec:.1f}%",
                                      how=f"Accepted {count(w.accepted_tokens)} / Drafted {count(w.draft_tokens)}",
                                      hint=hint)
                elif (reading.engine == "sglang" and D and D >= 2 and w.accept_rate is not None
                      and w.accept_len is not None and w.accept_len >= 1):
                    rec = (w.accept_len - 1) / (D - 1)
                    tol = RATE_TOL + LEN_TOL / (D - 1) + 1e-9
                    if abs(w.accept_rate - rec) > tol:
                        hint = biased_hint if abs(w.accept_rate - w.accept_len / D) <= RATE_TOL + LEN_TOL / D + 1e-9 \
                            else ""
                        if hint and w.extra.get("era") == "drafts":
                            hint += (" (this SGLang version, after PR 23530, defines accept rate as drafts only: the "
                                     "bonus formula here is a bug)")
                        yield w, dict(what=f"accept rate{where(w)}", reported=fmt(w.accept_rate), recomputed=fmt(rec),
                                      how=f"(accept len {fmt(w.accept_len)} - 1) / ({D} verify nodes - 1)", hint=hint)

        out = self.emit(reading, items())
        if out or D or reading.engine != "sglang":
            return out
        # no draft shape: look for accept len / accept rate = one integer over many windows
        pts = [(w, w.accept_len / w.accept_rate) for w in ws
               if w.accept_rate and w.accept_rate > 0.02 and w.accept_len and w.accept_len > 1.05]
        if len(pts) < 3:
            return out
        lens = [w.accept_len for w, _ in pts]
        if max(lens) - min(lens) < 0.2:
            return out  # accept len barely moves: both readings fit
        q = sorted(x for _, x in pts)[len(pts) // 2]
        k = round(q)
        if k >= 2 and all(abs(x - k) <= 0.03 * k + 0.1 for _, x in pts):
            w0 = pts[0][0]
            rec = (w0.accept_len - 1) / (k - 1)
            out.append(self.finding(
                file=reading.path, line=w0.line, what=f"accept rate on {len(pts)} lines",
                reported=fmt(w0.accept_rate), recomputed=fmt(rec),
                how=f"(accept len {fmt(w0.accept_len)} - 1) / ({k} - 1) at line {w0.line}, with accept len / accept "
                    f"rate = {k} on every line",
                hint=biased_hint))
        return out


class AcceptLengthBonus(SourceRule):
    """What: an acceptance length that leaves the bonus token out where the engine's
    convention counts it, or two figures of one window that differ by exactly one.

    Why: the committed tokens per step are the accepted drafts plus the bonus, so a
    length that counts the bonus is at least 1. One component reporting with the bonus
    and another without it gives figures exactly one apart.

    Example: vLLM `Mean acceptance length: 1.73` next to per-position rates summing to 1.73
    (1 + 1.73 = 2.73 expected); SGLang `accept len: 0.82`.
    """

    code = "SA704"
    name = "accept-length-bonus"
    message = "{what}: {detail}"
    fail_fixture = "vllm_bonus_off_by_one.log"
    pass_fixture = "vllm_clean.log"

    def check(self, reading):
        def items():
            for w in self.windows(reading):
                L = w.accept_len
                if L is None:
                    continue
                if w.per_pos and _unconditional(w):
                    s = sum(w.per_pos)
                    tol = LEN_TOL + len(w.per_pos) * pos_tol(w) + 1e-9
                    if abs(L - (1 + s)) > tol and abs(L - s) <= tol and s > 0:
                        yield w, dict(what=f"Mean acceptance length{where(w)}",
                                      detail=f"{fmt(L)} equals the sum of the per-position rates ({fmt(s, 3)}); "
                                             f"with the bonus token it is 1 + {fmt(s, 3)} = {fmt(1 + s, 3)}: "
                                             "one figure "
                                             "counts the bonus token, the other does not")
                        continue
                rep = w.extra.get("reported_commit_len")
                if rep is not None and w.drafts and w.accepted_tokens is not None:
                    derived = 1 + w.accepted_tokens / w.drafts
                    if abs(rep - (derived - 1)) <= 0.02 and abs(rep - derived) > 0.5:
                        yield w, dict(what=f"reported commit length{where(w)}",
                                      detail=f"{fmt(rep)} = accepted / steps ({count(w.accepted_tokens)} / "
                                             f"{count(w.drafts)}); with the bonus token it is {fmt(derived)}")
                        continue
                if reading.includes_bonus and 0 < L < 1 - LEN_TOL and (w.gen_tps is None or w.gen_tps > 0):
                    yield w, dict(what=f"accept len{where(w)}",
                                  detail=f"{fmt(L)} is below 1, but a length that counts the bonus token is at least "
                                         "1 per step: the figure leaves the bonus out")
        return self.emit(reading, items())


class AcceptLengthIdentity(SourceRule):
    """What: mean acceptance length = 1 + accepted / drafts = 1 + the sum of the
    per-position acceptance rates, never above 1 + the draft length; the per-position
    counters add up to the accepted tokens; reported counters equal derived ones.

    Why: the three figures count the same tokens three ways. A gap means one of them read
    the wrong variable: the seed case reported an accepted depth of 7.00 on a chain whose
    commit length was 2.00.

    Example: `Mean acceptance length: 2.00` with per-position rates 1.000 x 7 (1 + 7 = 8).
    """

    code = "SA705"
    name = "accept-length-identity"
    message = "{what}: {detail}"
    fail_fixture = "vllm_depth_commit_split.log"
    pass_fixture = "vllm_clean.log"

    def check(self, reading):
        cfg = reading.config
        max_len = cfg.get("max_accept_len")
        if max_len is None and cfg.get("num_spec_tokens"):
            max_len = cfg["num_spec_tokens"] + 1

        def items():
            for w in self.windows(reading):
                L = w.accept_len
                wmax = max_len if max_len else ((w.k + 1) if w.k else None)
                if L is not None and wmax and L > wmax + LEN_TOL:
                    yield w, dict(what=f"accept length{where(w)}",
                                  detail=f"{fmt(L)} exceeds the most a step can commit, {wmax} ({wmax - 1} "
                                         "drafts + the bonus): the counter reads something else (depth and commit "
                                         "split)")
                    continue
                if L is not None and w.per_pos and _unconditional(w):
                    s = sum(w.per_pos)
                    tol = LEN_TOL + len(w.per_pos) * pos_tol(w) + 1e-9
                    gap = L - (1 + s)
                    if abs(gap) > tol and abs(L - s) > tol and not _rank_multiple(L - 1, s, tol):
                        yield w, dict(what=f"Mean acceptance length{where(w)}",
                                      detail=f"{fmt(L)}, but 1 + the sum of the per-position rates = {fmt(1 + s, 3)}")
                        continue
                if w.per_pos_counts is not None and w.accepted_tokens is not None:
                    s = sum(w.per_pos_counts)
                    exact = reading.engine == "vllm"
                    bad = (abs(s - w.accepted_tokens) > 0.5) if exact else (s > w.accepted_tokens + 0.5)
                    if bad and not _rank_multiple(w.accepted_tokens, s, 0.5):
                        yield w, dict(what=f"accepted tokens per position{where(w)}",
                                      detail=f"sum to {count(s)}, but accepted tokens = {count(w.accepted_tokens)}")
                        continue
                for rep, der, label in (("committed", "derived_committed", "committed tokens"),
                                        ("accepted_tokens", "derived_accepted", "accepted tokens")):
                    a = w.extra.get(rep) if rep != "accepted_tokens" else w.accepted_tokens
                    b = w.extra.get(der)
                    if a is not None and b is not None and abs(a - b) > 0.5:
                        yield w, dict(what=f"{label}{where(w)}",
                                      detail=f"reported {count(a)}, derived from the recorded tokens {count(b)}")
                        break
        return self.emit(reading, items())


def _own_bonus_formula(reading, w) -> bool:
    """An SGLang accept rate that fits the bonus-counting formula of the version that printed
    it (PR 11572 .. PR 23530, or an undated line whose version cannot be told): SA720 names
    the convention; it is not reported here as a bug."""
    return (reading.engine == "sglang" and w.extra.get("rate_formula") in ("bonus", "both")
            and w.extra.get("era") in ("bonus", "either", None))


def _unconditional(w) -> bool:
    """Per-position rates over all verify steps (sum = mean length - 1), not TensorRT-LLM's
    rates over drafts that reached the position."""
    return w.per_pos_kind in (None, "verify_steps")


def _rank_multiple(whole, part, tol) -> int:
    """R >= 2 when whole = R * part (a per-rank figure divided by the rank count), else 0."""
    if part is None or whole is None or part <= 0 or whole <= 0:
        return 0
    q = whole / part
    R = round(q)
    if R >= 2 and abs(whole - R * part) <= max(tol * R, 0.02 * whole):
        return R
    return 0


class NegativeCounter(SourceRule):
    """What: a negative count or length, or an accept length of 0 while tokens are
    generated.

    Why: a step that generated nothing once reported -1 accepted tokens and crashed the
    counter; every step commits at least one token, so an interval that generated tokens
    cannot have committed 0 per step. A live accept length that reads 0 until requests
    finish (its numerator from finished requests, its denominator from live verifies: sfllm
    PR 33) is this case.

    Example: `Accepted: -3 tokens`, or `accept len: 0.00, ... gen throughput (token/s): 410.22`.
    """

    code = "SA706"
    name = "negative-counter"
    message = "{what}: {detail}"
    fail_fixture = "vllm_negative_counter.log"
    pass_fixture = "vllm_clean.log"

    def check(self, reading):
        def items():
            for w in self.windows(reading):
                for label, v in (("accepted tokens", w.accepted_tokens), ("drafted tokens", w.draft_tokens),
                                 ("drafts", w.drafts), ("accept length", w.accept_len),
                                 ("accept rate", w.accept_rate)):
                    if v is not None and v < 0:
                        shown = count(v) if label != 'accept length' else fmt(v)
                        yield w, dict(what=f"{label}{where(w)}", detail=f"{shown}"
                                                                        " is negative: a step that committed nothing "
                                                                        "was counted as -1")
                        break
                else:
                    neg = [i for i, c in enumerate(w.per_pos_counts or w.per_pos or []) if c < 0]
                    if neg:
                        yield w, dict(what=f"position {neg[0]}{where(w)}", detail="negative acceptance count")
                    elif (w.accept_len is not None and abs(w.accept_len) <= LEN_TOL and w.gen_tps and w.gen_tps > 0
                          and (w.concurrency is None or w.concurrency > 0)):
                        yield w, dict(what=f"accept len{where(w)}",
                                      detail=f"0.00 while generating {fmt(w.gen_tps)} tokens/s: every step commits at "
                                             "least one token (an empty commit counted as zero or less)")
        return self.emit(reading, items())


class RankPartial(SourceRule):
    """What: a figure that covers one rank (or is divided by the rank count) where the whole
    is meant: per-position rates that sum to 1/R of (mean acceptance length - 1), counters
    exported for some ranks only, or an unlabelled series equal to one rank's value.

    Why: with data parallelism a benchmark read one rank's accept length, and per-position
    acceptance came out divided by the rank count. Aggregates over all ranks must equal
    the reported figure, and mean length = 1 + the sum over positions.

    Example: DP=2, `Mean acceptance length: 2.80`, per-position rates 0.450, 0.300, 0.150.
    """

    code = "SA707"
    name = "rank-partial"
    message = "{what}: {detail}"
    fail_fixture = "vllm_per_pos_divided.log"
    pass_fixture = "vllm_clean.log"

    def check(self, reading):
        def items():
            for w in self.windows(reading):
                L = w.accept_len
                if L is not None and w.per_pos and _unconditional(w):
                    s = sum(w.per_pos)
                    tol = LEN_TOL + len(w.per_pos) * pos_tol(w) + 1e-9
                    R = _rank_multiple(L - 1, s, tol)
                    if R and abs(L - (1 + s)) > tol:
                        yield w, dict(what=f"per-position acceptance{where(w)}",
                                      detail=f"rates sum to {fmt(s, 3)} = 1/{R} of mean acceptance length - 1 "
                                             f"({fmt(L - 1)}): divided by a rank count of {R}?")
                        continue
                if w.per_pos_counts is not None and w.accepted_tokens:
                    s = sum(w.per_pos_counts)
                    R = _rank_multiple(w.accepted_tokens, s, 0.5)
                    if R:
                        yield w, dict(what=f"accepted tokens per position{where(w)}",
                                      detail=f"sum to {count(s)} = 1/{R} of the accepted tokens "
                                             f"({count(w.accepted_tokens)}):"
                                             f" divided by a rank count of {R}?")
        out = self.emit(reading, items())
        if reading.source == "prom-text" and reading.series:
            ranked = {r: d for r, d in reading.series.items() if r is not None}
            if reading.engine in ("vllm", "specaudit") and len(ranked) >= 2:
                with_pos = [r for r, d in ranked.items() if d.get("per_pos")]
                with_drafts = [r for r, d in ranked.items() if d.get("drafts")]
                if with_pos and len(with_pos) < len(with_drafts):
                    d0 = ranked[with_drafts[0]]
                    out.append(self.finding(
                        file=reading.path, line=d0["_line"], what="per-position counters",
                        detail=f"exported for {len(with_pos)} of {len(with_drafts)} ranks ({', '.join(with_pos)}): "
                               "a per-position rate over all drafts is then divided by the rank count"))
            if reading.engine == "sglang" and None in reading.series and len(ranked) >= 2:
                whole = reading.series[None].get("accept_len")
                vals = {r: d["accept_len"] for r, d in ranked.items() if "accept_len" in d}
                wts = {r: ranked[r].get("running") or 1.0 for r in vals}
                pooled = sum(vals[r] * wts[r] for r in vals) / sum(wts.values()) if vals else None
                same = [r for r, v in vals.items() if whole is not None and abs(v - whole) <= LEN_TOL]
                if pooled and whole is not None and same and abs(whole - pooled) / pooled > 0.05:
                    out.append(self.finding(
                        file=reading.path, line=reading.series[None]["_line"], what="unlabelled accept length",
                        detail=f"{fmt(whole)} equals {same[0]}'s value, but over all {len(vals)} ranks (weighted by "
                               f"running requests) it is {fmt(pooled)}: one rank read as the whole"))
        return out


class RankSpread(SourceRule):
    """What: the ranks of one server report accept lengths that differ by more than 10%.

    Why: a benchmark or dashboard that reads one rank's figure (rank 0, the first line it
    finds) misreads the whole; the pooled figure is the one to compare with throughput.
    A warning: ranks may legitimately serve different traffic.

    Example: `DP0 ... accept len: 3.40` and `DP1 ... accept len: 2.10` in one log.
    """

    code = "SA711"
    name = "rank-spread"
    severity = "warning"
    message = "{what}: {detail}"
    fail_fixture = "sglang_dp_ranks.log"
    pass_fixture = "sglang_clean.log"

    def check(self, reading):
        by: dict = {}
        for w in self.windows(reading):
            if w.rank is not None and w.accept_len is not None:
                by.setdefault(w.rank.split(" TP")[0], []).append(w)
        if len(by) < 2:
            return []
        per = {r: mean([w.accept_len for w in ws]) for r, ws in by.items()}
        wt = {r: sum((w.concurrency or 1.0) for w in ws) for r, ws in by.items()}
        pooled = sum(per[r] * wt[r] for r in per) / sum(wt.values())
        worst = max(per, key=lambda r: abs(per[r] - pooled))
        dev = abs(per[worst] - pooled) / pooled
        if dev <= 0.10:
            return []
        first = min((w for ws in by.values() for w in ws), key=lambda w: w.line or 0)
        lo, hi = min(per.values()), max(per.values())
        return [self.finding(file=reading.path, line=first.line, what=f"{len(per)} ranks",
                             detail=f"report mean accept len {fmt(lo)}..{fmt(hi)}; pooled over ranks (weighted by "
                                    f"running requests) {fmt(pooled)}; reading {worst} alone is off by {dev:.0%}")]
