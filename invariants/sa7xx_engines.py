"""SA720-SA727: identities of real engines' own output that hold without traces.

Scope "source": check(reading) gets a specaudit.audit.sources.Reading in the one
vocabulary (drafts = verify steps, draft_tokens, accepted_tokens with the bonus excluded,
per_pos with per_pos_kind, histogram, k, kind, conventions). Each rule's fixtures are
rendered from the corpus of real engine output (tests/fixtures/engines/corpus/): the
`fail_fixture` is a real broken excerpt, the `pass_fixture` a real clean one.

Tolerances follow the printed precision of each figure (half a unit of its last digit),
so a healthy engine's rounding never trips a rule.
"""
from __future__ import annotations

from .sa7xx_common import LEN_TOL, count, fmt, pos_tol, where
from .sa7xx_identities import SourceRule

COLLAPSE_RATE = 0.02      # accepted / drafted below this while drafting continues: a collapse
COLLAPSE_MIN_DRAFTED = 50  # ... over at least this many drafted tokens (or 20 verify steps)


def _ok(*xs) -> bool:
    return all(x is not None for x in xs)


class EngineConvention(SourceRule):
    """What: a printed figure follows the definition that this engine version really used,
    which differs from the common one; the finding names the definition and shows the
    figure re-derived under the common one. When the version cannot be inferred from the
    output, the finding says so and what would decide it.

    Why: SGLang from PR 11572 (Oct 2025) to PR 23530 (Apr 2026) printed `accept rate` as
    (accepted + bs) / (bs * num_draft_tokens): the bonus token in the numerator and the root
    slot in the denominator, so a step that accepted no draft reads 1/num_draft_tokens.
    Flagging that as a bug would be a false alarm on a healthy engine; comparing it with
    another engine's drafts-only rate without saying so would mislead.

    Example: `[2025-12-04 20:35:53] Decode batch, ..., accept len: 1.00, accept rate: 0.11`
    (no draft accepted, yet a positive rate: 1/9 with 9 verify nodes).
    """

    code = "SA720"
    name = "engine-convention"
    severity = "warning"
    message = "{what}: {detail}"
    fail_fixture = "corpus/rendered/sglang-fastrl-pr4-spec-off-bs48.log"
    pass_fixture = "corpus/rendered/sglang-meta-pr33518-new-names.json"

    def check(self, reading):
        if reading.engine != "sglang":
            return []
        from specaudit.audit.sources.sglang import RATE_BONUS
        hits = [w for w in self.windows(reading) if w.accept_rate is not None and w.extra.get("rate_formula")
                in ("bonus", "both") and w.extra.get("era") in ("bonus", "either", None)]
        if not hits:
            return []
        w0 = hits[0]
        D = reading.config.get("num_draft_tokens")
        ratio = w0.accept_len / w0.accept_rate if w0.accept_rate else None
        nodes = D or (round(ratio) if ratio else None)
        drafts_only = (w0.accept_len - 1) / (nodes - 1) if nodes and nodes >= 2 else None
        if w0.extra.get("era") is None:
            ver = ("the SGLang version cannot be inferred from this output (no year on the lines): on SGLang "
                   "Oct 2025 - Apr 2026 (PR 11572 .. PR 23530) this is the engine's own definition; on a later "
                   "version it is a bug. The server's version or the log's dates would decide")
        else:
            ver = f"this SGLang version ({w0.version}) defines it so"
        detail = (f"{RATE_BONUS}; {ver}. At line {w0.line}: accept len {fmt(w0.accept_len)}, accept rate "
                  f"{fmt(w0.accept_rate)} = accept len / {nodes} verify nodes"
                  + (f"; the drafts-only rate would be {fmt(drafts_only)}" if drafts_only is not None else ""))
        return [self.finding(file=reading.path, line=w0.line, what=f"accept rate on {len(hits)} line(s)"
                             + where(w0), detail=detail)]


class PerPositionIncreasing(SourceRule):
    """What: the accepted count (or the per-verify-step rate) at a later draft position
    exceeds the one at an earlier position.

    Why: a draft token at position i+1 is accepted only if the one at position i was
    accepted in the same step, so accepted counts are non-increasing in position, and so
    are rates over all verify steps (vLLM, llama.cpp). Rising counts mean a position
    index is shifted or a counter counts something else. (TensorRT-LLM's per-position
    rates are over drafts that reached the position, so only its counts are checked.)

    Example: `Per-position acceptance rate: 0.612, 0.701, 0.455`.
    """

    code = "SA721"
    name = "per-position-increasing"
    message = "{what}: {detail}"
    fail_fixture = "corpus/rendered/vllm-broken-per-position-rising.log"
    pass_fixture = "corpus/rendered/vllm-ascend-13640-dspark-k7.log"

    def check(self, reading):
        def items():
            for w in self.windows(reading):
                if w.extra.get("dynamic_depth"):
                    continue  # the depth changes between steps: positions past it are drafted less often
                if w.per_pos_counts:
                    c = w.per_pos_counts
                    bad = next((i for i in range(1, len(c)) if c[i] > c[i - 1] + 0.5), None)
                    if bad is not None:
                        yield w, dict(what=f"accepted tokens per position{where(w)}",
                                      detail=f"position {bad} accepted {count(c[bad])} > position {bad - 1} "
                                             f"{count(c[bad - 1])}: a later draft is accepted only after the "
                                             "earlier one")
                        continue
                if w.per_pos and w.per_pos_kind == "verify_steps" and not w.per_pos_counts:
                    r = w.per_pos
                    bad = next((i for i in range(1, len(r)) if r[i] > r[i - 1] + 2 * pos_tol(w) + 1e-9), None)
                    if bad is not None:
                        yield w, dict(what=f"per-position acceptance rate{where(w)}",
                                      detail=f"position {bad} {fmt(r[bad], 3)} > position {bad - 1} "
                                             f"{fmt(r[bad - 1], 3)}: rates over all verify steps cannot rise with "
                                             "position")
        return self.emit(reading, items())


class DraftedVsSteps(SourceRule):
    """What: drafted tokens exceed verify steps x draft length, or, for an engine that drafts
    a fixed block, differ from it.

    Why: each verify step checks at most k drafted tokens, so drafted <= steps x k; with a
    fixed block (SGLang EAGLE's proposed drafts, vLLM's and TensorRT-LLM's per-request
    payloads with num_spec_tokens) drafted = steps x k exactly. A larger drafted count means
    padded or dummy drafts were counted (vLLM #54054, TensorRT-LLM #14724 rebuilt drafted as
    max_draft x iterations), which drives the acceptance rate down.

    Example: `"num_spec_steps": 43, "num_draft_tokens": 172, "num_spec_tokens": 3` (43 x 3 = 129).
    """

    code = "SA722"
    name = "drafted-vs-steps"
    message = "{what}: {detail}"
    fail_fixture = "corpus/rendered/vllm-broken-request-drafted-padded.json"
    pass_fixture = "corpus/rendered/vllm-request-llama-swap-1032.json"

    def check(self, reading):
        def items():
            for w in self.windows(reading):
                if not _ok(w.drafts, w.draft_tokens, w.k) or not w.k:
                    continue
                if w.extra.get("dynamic_depth") or w.drafts <= 0:
                    continue
                if w.extra.get("drafts_derived"):
                    # verify steps re-derived from printed (rounded) figures: use the largest count
                    # the printed precision allows, so rounding never trips the check
                    bounds = []
                    if w.accept_len is not None and w.accepted_tokens:
                        bounds.append(w.accepted_tokens / max(w.accept_len - 1 - LEN_TOL, 1e-9))
                    if w.per_pos and w.per_pos_kind == "verify_steps" and w.accepted_tokens:
                        bounds.append(w.accepted_tokens / max(sum(w.per_pos) - len(w.per_pos) * pos_tol(w), 1e-9))
                    if not bounds:
                        continue
                    cap = max(bounds) * w.k
                    if w.draft_tokens > cap + 0.5:
                        yield w, dict(what=f"Drafted{where(w)}",
                                      detail=f"{count(w.draft_tokens)} tokens, but the printed mean length and "
                                             f"per-position rates allow at most {count(int(max(bounds)))} verify "
                                             f"steps x k {w.k} = {count(int(cap))}: Accepted/Drafted and the "
                                             "per-position rates disagree (drafts that were never verified?)")
                    continue
                cap = w.drafts * w.k
                if w.draft_tokens > cap + 0.5:
                    yield w, dict(what=f"drafted tokens{where(w)}",
                                  detail=f"{count(w.draft_tokens)} > verify steps {count(w.drafts)} x k {w.k} = "
                                         f"{count(cap)}: drafts that were never verified (padding) are counted")
                elif w.extra.get("fixed_block") and abs(w.draft_tokens - cap) > 0.5:
                    yield w, dict(what=f"drafted tokens{where(w)}",
                                  detail=f"{count(w.draft_tokens)}, but a fixed block of {w.k} over "
                                         f"{count(w.drafts)} verify steps drafts {count(cap)}")
        return self.emit(reading, items())


class HistogramSums(SourceRule):
    """What: an acceptance histogram whose counts do not add up: sum(h) != verify steps,
    sum(i * h_i) != accepted drafts, or more buckets than k + 1.

    Why: h[i] counts the verify steps that accepted exactly i drafts (bonus excluded), so
    its total is the step count and its first moment the accepted drafts. A histogram
    built from per-position vectors and totals taken elsewhere disagree when one of them
    is wrong (TensorRT-LLM PR 19311 names these identities).

    Example: `"acceptance_histogram": [39, 1, 0, 3], "num_spec_steps": 43,
    "num_accepted_draft_tokens": 12` (1 + 0 + 9 = 10).
    """

    code = "SA723"
    name = "histogram-sums"
    message = "{what}: {detail}"
    fail_fixture = "corpus/rendered/vllm-broken-request-histogram.json"
    pass_fixture = "corpus/rendered/vllm-request-llama-swap-1032.json"

    def check(self, reading):
        def items():
            for w in self.windows(reading):
                h = w.histogram
                if not h:
                    continue
                steps, first = sum(h), sum(i * x for i, x in enumerate(h))
                if w.drafts is not None and abs(steps - w.drafts) > 0.5:
                    yield w, dict(what=f"acceptance histogram{where(w)}",
                                  detail=f"sums to {count(steps)} steps, but verify steps = {count(w.drafts)}")
                elif w.accepted_tokens is not None and abs(first - w.accepted_tokens) > 0.5:
                    yield w, dict(what=f"acceptance histogram{where(w)}",
                                  detail=f"sum(i x h_i) = {count(first)}, but accepted drafts = "
                                         f"{count(w.accepted_tokens)}")
                elif w.k is not None and len(h) > w.k + 1 and any(h[w.k + 1:]):
                    yield w, dict(what=f"acceptance histogram{where(w)}",
                                  detail=f"has steps accepting more than k = {w.k} drafts: {h}")
        return self.emit(reading, items())


class CounterReset(SourceRule):
    """What: a cumulative counter printed in a log (vLLM V0 `Speculative metrics`, llama.cpp
    `statistics <drafter>:` lines) goes down between two lines of the same engine and rank.

    Why: cumulative counters only grow; a decrease is a restart (the figures start again)
    and intervals computed across it would be negative. It is reported as a reset, a
    warning, not as a bug.

    Example: `#gen tokens = 1447` followed by `#gen tokens = 192` for the same drafter.
    """

    code = "SA724"
    name = "counter-reset"
    severity = "warning"
    message = "{what}: {detail}"
    fail_fixture = "corpus/rendered/llamacpp-broken-statistics-reset.log"
    pass_fixture = "corpus/rendered/llamacpp-pr24536-slot-eagle3.log"

    def check(self, reading):
        last: dict = {}

        def items():
            for w in reading.windows:
                if w.kind != "cumulative" or reading.source == "prom-text":
                    continue
                key = (w.engine, w.rank)
                prev = last.get(key)
                last[key] = w
                if prev is None:
                    continue
                for label, a, b in (("drafted tokens", prev.draft_tokens, w.draft_tokens),
                                    ("accepted tokens", prev.accepted_tokens, w.accepted_tokens),
                                    ("verify steps", prev.drafts, w.drafts)):
                    if _ok(a, b) and b < a:
                        yield w, dict(what=f"{label}{where(w)}",
                                      detail=f"went down from {count(a)} (line {prev.line}) to {count(b)}: the "
                                             "engine restarted; figures start again here (a reset, not a bug)")
                        break
        return self.emit(reading, items())


class GaugeAsCounter(SourceRule):
    """What: a spec-decoding token count exported as a Prometheus gauge (or a `_total`
    series typed gauge).

    Why: gauges hold a last value; rate(), increase() or a difference between scrapes over
    a gauge is meaningless, and a per-iteration value read as cumulative undercounts.
    TensorRT-LLM exported num_draft_tokens / num_accepted_tokens as gauges until PR 12545;
    SGLang's accept length and rate are gauges of the last log window. specaudit never
    differences these; dashboards must not either.

    Example: `# TYPE trtllm_spec_decode_num_draft_tokens gauge`.
    """

    code = "SA725"
    name = "gauge-as-counter"
    severity = "warning"
    message = "{what}: {detail}"
    fail_fixture = "corpus/rendered/trtllm-broken-gauge-counters.prom"
    pass_fixture = "corpus/rendered/trtllm-test-collector-per-position.prom"

    def check(self, reading):
        names = reading.config.get("gauge_counters") or []
        lines = reading.config.get("gauge_counter_lines") or {}
        out = []
        for n in dict.fromkeys(names):
            out.append(self.finding(file=reading.path, line=lines.get(n, 1), what=n,
                                    detail="a token count exported as a gauge: never take rate() or differences of "
                                           "it; use the _total counters (TensorRT-LLM >= PR 12545)"))
        return out


class PrintedFigureRecomputed(SourceRule):
    """What: a printed acceptance rate or mean acceptance length differs from the same
    figure recomputed from the counts printed beside it, beyond the printed precision.

    Why: rate = accepted / drafted and mean length = 1 + accepted / verify steps under the
    engine's own definitions; a printed figure that disagrees with its own counts was
    computed from other variables (stale counters, a different window, the bonus counted
    twice). llama.cpp's statistics line also gives rate(position 0) x drafts = accepted
    drafts.

    Example: `draft acceptance = 0.81944 (  128 accepted /   144 generated)` (128 / 144 =
    0.88889).
    """

    code = "SA726"
    name = "printed-figure-recomputed"
    message = "{what}: printed {printed}, recomputed {recomputed} from {how}"
    fail_fixture = "corpus/rendered/llamacpp-broken-slot-rate.log"
    pass_fixture = "corpus/rendered/llamacpp-pr23269-old-slot-and-stats.log"

    def check(self, reading):
        def items():
            for w in self.windows(reading):
                pr = w.extra.get("printed_rate")
                if pr and _ok(w.accepted_tokens, w.draft_tokens) and w.draft_tokens > 0:
                    val, tol = pr
                    rec = w.accepted_tokens / w.draft_tokens
                    if abs(val - rec) > tol + 1e-9:
                        yield w, dict(what=f"acceptance rate{where(w)}", printed=f"{val:.6g}",
                                      recomputed=f"{rec:.6g}",
                                      how=f"accepted {count(w.accepted_tokens)} / drafted {count(w.draft_tokens)}")
                        continue
                if (w.accept_len is not None and _ok(w.accepted_tokens, w.drafts) and w.drafts > 0
                        and not w.extra.get("drafts_derived") and not w.extra.get("accept_len_gauge")
                        and "emitted" not in w.extra):
                    rec = 1 + w.accepted_tokens / w.drafts
                    tol = w.extra["printed_len"][1] if "printed_len" in w.extra else LEN_TOL
                    if w.engine == "sglang" and "completion_tokens" in w.extra:
                        # completion tokens / verify count: the first (prefill) token may or may not be in it
                        ct = w.extra["completion_tokens"]
                        ok = any(abs(w.accept_len - x) <= 1e-6 for x in (ct / w.drafts, (ct - 1) / w.drafts))
                        ok = ok and abs(ct - w.drafts - w.accepted_tokens) <= 1.5
                        if not ok:
                            yield w, dict(what=f"spec_accept_length{where(w)}", printed=fmt(w.accept_len, 4),
                                          recomputed=fmt(ct / w.drafts, 4),
                                          how=f"completion tokens {count(ct)} / verify count {count(w.drafts)} "
                                              f"(accepted drafts {count(w.accepted_tokens)})")
                        continue
                    if w.engine == "sglang":
                        tol = max(tol, 1.0 / w.drafts + 1e-6)  # the prefill token in the count
                    if abs(w.accept_len - rec) > tol + 1e-9:
                        yield w, dict(what=f"mean acceptance length{where(w)}", printed=fmt(w.accept_len, 4),
                                      recomputed=fmt(rec, 4),
                                      how=f"1 + accepted {count(w.accepted_tokens)} / verify steps {count(w.drafts)}")
                        continue
                ad = w.extra.get("accepted_drafts")
                if ad is not None and w.per_pos and _ok(w.drafts) and w.drafts > 0:
                    rec = ad / w.drafts
                    if abs(w.per_pos[0] - rec) > pos_tol(w) + 1e-9:
                        yield w, dict(what=f"rate at position 0{where(w)}", printed=fmt(w.per_pos[0], 3),
                                      recomputed=fmt(rec, 3),
                                      how=f"#acc drafts {count(ad)} / #gen drafts {count(w.drafts)}")
        return self.emit(reading, items())


class AcceptanceCollapse(SourceRule):
    """What: drafting continues while almost nothing is accepted: accepted / drafted below
    2% over at least 50 drafted tokens.

    Why: a healthy drafter rarely falls that low; near-zero acceptance with steady drafting
    is the signature of dummy, zero-filled or padded drafts (vLLM #54054 / #34734, #58080:
    0.05%) or of a drafter that no longer sees the context. A warning: a mismatched draft
    model can be this bad for real.

    Example: `Mean acceptance length: 1.03, ..., Accepted: 25 tokens, Drafted: 3652 tokens,
    ..., Avg Draft acceptance rate: 0.7%`.
    """

    code = "SA727"
    name = "acceptance-collapse"
    severity = "warning"
    message = "{what}: {detail}"
    fail_fixture = "corpus/rendered/vllm-41789-gemma4-mtp-collapse.log"
    pass_fixture = "corpus/rendered/vllm-aeon-6-dflash-k15.log"

    def check(self, reading):
        def items():
            for w in self.windows(reading):
                if not _ok(w.accepted_tokens, w.draft_tokens) or w.draft_tokens <= 0:
                    continue
                if w.draft_tokens < COLLAPSE_MIN_DRAFTED and not (w.drafts and w.drafts >= 20):
                    continue
                rate = w.accepted_tokens / w.draft_tokens
                if 0 <= rate < COLLAPSE_RATE:
                    yield w, dict(what=f"acceptance{where(w)}",
                                  detail=f"{count(w.accepted_tokens)} of {count(w.draft_tokens)} drafted tokens "
                                         f"accepted ({100 * rate:.2f}%) while drafting continues: dummy or padded "
                                         "drafts, or a drafter blind to the context?")
        return self.emit(reading, items())



class CountersNotPopulated(SourceRule):
    """What: the speculative-decoding counters of a record are all zero while the same
    record shows that drafts were accepted (more than one token decoded per iteration, or
    an acceptance length above 1).

    Why: a path that never writes the counters reports zeros, and a zero read as "nothing
    drafted" hides a working drafter (TensorRT-LLM's PyTorch flow before PR 17082 returned
    request_perf_metrics.speculative_decoding zeroed while avg_decoded_tokens_per_iter was
    right; renamed keys read as 0 do the same).

    Example: `"avg_decoded_tokens_per_iter": 2.4, "speculative_decoding": {"acceptance_rate":
    0.0, "total_accepted_draft_tokens": 0, "total_draft_tokens": 0}`.
    """

    code = "SA728"
    name = "counters-not-populated"
    message = "{what}: {detail}"
    fail_fixture = "corpus/rendered/trtllm-broken-request-zeros.json"
    pass_fixture = "corpus/rendered/trtllm-test-perf-metrics-backfill.json"

    def check(self, reading):
        def items():
            for w in self.windows(reading):
                if w.draft_tokens != 0 or w.accepted_tokens not in (0, None):
                    continue
                avg = w.extra.get("avg_decoded_per_iter")
                if avg is not None and avg > 1 + LEN_TOL:
                    yield w, dict(what=f"speculative-decoding counters{where(w)}",
                                  detail=f"drafted 0 and accepted 0, yet {fmt(avg)} tokens are decoded per iteration: "
                                         "the counters were never written on this path")
                elif w.accept_len is not None and w.accept_len > 1 + LEN_TOL and not w.extra.get("accept_len_gauge"):
                    yield w, dict(what=f"speculative-decoding counters{where(w)}",
                                  detail=f"drafted 0 and accepted 0, yet the acceptance length is {fmt(w.accept_len)}: "
                                         "the counters were never written (or are read under an old name)")
        return self.emit(reading, items())
