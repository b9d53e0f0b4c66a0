"""SA5xx: run.json `reported` against the aggregates re-derived from the rows (rule 9).

Every figure is re-derived over all step files (partitions) and ranks of the run;
when a reported figure disagrees, the message names what it does match, if
anything: one partition alone, the bonus counted, steps x configured width, ...
Agreement is decided by specaudit.audit.compare (the one rule every surface uses):
a float at its own printed precision (2.35 matches 2.3478), an integer exactly. Mean conventions
(pooled / per_request) and accept-length conventions are
SA6xx's: a figure that matches another convention is reported there, not here.
"""
from __future__ import annotations

import math

from specaudit.audit.compare import agrees
from specaudit.numfmt import figure as fmt
from specaudit.trace.derived import mean_in

from .base import Rule


def close(reported, derived) -> bool:
    """reported agrees with derived under the one comparison rule (specaudit.audit.compare)."""
    return agrees(reported, derived) is True


def explain(reported, candidates: dict) -> str:
    """' -- it matches <name> (<value>)' for the first candidate that matches."""
    for name, val in candidates.items():
        if val is not None and close(reported, val):
            return f"; it matches {name} ({fmt(val)})"
    return ""


def partition_candidates(run, key: str, scale=None) -> dict:
    parts = run.derived.get("partitions") or {}
    if len(parts) < 2:
        return {}
    out = {}
    for name, p in parts.items():
        v = p[key] if scale is None else scale(p)
        out[f"{name} alone (one of {len(parts)} partitions read as the whole)"] = v
    return out


def mean_of(run, total_key: str, mean_kind: str):
    """Pooled or per-request mean of a per-step quantity."""
    d = run.derived
    per_request = {"accepted": d.get("per_request_mean_depth"), "committed": d.get("per_request_mean_commit")}
    return mean_in(mean_kind, d[total_key], d["steps"], per_request.get(total_key))   # trace/derived.py


class _Agg(Rule):
    """Base for one reported figure: subclasses set key, derive(), candidates()."""

    scope = "run"
    key = ""
    message = "reported {key} = {reported} but the rows give {derived}{explain}"

    def applies(self, run) -> bool:
        return run.complete and self.key in run.reported and run.derived["steps"] > 0

    def derive(self, run):
        raise NotImplementedError

    def candidates(self, run) -> dict:
        return {}

    def skip(self, run, reported) -> bool:
        """True when another rule (SA6xx) owns this mismatch."""
        return False

    def check(self, run):
        if not self.applies(run):
            return None
        rep = run.reported.get(self.key)
        want = self.derive(run)
        if want is None or close(rep, want) or self.skip(run, rep):
            return None
        return [dict(key=self.key, reported=fmt(rep), derived=fmt(want),
                     explain=explain(rep, self.candidates(run)))]

    def fail(self, run):
        v = run.reported[self.key]
        run.reported[self.key] = v + 3 if isinstance(v, int) else v * 1.5 + 0.37


class VerifySteps(_Agg):
    """What: reported verify_steps = the number of step rows, over every partition and
    rank of the run.

    Why: the denominator of every mean; a benchmark that read one rank's counter as
    the whole reports a fraction of the work.

    Example: 4 ranks wrote 4 files of 512 steps and verify_steps says 512.
    """

    code = "SA501"
    name = "verify-steps"
    key = "verify_steps"

    def applies(self, run) -> bool:
        # a finished run with 0 step rows is checked too: reported steps, none written
        return run.complete and self.key in run.reported

    def derive(self, run):
        return run.derived["steps"]

    def candidates(self, run):
        return partition_candidates(run, "steps")


class DraftedTokens(_Agg):
    """What: reported drafted_tokens = the sum over steps of the real draft nodes
    (N - 1), not steps x the configured width.

    Why: ragged and adaptive trees draft fewer nodes than the budget; assuming a
    fixed width understates the accept rate.

    Example: 100 steps of budget 7 with ragged trees of 3 to 7 drafts: drafted 512,
    reported 700 (= steps x width).
    """

    code = "SA502"
    name = "drafted-tokens"
    key = "drafted_tokens"

    def derive(self, run):
        return run.derived["drafted"]

    def candidates(self, run):
        d = run.derived
        return {"steps x the configured width (fixed width assumed)": d["width_sum"],
                "the node count including the root": d["drafted"] + d["steps"],
                **partition_candidates(run, "drafted")}


class AcceptedTokens(_Agg):
    """What: reported accepted_tokens = the sum of accepted draft tokens, len(path) - 1
    per step; the bonus token is not a draft and is not counted.

    Why: counting the bonus as accepted pushes the accept rate above one and every
    acceptance figure up by one token per step.

    Example: 300 accepted drafts over 100 steps reported as 400.
    """

    code = "SA503"
    name = "accepted-tokens"
    key = "accepted_tokens"

    def derive(self, run):
        return run.derived["accepted"]

    def candidates(self, run):
        d = run.derived
        return {"the accepted drafts + one bonus per step (the bonus counted as accepted)":
                d["accepted"] + d["steps"],
                "the drafted tokens (every draft counted as accepted)": d["drafted"],
                **partition_candidates(run, "accepted")}


class CommittedTokensTotal(_Agg):
    """What: reported committed_tokens = the sum of len(committed_tokens) over steps
    (the prefill's first tokens excluded).

    Why: the tokens a user received from verify steps; the numerator of the
    speedup.

    Example: commits of 3.2 tokens per step over 100 steps reported as 200.
    """

    code = "SA504"
    name = "committed-tokens-total"
    key = "committed_tokens"

    def derive(self, run):
        return run.derived["committed"]

    def candidates(self, run):
        d = run.derived
        c = {"the sum of the commit_len counters": d["commit_len_sum"],
             "the committed tokens + first tokens": d["committed"] + (d.get("first_tokens") or 0),
             **partition_candidates(run, "committed")}
        return c


class GeneratedTokens(_Agg):
    """What: reported generated_tokens = the sum of len(output_tokens) over requests
    (first tokens included).

    Why: the numerator of generation throughput.

    Example: 4 requests of 37 tokens reported as 144 (first tokens left out).
    """

    code = "SA505"
    name = "generated-tokens"
    key = "generated_tokens"

    def derive(self, run):
        return run.derived.get("generated")

    def candidates(self, run):
        d = run.derived
        return {"the committed tokens alone (first tokens left out)": d["committed"],
                "the commit_len counters + first tokens": d["commit_len_sum"] + (d.get("first_tokens") or 0)}


def _mean_kind(run) -> str:
    return run.conventions.get("mean", "pooled")


def _other_mean(kind: str) -> str:
    return "per_request" if kind == "pooled" else "pooled"


class _MeanAgg(_Agg):
    """Base for a reported mean of a per-step total: pooled or per-request as declared;
    a figure that matches the other convention is SA602's, not this rule's."""

    total = ""  # mean_of's total_key

    def derive(self, run):
        return mean_of(run, self.total, _mean_kind(run))

    def skip(self, run, rep):
        return close(rep, mean_of(run, self.total, _other_mean(_mean_kind(run))))


class MeanAcceptedDepth(_MeanAgg):
    """What: reported mean_accepted_depth = the mean of len(path) - 1 over steps,
    pooled over all steps (or the mean of per-request means when run.json declares
    conventions.mean = per_request).

    Why: the seed bug: a chain reported mean accepted depth 7.00 (the drafted width)
    next to a mean commit length of 2.00.

    Example: `reported mean_accepted_depth = 7 but the rows give 2.31; it matches the
    drafted nodes per step (7)`.
    """

    code = "SA506"
    name = "mean-accepted-depth"
    key = "mean_accepted_depth"
    total = "accepted"

    def candidates(self, run):
        d = run.derived
        s = d["steps"]
        return {"the drafted nodes per step (the counter reads the draft width)": d["drafted"] / s,
                "the mean depth + 1 (the bonus counted as accepted)": d["accepted"] / s + 1,
                "the mean commit length": d["committed"] / s}


class MeanCommitLen(_MeanAgg):
    """What: reported mean_commit_len = the mean of len(committed_tokens) over steps
    (pooled, or per-request means when declared).

    Why: the tokens a step really gives; the quantity the throughput estimator
    measures independently.

    Example: commits average 3.3 tokens but mean_commit_len says 1.6 (= 1 + the share
    of steps that accepted any draft: the counter reads a boolean).
    """

    code = "SA507"
    name = "mean-commit-len"
    key = "mean_commit_len"
    total = "committed"

    def candidates(self, run):
        d = run.derived
        s = d["steps"]
        h = d.get("depth_hist") or [0]
        any_acc = (s - h[0]) / s if s else 0
        return {"1 + the share of steps that accepted any draft (the counter reads a boolean)": 1 + any_acc,
                "the mean accepted depth (the bonus left out)": d["accepted"] / s,
                "the mean accepted depth + 1 (no EOS or length cut)": d["accepted"] / s + 1}


class AcceptedWithinDrafted(Rule):
    """What: reported accepted_tokens <= reported drafted_tokens, and a reported
    accept_rate is at most 1.

    Why: a draft can be accepted at most once; an accept rate above one means the
    bonus token was counted as an accepted draft (a real engine shipped this).

    Example: accepted 812 of 700 drafted: rate 1.16.
    """

    code = "SA508"
    name = "accepted-within-drafted"
    scope = "run"
    message = "{what}"

    def check(self, run):
        rep = run.reported
        out = []
        a, d = rep.get("accepted_tokens"), rep.get("drafted_tokens")
        if isinstance(a, (int, float)) and isinstance(d, (int, float)) and a > d:
            out.append(dict(what=f"reported accepted_tokens {fmt(a)} exceed drafted_tokens {fmt(d)}: "
                                 f"an accept rate of {a / d if d else float('inf'):.3f} > 1"))
        r = rep.get("accept_rate")
        if isinstance(r, (int, float)) and r > 1 + 1e-9:
            out.append(dict(what=f"reported accept_rate {fmt(r)} is above 1 (the bonus counted as accepted?)"))
        return out

    def fail(self, run):
        run.reported["accepted_tokens"] = run.reported["drafted_tokens"] + 5
        run.reported["accept_rate"] = 1.07


class AcceptRate(_Agg):
    """What: a reported accept_rate (optional key) = accepted drafts / drafted tokens,
    from the rows.

    Why: the classic wrong formulas: (accepted + steps) / (steps x width) puts the
    bonus in the numerator and the root in the denominator and is biased upward at
    every value; steps x width assumes a fixed width.

    Example: `reported accept_rate = 0.44 but the rows give 0.36; it matches
    (accepted + steps) / (steps x width)`.
    """

    code = "SA509"
    name = "accept-rate"
    key = "accept_rate"

    def derive(self, run):
        d = run.derived
        return d["accepted"] / d["drafted"] if d["drafted"] else None

    def candidates(self, run):
        d = run.derived
        s, a, w = d["steps"], d["accepted"], d["width_sum"]
        return {"(accepted + steps) / (steps x width): bonus in the numerator, root in the denominator":
                (a + s) / (w + s) if w + s else None,
                "(accepted + steps) / (steps x width) (the bonus in the numerator)": (a + s) / w if w else None,
                "accepted / (steps x width) (fixed width assumed)": a / w if w else None,
                "(accepted + steps) / drafted (the bonus counted as accepted)":
                (a + s) / d["drafted"] if d["drafted"] else None}

    def fail(self, run):
        run.reported["accept_rate"] = run.reported["accept_rate"] * 0.5 + 0.011


class Throughput(Rule):
    """What: reported gen_throughput_tps = generated tokens / wall_s (both as
    re-derived: generated from the requests table, wall_s as reported).

    Why: throughput is what the estimator cross-checks acceptance against; a
    throughput computed from another count (commits only, one rank) misleads it.

    Example: 1480 tokens in 10 s reported as 144.0 tokens/s.
    """

    code = "SA510"
    name = "throughput"
    scope = "run"
    message = ("reported gen_throughput_tps = {reported} but {generated} generated tokens / wall_s {wall} "
               "= {want}{explain}")

    def check(self, run):
        rep = run.reported
        t, wall, gen = rep.get("gen_throughput_tps"), rep.get("wall_s"), run.derived.get("generated")
        if not run.complete or t is None or not isinstance(wall, (int, float)) or wall <= 0 or gen is None:
            return None
        want = gen / wall
        if close(t, want):
            return None
        d = run.derived
        cand = {"committed tokens / wall_s (first tokens left out)": d["committed"] / wall}
        rg = rep.get("generated_tokens")
        if isinstance(rg, (int, float)) and not close(rg, gen):
            # named without a rule code: SA505 may be deselected or skip this run
            cand["the reported generated_tokens / wall_s (a count the rows do not give)"] = rg / wall
        cand.update(partition_candidates(run, "committed", lambda p: p["committed"] / wall))
        return [dict(reported=fmt(t), generated=gen, wall=fmt(wall), want=fmt(want), explain=explain(t, cand))]

    def fail(self, run):
        run.reported["gen_throughput_tps"] *= 2.0


class AcceptanceByDepth(Rule):
    """What: a reported per-position acceptance (optional key acceptance_by_depth:
    entry d-1 = share of steps that accepted a draft at depth d) equals the rows',
    and the identity mean acceptance length = 1 + sum over depths of acceptance at
    that depth holds for the reported figures.

    Why: with data parallelism one tool divided per-position acceptance by the rank
    count; the identity ties the per-position figures to the mean.

    Example: acceptance [0.4, 0.2, 0.1] reported where the rows give [0.8, 0.4, 0.2]
    (divided by 2 ranks).
    """

    code = "SA511"
    name = "acceptance-by-depth"
    scope = "run"
    message = "{what}"

    def check(self, run):
        rep = run.reported
        acc = rep.get("acceptance_by_depth")
        if not run.complete or not isinstance(acc, list) or not run.derived["steps"]:
            return None
        d = run.derived
        s = d["steps"]
        h = d.get("depth_hist") or [s]
        # share of steps with depth >= k, for k = 1..len(acc)
        ge = [sum(h[k:]) / s for k in range(1, len(acc) + 1)]
        out = []
        bad = [k for k, (a, b) in enumerate(zip(acc, ge, strict=False)) if not close(a, b)]
        if bad:
            k = bad[0]
            ranks = len([p for p in (d.get("partitions") or {}) if p.startswith("rank")]) or \
                int((run.manifest.get("config") or {}).get("data_parallel_size") or 1)
            why = ""
            if ranks > 1 and all(close(a * ranks, b) for a, b in zip(acc, ge, strict=False)):
                why = f"; every entry matches the rows' divided by the rank count {ranks}"
            out.append(dict(what=f"reported acceptance at depth {k + 1} is {fmt(acc[k])} but the rows give "
                                 f"{fmt(ge[k])} ({len(bad)} of {len(acc)} depths differ){why}"))
        mal = rep.get("mean_accept_length")
        conv = run.conventions
        if isinstance(mal, (int, float)) and conv.get("mean", "pooled") == "pooled" \
                and conv.get("accept_length", "includes_bonus") == "includes_bonus":
            ident = 1 + sum(acc)
            if not close(mal, ident):
                out.append(dict(what=f"reported mean_accept_length {fmt(mal)} breaks the identity 1 + the sum "
                                     f"of acceptance_by_depth = {fmt(ident)}"))
        return out

    def fail(self, run):
        run.reported["acceptance_by_depth"] = [a / 2 for a in run.reported["acceptance_by_depth"]]


def declared_absent(manifest: dict) -> dict:
    """run.json `not_reported`: {contract key: why the engine has no such counter}, the
    keys a producer declares it cannot report (a vLLM trace: vLLM counts drafts per step
    with drafts, not verify steps). Anything but a dict of str -> str declares nothing."""
    d = (manifest or {}).get("not_reported")
    if not isinstance(d, dict):
        return {}
    return {k: v for k, v in d.items() if isinstance(k, str) and isinstance(v, str) and v.strip()}


class ReportedPresent(Rule):
    """What: a complete run's run.json has `reported` with every contract key:
    verify_steps, drafted_tokens, accepted_tokens, committed_tokens,
    generated_tokens, mean_accepted_depth, mean_commit_len, gen_throughput_tps,
    wall_s, or declares the key in `not_reported` with the reason (SA514 then says
    what was not checked).

    Why: the engine's own figures are what is under audit; a missing one cannot be
    audited (a warning, not a failure). A key the engine has no counter for is not a
    fault of the engine: declared with its reason, it is reported as not checked,
    never warned about.

    Example: run.json without `reported`.
    """

    code = "SA512"
    name = "reported-present"
    severity = "warning"
    scope = "run"
    message = "run.json `reported` lacks {missing}"

    def check(self, run):
        from specaudit.trace.schema import REPORTED_KEYS
        if not run.complete:
            return None
        absent = declared_absent(run.manifest)
        miss = [k for k in REPORTED_KEYS if k not in run.reported and k not in absent]
        return [dict(missing=", ".join(miss))] if miss else None

    def passing(self, run):   # the keys an engine has no counter for, declared with the reason
        for k in ("verify_steps", "committed_tokens"):
            run.manifest["reported"].pop(k)
        run.manifest["not_reported"] = {"verify_steps": "no such counter", "committed_tokens": "no such counter"}

    def fail(self, run):
        run.manifest.pop("reported", None)


class ReportedDeclaredAbsent(Rule):
    """What: the contract keys a run.json declares in `not_reported` (the engine has no
    counter of that meaning), each with the producer's reason: they were not checked.

    Why: never a bare "no violations" where a figure was not there to audit: the
    output says which reported figures could not be checked and why, in the
    producer's words, as information (the engine is not at fault).

    Example: a vLLM trace: `reported verify_steps, committed_tokens, ... not checked:
    vLLM has no counter of this meaning (its num_drafts counts steps with drafts)`.
    """

    code = "SA514"
    name = "reported-declared-absent"
    severity = "info"
    scope = "run"
    message = "reported {keys} not checked: {why}"

    def check(self, run):
        from specaudit.trace.schema import REPORTED_KEYS
        absent = declared_absent(run.manifest)
        by_why: dict[str, list] = {}
        for k in REPORTED_KEYS:   # contract order; a key both reported and declared is audited
            if k in absent and k not in run.reported:
                by_why.setdefault(absent[k].strip(), []).append(k)
        return [dict(keys=", ".join(ks), why=why) for why, ks in by_why.items()] or None

    def passing(self, run):   # a key declared absent but reported after all is audited, not skipped
        run.manifest["not_reported"] = {"verify_steps": "no such counter"}

    def fail(self, run):
        run.manifest["reported"].pop("verify_steps")
        run.manifest["not_reported"] = {"verify_steps": "this engine has no verify-step counter"}


class ReportedSign(Rule):
    """What: reported counts and means are numbers and never negative.

    Why: a step that generated nothing once reported -1 accepted tokens and crashed
    the counter; a negative or non-numeric figure is always a bug.

    Example: reported accepted_tokens = -1.
    """

    code = "SA513"
    name = "reported-sign"
    scope = "run"
    message = "reported {key} = {value}: {what}"

    def check(self, run):
        out = []
        for k, v in run.reported.items():
            if k == "acceptance_by_depth":
                vals = v if isinstance(v, list) else [v]
            else:
                vals = [v]
            for x in vals:
                if isinstance(x, bool) or not isinstance(x, (int, float)):
                    out.append(dict(key=k, value=repr(x), what="not a number"))
                    break
                if x < 0 or (isinstance(x, float) and math.isnan(x)):
                    out.append(dict(key=k, value=fmt(x), what="a count or mean is never negative"))
                    break
        return out

    def fail(self, run):
        run.reported["accepted_tokens"] = -1
