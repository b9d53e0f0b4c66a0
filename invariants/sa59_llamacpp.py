"""SA592-SA596: what a llama-server client received per request, against the server's own log
and /metrics counters.

Scope "source", with their own input: check(ctx) gets a ServerEvidence (built by
specaudit/audit/llamacpp_client.py from the client's saved /completion responses, the
server's log and two /metrics scrapes around the requests). Any other source is not
theirs: check returns None. `specaudit check server.log responses.jsonl before.prom
after.prom` runs them.

Matching: llama-server answers a slot's requests in order, and prints one
`print_timing ... draft acceptance = R (A accepted / G generated), mean len = L` line per
request when the request ends; the i-th response of a slot meets the i-th such line of
that slot (the response's `id_slot`). Counts compare exactly.

Words (llama.cpp's): generated = draft tokens sent to verification (timings.draft_n),
accepted = accepted draft tokens, bonus excluded (timings.draft_n_accepted), steps =
verify steps (= drafts: /metrics spec_decode_num_drafts_total; per request 1 + accepted /
steps = the printed mean len), predicted = tokens generated for the request
(timings.predicted_n), k = the server's longest draft (--spec-draft-n-max).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .base import EvidenceRule


@dataclass
class ServerEvidence:
    """requests: per response, in the order the client received them: {"slot", "draft_n",
    "draft_n_accepted", "predicted_n"}. lines: the log's per-request lines, in log order:
    {"slot", "task", "accepted", "generated", "steps" (the rounds counted, else derived from
    mean len, else None), "steps_printed" (derived from mean len where only one count
    prints as it, else None), "line", "rounds": [(accepted, drafted), ...] the per-round
    (-v) lines of that request, or None when the log has none}. metrics: counter deltas over
    the same requests ({"drafts", "draft_tokens", "accepted_tokens", "tokens_predicted"}) or
    None. k: the longest draft, or None."""
    requests: list = field(default_factory=list)
    lines: list = field(default_factory=list)
    metrics: dict | None = None
    k: int | None = None
    file: str | None = None

    def pairs(self):
        """-> ([(request index, response, log line)], unmatched responses, unmatched lines)."""
        by_slot: dict = {}
        for ln in self.lines:
            by_slot.setdefault(ln.get("slot", 0), []).append(ln)
        seen: dict = {}
        matched, lost = [], []
        for i, r in enumerate(self.requests):
            s = r.get("slot", 0)
            j = seen.get(s, 0)
            seen[s] = j + 1
            cand = by_slot.get(s, [])
            if j < len(cand):
                matched.append((i, r, cand[j]))
            else:
                lost.append(i)
        extra = sum(max(0, len(v) - seen.get(s, 0)) for s, v in by_slot.items())
        return matched, lost, extra

    @classmethod
    def example(cls) -> ServerEvidence:
        """Two healthy requests, k = 6: 20 and 18 verify steps, each committing accepted + 1
        tokens after the first token of the prompt."""
        lines = [dict(slot=0, task=1, accepted=44, generated=96, steps=20, steps_printed=20, line=10,
                      rounds=[(3, 6)] * 8 + [(2, 4)] * 4 + [(1, 4)] * 4 + [(2, 4)] * 4),
                 dict(slot=0, task=2, accepted=29, generated=80, steps=18, steps_printed=18, line=20, rounds=None)]
        requests = [dict(slot=0, draft_n=96, draft_n_accepted=44, predicted_n=65),
                    dict(slot=0, draft_n=80, draft_n_accepted=29, predicted_n=48)]
        metrics = dict(drafts=38, draft_tokens=176, accepted_tokens=73, tokens_predicted=113)
        return cls(requests, lines, metrics, 6, "responses.jsonl")


class _ServerRule(EvidenceRule):
    evidence = ServerEvidence


class ClientVsServerLog(_ServerRule):
    """What: the draft counts a client received in a response's `timings` (draft_n,
    draft_n_accepted) equal the server's own log line for the same request (`A accepted /
    G generated`).

    Why: both come from the same per-slot counters, so any difference means one of the two
    paths (the response's JSON or the log's print) reads another counter, another request,
    or a counter not reset between requests; a benchmark table built on the responses then
    reports figures the operator's log contradicts.

    Example: the second response says draft_n_accepted 47 while its log line (slot 0, task
    2) says 29 accepted of 80 generated.
    """

    code = "SA592"
    name = "llamacpp-client-vs-log"
    severity = "error"
    message = ("request {request} (slot {slot}, task {task}): the client received {figure} {client:g}, "
               "the server's log line {log_line} says {logged:g}")

    def findings(self, ctx):
        out = []
        for i, r, ln in ctx.pairs()[0]:
            for fig, key in (("draft_n", "generated"), ("draft_n_accepted", "accepted")):
                c, lg = r.get(fig), ln.get(key)
                if c is not None and lg is not None and c != lg:
                    out.append(dict(request=i + 1, slot=ln.get("slot", 0), task=ln.get("task"), figure=fig,
                                    client=c, logged=lg, log_line=ln.get("line"), file=ctx.file))
        return out

    def fail(self, ctx):
        ctx.requests[1]["draft_n_accepted"] += 18

    def passing(self, ctx):
        ctx.requests[0]["predicted_n"] = 65   # nothing else changes: the pair agrees


class ClientVsServerUnmatched(_ServerRule):
    """What: every response the client received meets one per-request line of the server's
    log, and every such line one response.

    Why: a response without its line (a log of another run, a log cut short, a server that
    died before printing) cannot be checked, and guessing a partner would invent evidence:
    it is said once, not compared.

    Example: 3 responses and 2 log lines: `1 of 3 responses have no acceptance line in the
    log, 0 lines have no response; they are not compared`.
    """

    code = "SA593"
    name = "llamacpp-client-vs-log-unmatched"
    severity = "warning"
    message = ("{lost} of {requests} responses have no acceptance line in the server's log, {extra} lines "
               "have no response; they are not compared")

    def findings(self, ctx):
        _, lost, extra = ctx.pairs()
        if not lost and not extra:
            return []
        return [dict(lost=len(lost), requests=len(ctx.requests), extra=extra, file=ctx.file)]

    def fail(self, ctx):
        ctx.requests.append(dict(ctx.requests[0]))

    def passing(self, ctx):
        ctx.lines[1]["rounds"] = None


class ServerLogVsMetrics(_ServerRule):
    """What: the sums over the requests of the server's per-request figures equal the
    /metrics counters' increase over the same requests: spec_decode_num_draft_tokens_total
    = sum of draft_n, _num_accepted_tokens_total = sum of draft_n_accepted,
    _num_drafts_total = sum of the verify steps (from each line's mean len), and
    tokens_predicted_total = sum of predicted_n.

    Why: the dashboards and alerts read the counters, the benchmark tables the responses;
    a counter fed from another place (a drafter's own statistics, a retry, a request the
    client never saw) makes the two disagree by exactly that much.

    Example: the log and responses add up to 73 accepted tokens while
    spec_decode_num_accepted_tokens_total rose by 111 over the same two requests.
    """

    code = "SA594"
    name = "llamacpp-log-vs-metrics"
    severity = "error"
    message = "over {requests} requests the responses add up to {figure} = {summed:g}, /metrics rose by {delta:g}"

    def findings(self, ctx):
        if not ctx.metrics or not ctx.requests:
            return []
        matched, lost, extra = ctx.pairs()
        if lost or extra:
            return []   # SA593 says it; the sums would compare different request sets
        steps = [ln.get("steps") for _, _, ln in matched]
        sums = {"draft_tokens": sum(r.get("draft_n") or 0 for r in ctx.requests),
                "accepted_tokens": sum(r.get("draft_n_accepted") or 0 for r in ctx.requests),
                "tokens_predicted": sum(r.get("predicted_n") or 0 for r in ctx.requests),
                "drafts": sum(steps) if all(s is not None for s in steps) else None}
        out = []
        for fig, s in sums.items():
            d = ctx.metrics.get(fig)
            if s is not None and d is not None and abs(s - d) > 1e-9:
                out.append(dict(requests=len(ctx.requests), figure=fig, summed=s, delta=d, file=ctx.file))
        return out

    def fail(self, ctx):
        ctx.metrics["accepted_tokens"] += 38    # one per verify step: the bonus counted where the counter is fed

    def passing(self, ctx):
        ctx.metrics["drafts"] = 38


class RoundsVsRequestLine(_ServerRule):
    """What: a request's per-round lines (`-v`: `add accepted tokens: ... ids.size=N,
    n_draft=D`, N - 1 accepted, else `accepted A/D draft tokens`, which is missing for the
    step a request ends in) add up to its per-request line: sum of D = generated, sum of
    accepted = accepted, one round per verify step.

    Why: the per-round lines are printed where the target verifies a draft, the request's
    counters where it is drafted; a draft counted but never verified (one shorter than
    --spec-draft-n-min, thrown away after it was counted: the class llama.cpp PR 14104
    fixed) makes `generated` larger than what was verified and the acceptance rate too low;
    the target's token counted as accepted makes `accepted` larger than the rounds' N - 1.

    Example: 20 rounds verified 96 drafted tokens but the line says 104 generated.
    """

    code = "SA595"
    name = "llamacpp-rounds-vs-request-line"
    severity = "error"
    message = ("request line {log_line} (slot {slot}, task {task}): its {rounds} per-round lines add up to {figure} "
               "{summed:g}, the line says {logged:g}")

    def findings(self, ctx):
        out = []
        for ln in ctx.lines:
            rs = ln.get("rounds")
            if not rs:
                continue
            sums = {"accepted": sum(a for a, _ in rs), "generated": sum(d for _, d in rs), "steps": len(rs)}
            if ln.get("rounds_may_miss_last") and ln.get("steps_printed") == len(rs) + 1:
                # the per-round line printed after a step's tokens is missing for the step the
                # request ended in: that step is the remainder, if it is one a step can be
                a, d = ln["accepted"] - sums["accepted"], ln["generated"] - sums["generated"]
                if 0 <= a <= d and d >= 1 and (ctx.k is None or d <= ctx.k):
                    sums = {"accepted": ln["accepted"], "generated": ln["generated"], "steps": len(rs) + 1}
            for fig, s in sums.items():
                lg = ln.get("steps_printed" if fig == "steps" else fig)
                if lg is not None and s != lg:
                    out.append(dict(log_line=ln.get("line"), slot=ln.get("slot", 0), task=ln.get("task"),
                                    rounds=len(rs), figure=fig, summed=s, logged=lg, file=ctx.file))
        return out

    def fail(self, ctx):
        ctx.lines[0]["generated"] += 8
        ctx.requests[0]["draft_n"] += 8

    def passing(self, ctx):
        ctx.lines[0]["rounds"] = list(ctx.lines[0]["rounds"])


class CountsBeyondSteps(_ServerRule):
    """What: a request's counts fit in its verify steps: each step commits its accepted
    draft tokens plus one token of the target, after the one token the prompt gives, so
    steps + accepted <= predicted - 1 + k (the last step may stop mid-draft, at most k
    tokens dropped), and each step verifies at most k drafted tokens, so generated <=
    steps x k.

    Why: accepted counts that outgrow the tokens the request produced are tokens that were
    never accepted: the target's own (bonus) token counted as an accepted draft token, once
    per step, inflates the acceptance rate and the mean length by one, and passes every
    rate check while the rate stays below 1.

    Example: 20 verify steps and 64 accepted draft tokens, yet only 65 tokens predicted:
    20 + 64 = 84 > 65 - 1 + 6.
    """

    code = "SA596"
    name = "llamacpp-counts-beyond-steps"
    severity = "error"
    message = ("request {request} (slot {slot}, task {task}): {what}")

    def findings(self, ctx):
        out = []
        k = ctx.k
        for i, r, ln in ctx.pairs()[0]:
            steps, acc, gen, pred = ln.get("steps"), ln.get("accepted"), ln.get("generated"), r.get("predicted_n")
            if steps is None or k is None:
                continue
            what = None
            if pred is not None and acc is not None and steps + acc > pred - 1 + k:
                what = (f"{steps:g} verify steps + {acc:g} accepted draft tokens = {steps + acc:g} committed, more "
                        f"than the {pred:g} tokens predicted allow ({pred:g} - 1 + k {k})")
            elif gen is not None and gen > steps * k:
                what = f"{gen:g} draft tokens generated in {steps:g} verify steps of at most {k} each"
            if what:
                out.append(dict(request=i + 1, slot=ln.get("slot", 0), task=ln.get("task"), what=what,
                                file=ctx.file))
        return out

    def fail(self, ctx):
        for ln, r in zip(ctx.lines, ctx.requests):   # the bonus counted as accepted, every step
            ln["accepted"] += ln["steps"]
            r["draft_n_accepted"] += ln["steps"]
        ctx.metrics["accepted_tokens"] += 38
        ctx.lines[0]["rounds"] = [(a + 1, d) for a, d in ctx.lines[0]["rounds"]]

    def passing(self, ctx):
        ctx.requests[1]["predicted_n"] = 42   # the last step stopped mid-draft (EOS): 18 + 29 <= 41 + 6
        ctx.metrics["tokens_predicted"] = 107
