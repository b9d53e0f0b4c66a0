"""SA8xx: speculative sampling (contract v2): each test, each drawn token, the run's rate.

Rows of a sampled run carry, per node, q (draft_prob), the target side of the test
(target_prob) and the uniform (accept_u), and per step the token drawn after the
accepted path with its probabilities (docs/trace-contract.md, version 2). The greedy
argmax rules (SA304, SA305) skip those rows; SA307 compares the commit with the drawn
token instead of the argmax. These rules re-derive what sampling allows.
"""
from __future__ import annotations

import math

import numpy as np

from .base import Hits, Rule

# Two-sided 1 - 1e-4 normal quantile: a healthy run is flagged by SA804 about once in
# 10,000 checks (a false alarm costs more than a missed bug; see the rule's docstring).
Z_RUN = 3.891
MIN_TESTS = 30


def _sampled(f):
    s = f.sampling
    return None if s is None or not s.rows.any() else s


class SamplingValues(Rule):
    """What: a sampled step's contract v2 values are usable: draft_prob, target_prob
    and accept_u hold one entry per node; probabilities lie in [0, 1] and are not
    NaN; a uniform lies in [0, 1) (NaN marks a node never tested); a tested node has
    q > 0; sampled_token is present.

    Why: every other sampling rule divides by q, compares with u or sums p/q; a NaN
    or a probability of 1.3 would make those comparisons say anything. The row is
    named once here and hidden from SA801-SA804.

    Example: `draft_prob holds a value outside [0, 1] or NaN` for a row whose q was
    written as a logit instead of a probability.
    """

    code = "SA800"
    name = "sampling-values"
    message = "{why}"

    def check(self, f):
        s = _sampled(f)
        if s is None:
            return None
        bad, why = s.bad_values()
        return Hits(bad, why=why)

    def passing(self, run):
        sampled_fixture(run)

    def fail(self, run):
        sampled_fixture(run)
        s = run.steps_where(lambda s: len(s["node_tokens"]) >= 2)[0]
        s["draft_prob"][1] = float("nan")


class SampledDecision(Rule):
    """What: every recorded acceptance test agrees with u < p/q: an accepted node
    (on accepted_path) was tested and passed, a tested node off the path failed.
    p is target_prob (for a later sibling in a tree: the running residual), q is
    draft_prob, u is accept_u.

    Why: the test is what keeps speculative sampling lossless. A sampler that compares
    drafts with the argmax, divides q by p, or accepts untested drafts changes the
    output distribution while its counters look like a better drafter.

    Where run.json's config.sampling.unknown lists accept_u (an engine that does not
    expose its uniforms, e.g. transformers), the rule checks what holds for every u
    in [0, 1): an accepted node has p > 0, a rejected one has p/q < 1.

    Example: `node 3 accepted with u = 0.912 but p/q = 0.2031/0.4120 = 0.493: the
    test rejects it`.
    """

    code = "SA801"
    name = "sampled-decision"
    message = "node {node} {what}"

    def check(self, f):
        s = _sampled(f)
        if s is None:
            return None
        use = s.usable[f.node_row]
        passes, fails = s.decisions()
        tested, on_path = s.tested & use, s.on_path
        untested_acc = on_path & ~tested
        acc_fail = on_path & tested & fails
        rej_pass = tested & ~on_path & passes
        badn = untested_acc | acc_fail | rej_pass
        node = f.first_node(badn)
        hit = node >= 0
        if not hit.any():
            return None
        g = np.where(hit, f.start + np.maximum(node, 0), 0)

        def what(i):
            j = g[i]
            pq = (f"p/q = {s.target_prob[j]:.4g}/{s.draft_prob[j]:.4g} = {s.ratio[j]:.4g}"
                  if s.draft_prob[j] > 0 else f"p = {s.target_prob[j]:.4g} and q = 0")
            if untested_acc[j]:
                return "was accepted without a test (accept_u is NaN)"
            if s.u_unknown[f.node_row[j]]:   # the engine does not expose u: only what no u allows
                return (f"was accepted but p = {s.target_prob[j]:.4g}: no uniform accepts it" if acc_fail[j]
                        else f"was rejected but {pq} >= 1: every uniform accepts it")
            if acc_fail[j]:
                return f"was accepted with u = {s.u[j]:.4g} but {pq}: the test rejects it"
            return f"was rejected with u = {s.u[j]:.4g} but {pq}: the test accepts it"
        return Hits(hit, node=node, what=what)

    def passing(self, run):
        sampled_fixture(run)

    def fail(self, run):
        sampled_fixture(run)
        s = run.steps_where(lambda s: len(s["accepted_path"]) >= 2)[0]
        j = s["accepted_path"][1]
        s["accept_u"][j] = 0.99   # with p/q = 0.5 the test rejects what the path accepted
        s["target_prob"][j] = 0.25


class ResidualMass(Rule):
    """What: a token drawn after a rejection (the last accepted node has tested
    children) has positive residual mass: its target side p' exceeds its q at that
    node (sampled_target_prob > sampled_draft_prob), and sampled_prob > 0.

    Why: after a rejection the replacement must come from norm(max(0, p' - q)); a
    token with p' <= q has no residual mass and can only come from a sampler that
    drew from p (or q) instead, which over-weights the drafter's favourite tokens.

    Example: `the replacement token 101 has p' = 0.061 <= q = 0.244 at node 2: no
    residual mass (drawn from p, not from max(0, p - q))`.
    """

    code = "SA802"
    name = "residual-mass"
    message = "the replacement token {token} has p' = {p:.4g} <= q = {q:.4g} at node {node}: {what}"

    def check(self, f):
        s = _sampled(f)
        if s is None:
            return None
        p, q = s.token_target_prob, s.token_draft_prob
        rr = s.residual_rows
        with np.errstate(invalid="ignore"):
            none = rr & (np.isnan(q) | (p <= q * (1 - 1e-6)) | (p <= 0) | (s.token_prob <= 0))
        what = lambda i: ("sampled_draft_prob is missing after a rejection" if np.isnan(q[i])
                          else "no residual mass (drawn from p, not from max(0, p - q))")
        return Hits(none, token=s.token, p=p, q=np.nan_to_num(q, nan=-1.0),
                    node=f.last_node - f.start, what=what)

    def passing(self, run):
        sampled_fixture(run)

    def fail(self, run):
        sampled_fixture(run)
        s = run.steps_where(lambda s: s["sampled_draft_prob"] is not None
                            and not np.isnan(s["sampled_draft_prob"]))[0]
        s["sampled_target_prob"], s["sampled_draft_prob"] = 0.05, 0.3


class SampledSupport(Rule):
    """What: the token drawn after the accepted path lies in the target's support:
    its transformed target probability is positive and, when run.json's
    config.sampling.top_k is set, its rank among the target's logits at that node
    (sampled_rank, 0 = argmax) is below top_k.

    Why: top-k and top-p cut tokens out of p; a residual or bonus token outside that
    support cannot come from p or its residual: it was drawn from q, or the filter
    was applied to one side only.

    Example: `the drawn token 77 has rank 12 among the target's logits but top_k is 8`.
    """

    code = "SA803"
    name = "sampled-support"
    message = "the drawn token {token} {what}"

    def check(self, f):
        s = _sampled(f)
        if s is None:
            return None
        sp = ((f.manifest.get("config") or {}).get("sampling") or {})
        k = sp.get("top_k")
        use = s.usable
        use = use & ~s.token_unknown           # a drawn token the engine cut away: nothing to check
        zero = use & (s.token_target_prob <= 0)
        over = use & (s.rank >= k) if isinstance(k, int) and k >= 1 else np.zeros(f.R, dtype=bool)
        bad = zero | over
        what = lambda i: ("has target probability 0 after the transform: outside the support of p"
                          if zero[i] else f"has rank {s.rank[i]} among the target's logits but top_k is {k}")
        return Hits(bad, token=s.token, what=what)

    def passing(self, run):
        sampled_fixture(run, top_k=5)

    def fail(self, run):
        sampled_fixture(run, top_k=5)
        run.steps[2]["sampled_rank"] = 9


class ExpectedAcceptance(Rule):
    """What: over the whole run, the number of accepted tests lies within the
    interval the recorded probabilities allow: each test accepts with probability
    a = min(1, p/q), so the count has mean sum(a) and variance sum(a(1 - a)) (a
    Poisson-binomial; the binomial when every a is equal); the rule flags a count
    outside mean +- 3.89 sd (two-sided 1e-4, normal approximation), once at least
    30 tests are recorded.

    Why: SA801 checks each test against its own record; a sampler that accepts too
    often and records uniforms to match passes it. The uniforms then stop being
    uniform, and the acceptance rate rises above E[min(1, p/q)], the rate any
    lossless sampler has with these p and q. A drafter that looks better than its
    distributions allow is changing the output distribution.

    Example: `observed acceptance 0.912 (1,823 of 2,000 tests) but the recorded p and
    q give 0.781, 99.99% interval [0.757, 0.805]: accepts too often`.
    """

    code = "SA804"
    name = "expected-acceptance"
    scope = "run"
    message = ("observed acceptance {obs:.4f} ({k:,} of {n:,} tests) but the recorded p and q give "
               "{exp:.4f}, 99.99% interval [{lo:.4f}, {hi:.4f}]: {what}")

    def check(self, run):
        d = run.derived
        n = int(d.get("sampling_tests") or 0)
        if n < MIN_TESTS:
            return None
        k, e, v = int(d["sampling_accepts"]), float(d["sampling_expected"]), float(d["sampling_var"])
        half = Z_RUN * math.sqrt(v) + 0.5   # continuity correction: counts are integers
        lo, hi = e - half, e + half
        if lo <= k <= hi:
            return None
        what = ("accepts too often (the output distribution is not the target's)" if k > hi
                else "accepts too rarely (drafts are rejected that the test would keep)")
        return [self.finding(run_id=run.run_id, obs=k / n, k=k, n=n, exp=e / n, lo=max(lo, 0) / n,
                             hi=min(hi, n) / n, what=what)]

    def passing(self, run):
        sampled_fixture(run)

    def fail(self, run):
        sampled_fixture(run)
        # consistently altered: every accepted test keeps u < p/q, but p/q is now 0.5
        for s in run.steps:
            for j in s["accepted_path"][1:]:
                s["target_prob"][j], s["draft_prob"][j], s["accept_u"][j] = 0.25, 0.5, 0.2


def sampled_fixture(run, top_k=None) -> None:
    """Turn a greedy synthetic FixtureRun into a consistent contract v2 sampled run.

    Per step: each accepted node was tested and passed (p 0.6, q 0.5: a = 1); the
    children tested before it and every child of the last node were tested and
    failed (p 0, q 0.5: a = 0), so the expected acceptance equals the observed one
    exactly; the drawn token is the greedy bonus the commit already ends with.
    """
    run.manifest["schema_version"] = 2
    run.manifest.setdefault("config", {})["sampling"] = {"temperature": 0.8, "top_p": 1.0,
                                                         "top_k": top_k, "seed": 0}
    for s in run.steps:
        par, path = s["parents"], s["accepted_path"]
        N = len(par)
        kids = [[] for _ in range(N)]
        for i in range(1, N):
            kids[par[i]].append(i)
        dp, tp, u = [1.0] + [0.5] * (N - 1), [1.0] + [0.25] * (N - 1), [float("nan")] * N
        for k, j in enumerate(path):
            nxt = path[k + 1] if k + 1 < len(path) else None
            for c in kids[j]:
                if c == nxt:
                    tp[c], u[c] = 0.6, 0.3
                    break
                tp[c], u[c] = 0.0, 0.7
        s["draft_prob"], s["target_prob"], s["accept_u"] = dp, tp, u
        last = path[-1]
        s["sampled_token"] = s["target_argmax"][last]
        s["sampled_prob"], s["sampled_target_prob"], s["sampled_rank"] = 0.3, 0.4, 0
        s["sampled_draft_prob"] = 0.1 if kids[last] else float("nan")
