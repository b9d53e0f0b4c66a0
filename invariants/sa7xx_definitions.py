"""SA729-SA731: definitions that overstate, proven by the engine's own counts.

Scope "source" (see sa7xx_identities.py). Each rule fires only where the printed counts
prove the overstatement, and says by how much.
"""
from __future__ import annotations

from .sa7xx_common import count, where
from .sa7xx_engines import _ok
from .sa7xx_identities import SourceRule


class V0AcceptedOverstated(SourceRule):
    """What: vLLM V0's "Number of accepted tokens" exceeds what its own "Number of emitted
    tokens" can hold: accepted > emitted - verify steps (verify steps = draft tokens / k);
    or a printed acceptance ratio over another denominator than the drafted tokens (FastDeploy's
    accept_ratio: accepted drafts over emitted tokens, proven by its per-head counts).

    Why: every verify step emits its accepted prefix plus one token, so the accepted prefix
    is emitted - steps. V0's "accepted" also counts draft tokens that matched after the first
    rejection (they were never used), so its acceptance rate overstates the prefix rate by
    the excess; the counts prove by how much.

    Example: `Number of speculative tokens: 3, Number of accepted tokens: 8547, Number of
    draft tokens: 13311, Number of emitted tokens: 10616` (steps 4437: at most 6179 accepted
    in the prefix; 2368 counted after a rejection; rate 0.642 vs prefix rate 0.464).
    FastDeploy: `"accepted_tokens": 128, "rejected_tokens": 112, "accept_ratio": 0.53125,
    "accepted_tokens_per_head": [60, 36, 23, 9]` (0.53125 = 68 accepted drafts / 128 emitted
    tokens; accepted / drafted = 68 / 180 = 0.378).
    """

    code = "SA729"
    name = "accepted-overstated"
    severity = "warning"
    message = "{what}: {detail}"
    fail_fixture = "corpus/rendered/vllm-9539-v0-speculative-metrics.log"
    pass_fixture = "vllm_clean.log"

    def check(self, reading):
        def items():
            for w in self.windows(reading):
                r = w.extra.get("ratio_with_bonus")
                if r is not None and _ok(w.accepted_tokens, w.drafts, w.draft_tokens) and w.draft_tokens > 0:
                    a, st, d = w.accepted_tokens, w.drafts, w.draft_tokens
                    drafts_only = a / d
                    if abs(r - drafts_only) > 1e-4 + 1e-9:
                        forms = (((a + st) / (d + st), "= (accepted drafts {a} + verify steps {s}) / (drafted {d} + "
                                  "verify steps {s}): the target's own token of every step counted as accepted"),
                                 (a / (a + st), "= accepted drafts {a} / emitted tokens {e} (1 - 1 / mean length): the "
                                  "share of the output that came from drafts, not a rate over what was drafted"))
                        how = next((h for v, h in forms if abs(r - v) <= 1e-4),
                                   "fits neither accepted / drafted nor a known variant")
                        yield w, dict(what=f"printed acceptance ratio{where(w)}",
                                      detail=f"{r:.4g} "
                                             + how.format(a=count(a), s=count(st), d=count(d), e=count(a + st))
                                             + f"; accepted drafts / drafted = {drafts_only:.4f} "
                                             f"(overstated by {r - drafts_only:+.4f})")
                    continue
                e = w.extra.get("emitted")
                if e is None or not _ok(w.accepted_tokens, w.drafts, w.draft_tokens) or not w.draft_tokens:
                    continue
                prefix = e - w.drafts
                excess = w.accepted_tokens - prefix
                if excess > 0.5 + 1e-9 * e:
                    yield w, dict(what=f"V0 accepted tokens{where(w)}",
                                  detail=f"{count(w.accepted_tokens)} > emitted {count(e)} - verify steps "
                                         f"{count(w.drafts)} = {count(prefix)}: {count(excess)} draft tokens counted "
                                         "as accepted after a rejection (never emitted); acceptance rate "
                                         f"{w.accepted_tokens / w.draft_tokens:.3f} as printed vs "
                                         f"{max(prefix, 0) / w.draft_tokens:.3f} for the accepted prefix")
        return self.emit(reading, items())


def _seconds(ts: str | None):
    """'MM-DD HH:MM:SS' (vLLM) -> seconds within a year-less calendar, or None."""
    if not ts or len(ts) < 14 or ts[2] != "-" or ts[5] != " ":
        return None
    try:
        mo, d = int(ts[:2]), int(ts[3:5])
        h, mi, s = (int(x) for x in ts[6:14].split(":"))
    except ValueError:
        return None
    return ((mo * 31 + d) * 24 + h) * 3600 + mi * 60 + s


class ThroughputWindow(SourceRule):
    """What: a vLLM SpecDecoding line whose accepted and drafted throughputs imply another
    window than the line's own: Accepted / Accepted throughput, Drafted / Drafted throughput
    and the time since the previous line of the same engine must all be one interval.

    Why: vLLM divides the interval's counts by the time since its last log line. Two
    throughputs over different windows (or over a window longer than the interval the
    counts cover) compare tokens/s that do not belong together; a dashboard built on them
    overstates or understates the speed.

    Example: `Accepted throughput: 61.90 tokens/s, Drafted throughput: 56.70 tokens/s,
    Accepted: 619 tokens, Drafted: 1134 tokens` (10.0 s vs 20.0 s).
    """

    code = "SA730"
    name = "throughput-window"
    severity = "warning"
    message = "{what}: {detail}"
    fail_fixture = "vllm_throughput_window.log"
    pass_fixture = "corpus/rendered/vllm-ascend-13640-dspark-k7-second-window.log"

    def check(self, reading):
        def items():
            prev: dict = {}
            for w in self.windows(reading):
                at, dt = w.extra.get("acc_tps"), w.extra.get("dr_tps")
                t = _seconds(w.time)
                last = prev.get(w.rank)
                prev[w.rank] = t
                wins = []
                if at and at > 0 and _ok(w.accepted_tokens) and w.accepted_tokens > 0:
                    wins.append(("accepted", w.accepted_tokens / at, 0.005 / at))
                if dt and dt > 0 and _ok(w.draft_tokens) and w.draft_tokens > 0:
                    wins.append(("drafted", w.draft_tokens / dt, 0.005 / dt))
                if len(wins) == 2:
                    (_, a, ra), (_, d, rd) = wins
                    if abs(a - d) > a * ra + d * rd + 0.01 * max(a, d) + 0.05:
                        yield w, dict(what=f"SpecDecoding throughputs{where(w)}",
                                      detail=f"Accepted {count(w.accepted_tokens)} / {at:.2f} tokens/s = {a:.1f} s "
                                             f"but Drafted {count(w.draft_tokens)} / {dt:.2f} tokens/s = {d:.1f} s: "
                                             "the two rates are over different windows")
                        continue
                if wins and t is not None and last is not None and t - last >= 2:
                    span = t - last
                    name, win, rel = wins[0]
                    if abs(win - span) > 1.5 + win * rel + 0.1 * span:
                        yield w, dict(what=f"SpecDecoding throughput{where(w)}",
                                      detail=f"{name} count / its throughput = {win:.1f} s, but the line comes "
                                             f"{span:.0f} s after the previous one: the rate is over another window "
                                             "than the counts of this interval")
        return self.emit(reading, items())


class AcceptedNotEmitted(SourceRule):
    """What: more accepted draft tokens than the output can hold: output tokens < verify
    steps + accepted drafts (vLLM's spec_decode.py summary, a vLLM scrape's
    generation_tokens_total beside its spec-decoding counters).

    Why: each verify step emits its accepted drafts plus one token, and every request adds
    its first token from prefill, so output tokens >= steps + accepted. Fewer output tokens
    mean accepted drafts were counted that were never emitted: drafts accepted after an EOS
    inside the accepted prefix (vLLM issue 56101, fixed by PR 56137), or after a stop.

    Example: `total_num_output_tokens: 9000, num_drafts: 3925, num_accepted_tokens: 7110`
    (3925 + 7110 = 11035 > 9000).
    """

    code = "SA731"
    name = "accepted-not-emitted"
    severity = "warning"
    message = "{what}: {detail}"
    fail_fixture = "vllm_spec_decode_example_not_emitted.txt"
    pass_fixture = "vllm_spec_decode_example.txt"

    def check(self, reading):
        def items():
            for w in self.windows(reading):
                out = w.extra.get("output_tokens")
                if out is None or not _ok(w.drafts, w.accepted_tokens) or w.extra.get("drafts_derived"):
                    continue
                need = w.drafts + w.accepted_tokens
                if out + 0.5 < need:
                    yield w, dict(what=f"output tokens{where(w)}",
                                  detail=f"{count(out)} < verify steps {count(w.drafts)} + accepted "
                                         f"{count(w.accepted_tokens)} = {count(need)}: at least "
                                         f"{count(need - out)} accepted drafts were never emitted (counted past an "
                                         "EOS or stop: vLLM 56101)")
        return self.emit(reading, items())


class RateFitsNoDraftLength(SourceRule):
    """What: TokenSpeed's `accept_rate` and `avg_accept_len` fit no draft length shared by
    the log's lines: accept_rate = (avg_accept_len - 1) / k for one whole k.

    Why: the rate is defined from the printed length and the configured spec_num_steps, so
    every line of one server fits the same k within two printed decimals. A line that fits
    none divides by something else: a draft slot counted per verify step that was never a
    draft (TokenSpeed PR 1443), or a rate and a length from different populations.

    Example: `avg_accept_len: 3.40, accept_rate: 0.80` beside lines that fit k = 3
    ((3.40 - 1) / 3 = 0.80 fits; `avg_accept_len: 3.40, accept_rate: 0.60` fits k = 4 only).
    """

    code = "SA732"
    name = "rate-fits-no-draft-length"
    severity = "warning"
    message = "{what}: {detail}"
    fail_fixture = "tokenspeed_rate_two_k.log"
    pass_fixture = "tokenspeed_clean.log"

    def check(self, reading):
        from specaudit.audit.sources.tokenspeed import fits
        ws = [w for w in self.windows(reading) if w.engine == "tokenspeed" and _ok(w.accept_rate, w.accept_len)
              and w.accept_rate > 0.05]
        if not ws or reading.config.get("num_spec_tokens"):
            return []
        best = max(range(1, 65), key=lambda k: (sum(fits(w, k) for w in ws), -k))
        n = sum(fits(w, best) for w in ws)

        def items():
            for w in ws:
                if not fits(w, best):
                    yield w, dict(what=f"accept_rate{where(w)}",
                                  detail=f"{w.accept_rate:.2f} with avg_accept_len {w.accept_len:.2f}: "
                                         f"(avg_accept_len - 1) / k fits no draft length shared with the other lines "
                                         f"(k = {best} fits {n} of {len(ws)}; here (L - 1) / {best} = "
                                         f"{(w.accept_len - 1) / best:.2f}): a slot counted per verify step that is "
                                         "no draft (TokenSpeed PR 1443) or figures from different populations")
        return self.emit(reading, items())
