"""Faults the runtime can inject into its own code paths (`--inject NAME`).

A fault changes what the runtime computes or reports, never the trace afterwards: the
tracer writes whatever the runtime handed it, exactly as it would for a real bug.
`revealed_by` says which tool must reveal it: `check` when a recorded counter or
tensor lies, or when an `--oracle` run's output stops being lossless; `diff` when
every record is true and only acceptance suffers; `lossless` when every record is
consistent and only the output distribution moves (`specaudit lossless` finds it).
Faults marked `sampled` live in speculative sampling and need `--temperature > 0`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    name: str
    revealed_by: str  # "check" or "diff"
    breaks: str
    algos: tuple = ("chain", "tree")  # where the fault has an effect
    sampled: bool = False             # lives in speculative sampling (--temperature > 0)


FAULTS = {f.name: f for f in (
    Fault("commit-counter", "check",
          "the step counters read the wrong variables: accepted_depth is the number of "
          "drafted nodes and commit_len is 1 + (any draft accepted); the committed tokens "
          "stay right (the seed case: depth 7.00 next to commit 2.00 on a chain)"),
    Fault("position-off-by-one", "check",
          "verify positions are seq_len + depth + 1: every node is shifted one position"),
    Fault("causal-mask-on-tree", "check",
          "the tree is verified with a plain causal mask instead of ancestor-or-self "
          "visibility (no effect on a chain, where the two are the same)", ("tree",)),
    Fault("bonus-double-count", "check",
          "the bonus token is counted as an accepted draft: accepted depth and accepted "
          "tokens are one too high per step, so the accept rate can exceed 1"),
    Fault("eos-overcount", "check",
          "drafts after an EOS are still counted and committed: the commit is not cut at EOS"),
    Fault("stale-draft", "diff",
          "the drafter's previous proposal is reused instead of a fresh one: every record "
          "is true, acceptance drops"),
    Fault("kv-compaction", "check",
          "after accepting a branch of a tree the KV rows of nodes 0..depth are kept in "
          "node order instead of the accepted path's rows; later predictions (and the "
          "output, against --oracle) go wrong (no effect on a chain)", ("tree",)),
    # speculative sampling (runtime/sampling.py); SA8xx rules and `specaudit lossless`
    Fault("greedy-accept", "check",
          "sampling: a draft is accepted when it equals the target's argmax instead of when "
          "u < p/q; the recorded p, q and u contradict the decisions (SA801)", sampled=True),
    Fault("ratio-inverted", "check",
          "sampling: the acceptance test divides q by p (u < q/p): unlikely drafts pass, "
          "likely ones fail (SA801)", sampled=True),
    Fault("residual-from-p", "check",
          "sampling: after a rejection the replacement is drawn from p instead of "
          "norm(max(0, p - q)): tokens with no residual mass are committed (SA802)", sampled=True),
    Fault("temperature-one-side", "lossless",
          "sampling: the drafter's distribution gets --temperature, the target's stays at 1: "
          "every record is consistent, the output follows the target at T = 1", sampled=True),
    Fault("bonus-from-q", "lossless",
          "sampling: after a fully accepted proposal the bonus token is drawn from the drafter's "
          "q instead of the target's p (SA803 too, when a draw leaves p's top-k)",
          sampled=True),
)}


def get_fault(name: str | None) -> Fault | None:
    if name is None:
        return None
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    return FAULTS[name]


def describe_faults() -> str:
    """One line per fault: name, what reveals it, what it breaks."""
    w = max(len(n) for n in FAULTS)
    return "\n".join(f"{f.name:<{w}}  {f.revealed_by:<8}  {f.breaks}" for f in FAULTS.values())
