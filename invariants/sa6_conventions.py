"""SA6xx: conventions of other engines, declared in run.json `conventions`.

    "conventions": {"accept_length": "includes_bonus" | "excludes_bonus",
                    "mean": "pooled" | "per_request"}

accept_length governs the optional reported key `mean_accept_length` (and a
client's per-request accept_length): includes_bonus = accepted drafts + 1 per
step (SGLang's "accept len", vLLM's "mean acceptance length"); excludes_bonus =
accepted drafts only. mean governs every reported mean: pooled over all steps, or
the mean of per-request means. The checker derives the figure under every
convention and says which one the reported number matches.
"""
from __future__ import annotations

from specaudit.trace.schema import CONVENTIONS

from .base import Rule
from .sa5_aggregates import close, fmt, mean_of


class ConventionsDeclared(Rule):
    """What: run.json `conventions` names only known conventions with known values:
    accept_length in includes_bonus | excludes_bonus, mean in pooled | per_request.

    Why: an unknown declaration cannot be honoured; the checker would audit the
    numbers against the wrong definition.

    Example: "conventions": {"accept_length": "with_bonus"}.
    """

    code = "SA601"
    name = "conventions-declared"
    scope = "run"
    message = "run.json conventions.{key} = {value!r} is not one of {allowed}"

    def check(self, run):
        conv = run.manifest.get("conventions")
        if conv is None:
            return None
        if not isinstance(conv, dict):
            return [dict(key="*", value=conv, allowed="an object")]
        out = []
        for k, v in conv.items():
            allowed = CONVENTIONS.get(k)
            if allowed is None:
                out.append(dict(key=k, value=v, allowed=f"the known conventions ({', '.join(CONVENTIONS)})"))
            elif v not in allowed:
                out.append(dict(key=k, value=v, allowed=" | ".join(allowed)))
        return out

    def fail(self, run):
        run.manifest["conventions"]["accept_length"] = "with_bonus"


class MeanConvention(Rule):
    """What: a reported mean (mean_accepted_depth, mean_commit_len) that disagrees with
    the declared mean convention but equals the other one.

    Why: one tool averaged per-request means, another pooled over steps; both were
    right about different things and the numbers disagreed. The manifest must say
    which one the engine computes.

    Example: `reported mean_commit_len 3.41 is the per_request mean, but run.json
    declares conventions.mean = pooled (pooled: 3.20)`.
    """

    code = "SA602"
    name = "mean-convention"
    scope = "run"
    message = ("reported {key} {reported} is the {matches} mean, but run.json declares conventions.mean = "
               "{declared} ({declared}: {want}); declare it or fix the metric")

    def check(self, run):
        if not run.complete or not run.derived["steps"]:
            return None
        declared = run.conventions.get("mean", "pooled")
        if declared not in CONVENTIONS["mean"]:
            return None
        other = "per_request" if declared == "pooled" else "pooled"
        out = []
        for key, total in (("mean_accepted_depth", "accepted"), ("mean_commit_len", "committed")):
            rep = run.reported.get(key)
            want, alt = mean_of(run, total, declared), mean_of(run, total, other)
            if rep is None or close(rep, want) or not close(rep, alt):
                continue
            out.append(dict(key=key, reported=fmt(rep), matches=other, declared=declared, want=fmt(want)))
        return out

    def fail(self, run):
        run.manifest["conventions"]["mean"] = "per_request"


class AcceptLengthConvention(Rule):
    """What: a reported mean_accept_length (optional key) equals the rows' under the
    declared conventions (accept_length: includes_bonus adds the bonus token per
    step; mean: pooled or per_request); when it matches another convention the
    message names it.

    Why: "bonus off by one": one component reported mean acceptance length without
    the bonus token and another with it, and dashboards compared the two.

    Example: `reported mean_accept_length 2.31 matches excludes_bonus, pooled, but
    run.json declares includes_bonus, pooled (3.31)`.
    """

    code = "SA603"
    name = "accept-length-convention"
    scope = "run"
    message = "reported mean_accept_length {reported} {verdict}, but run.json declares {declared} ({want})"

    def check(self, run):
        rep = run.reported.get("mean_accept_length")
        if rep is None or not run.complete or not run.derived["steps"]:
            return None
        acc = run.conventions.get("accept_length", "includes_bonus")
        mean = run.conventions.get("mean", "pooled")
        if acc not in CONVENTIONS["accept_length"] or mean not in CONVENTIONS["mean"]:
            return None
        vals = {}
        for m in CONVENTIONS["mean"]:
            depth = mean_of(run, "accepted", m)
            for a in CONVENTIONS["accept_length"]:
                vals[(a, m)] = depth + (1.0 if a == "includes_bonus" else 0.0)
        want = vals[(acc, mean)]
        if close(rep, want):
            return None
        match = next((k for k, v in vals.items() if close(rep, v)), None)
        verdict = f"matches {match[0]}, {match[1]}" if match else \
            "matches no convention (" + ", ".join(f"{a}/{m}: {fmt(v)}" for (a, m), v in vals.items()) + ")"
        return [dict(reported=fmt(rep), verdict=verdict, declared=f"{acc}, {mean}", want=fmt(want))]

    def fail(self, run):
        run.reported["mean_accept_length"] -= 1.0
