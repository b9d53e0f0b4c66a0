"""SA735: a drafter that is the target itself, yet its drafts are rejected.

With vLLM's `--speculative-config '{"model": <the target's folder>, ...}'` the drafter
is the target: method draft_model, and by default draft_sample_method "greedy", so each
draft is the target's own most likely token x* at that position. A correct verifier
accepts it with probability p_T(x*), the target's probability of x* under the request's
temperature T (the draft probability is one-hot: p/q = p_T(x*)). So:

    temperature 0     every draft is accepted (x* is the target's argmax);
    temperature T > 0 each draft is accepted with p_T(x*) >= 1/vocab, and the acceptance
                      at every position is the same kind of quantity (the target's
                      probability of its own mode), so it cannot stop at one position.

What the rule reads: the start-up lines (specaudit/audit/sources/vllm_startup.py: the
target and the drafter the engine resolved) and the per-position acceptance of the
`SpecDecoding metrics:` lines, summed over the file (per engine). It cannot know the
temperature, so it is a warning; the trace (SA801, SA804) proves the contradiction.
"""
from __future__ import annotations

import math

from specaudit.audit.sources.vllm_startup import self_draft

from .sa7xx_common import count, fmt
from .sa7xx_identities import SourceRule

# accepted / drafted below this over at least COLLAPSE_MIN_DRAFTED drafted tokens. A self-draft
# accepts each draft with the target's probability of its own most likely token; averaging
# below 10% takes a distribution nearly flat over 10+ tokens at almost every position: a
# temperature at which the output is noise (measured here: the tiny target at T = 0.8
# accepts 36% of its own drafts when vLLM's verify path is fixed, tests/data/vllm_anomaly).
COLLAPSE_RATE = 0.10
COLLAPSE_MIN_DRAFTED = 50
MIN_TRIALS = 20             # drafts that reached a position before its rate is judged
DROP = 4.0                  # a later position judged against position 0's rate / DROP ...
P_MAX = 1e-4                # ... and flagged only when the binomial tail is below this


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (n is at most a few 10^6)."""
    if p <= 0:
        return 1.0
    if p >= 1:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    tot = 0.0
    for i in range(0, min(k, n) + 1):
        tot += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
    return min(tot, 1.0)


def position_counts(windows):
    """(verify steps, [accepted at position i], drafted, accepted, last window) summed over
    windows with per-position rates and a step count; counts = rate x steps, rounded."""
    steps, acc_pos, drafted, accepted, last = 0, [], 0.0, 0.0, None
    for w in windows:
        d = _drafts_of(w)
        if not w.per_pos or not d or d <= 0 or w.draft_tokens is None or w.accepted_tokens is None:
            continue
        if w.per_pos_kind not in (None, "verify_steps") or w.kind != "interval":
            continue
        n = int(round(d))
        steps += n
        acc_pos += [0] * (len(w.per_pos) - len(acc_pos))
        for i, r in enumerate(w.per_pos):
            acc_pos[i] += int(round(r * n))
        drafted += w.draft_tokens
        accepted += w.accepted_tokens
        last = w
    return steps, acc_pos, drafted, accepted, last


def _drafts_of(w):
    """Verify steps of a window. vLLM prints no step count; a draft model proposes k tokens
    at every step, so drafted / k is exact when it divides; otherwise the reader's figure
    (derived from the two-decimal mean)."""
    if w.k and w.draft_tokens and w.draft_tokens % w.k == 0:
        return w.draft_tokens / w.k
    return w.drafts


class SelfDraftRejected(SourceRule):
    """What: the start-up lines show the drafter is the target itself (vLLM method
    draft_model, the same model for both), yet its drafts are rejected: accepted / drafted
    below 10% over at least 50 drafted tokens, or a later position whose acceptance
    (among the drafts that reached it) is far below position 0's (under a quarter of it,
    binomial tail below 1e-4, at least 20 drafts reaching it).

    Why: a drafter identical to the target proposes the target's own most likely token;
    a correct verifier accepts it with the target's probability of that token: every
    draft at temperature 0, and at any temperature about the same rate at every position.
    Rejection of such drafts is a verify path that scores the target with other
    probabilities than it samples from (a temperature applied to one side only or not at
    all, uninitialised or misaligned per-token parameters, probabilities of another
    position): vLLM 0.32.0 on CPU expands the per-request temperature into uninitialised
    memory, and its counters then also miss one accepted draft on each step that drew no
    token after a rejection (docs/vllm-sampling-anomaly.md). A warning: the log does not
    carry the requests' temperature; a trace of the run proves it (SA801, SA804).

    Example: `SpecDecoding metrics: Mean acceptance length: 1.50, ..., Per-position
    acceptance rate: 0.496, 0.000, 0.000, 0.000` with `speculative_config=SpeculativeConfig(
    method='draft_model', model='/m/t', num_spec_tokens=4)` and `model='/m/t'`.
    """

    code = "SA735"
    name = "self-draft-rejected"
    severity = "warning"
    message = "{what}: {detail}"
    fail_fixture = "vllm_selfdraft_cpu_sampled.log"
    pass_fixture = "vllm_selfdraft_greedy.log"

    def check(self, reading):
        cfg = reading.config
        if reading.engine != "vllm" or not self_draft(cfg):
            return []
        who = f"the drafter is the target itself ({cfg.get('draft_model')}, method draft_model"
        who += f", draft_sample_method {cfg.get('draft_sample_method') or 'greedy'}"
        if cfg.get("engine_version"):
            who += f"; vLLM {cfg['engine_version']}" + (f" on {cfg['device']}" if cfg.get("device") else "")
        who += ")"
        implies = ("a correct verifier accepts each of its drafts with the target's own probability of "
                   "its most likely token: every draft at temperature 0, about the same rate at every position "
                   "at any temperature")
        items = []
        for rank in reading.ranks():
            ws = [w for w in self.windows(reading) if w.rank == rank]
            steps, acc, drafted, accepted, last = position_counts(ws)
            if last is None:
                continue
            where = f" ({rank})" if rank else ""
            if drafted >= COLLAPSE_MIN_DRAFTED and accepted / drafted < COLLAPSE_RATE:
                items.append((last, dict(
                    what=f"acceptance of a self-draft{where}",
                    detail=f"{count(accepted)} of {count(drafted)} drafted tokens accepted "
                           f"({100 * accepted / drafted:.2f}%) over {count(steps)} verify steps, but {who}: "
                           f"{implies}; so low only if the requests sample at a temperature that makes the "
                           "target's top token average under 10% (noise), otherwise the verify path scores drafts "
                           "with other probabilities than the target samples from")))
                continue
            r0 = acc[0] / steps if steps and acc else 0.0
            for i in range(1, len(acc)):
                n, k = acc[i - 1], acc[i]
                if n < MIN_TRIALS or r0 <= 0:
                    continue
                tail = binom_cdf(k, n, r0 / DROP)
                if k / n < r0 / DROP and tail < P_MAX:
                    items.append((last, dict(
                        what=f"acceptance stops at position {i - 1} of a self-draft{where}",
                        detail=f"position 0 accepted {count(acc[0])} of {count(steps)} drafts ({fmt(r0, 3)}), "
                               f"position {i} {count(k)} of the {count(n)} that reached it ({fmt(k / n, 3)}; "
                               f"below {fmt(r0 / DROP, 3)} with probability {tail:.1e}), but {who}: {implies}; "
                               f"positions after {i - 1} are verified with other probabilities")))
                    break
        return self.emit(reading, items)
