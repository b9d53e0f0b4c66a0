"""Faults the runtime can inject into its own code paths (`--inject NAME`).

A fault changes what the runtime computes or reports, never the trace afterwards: the
tracer writes whatever the runtime handed it, exactly as it would for a real bug.
`revealed_by` says which tool must reveal it: `check` when a recorded counter or
tensor lies, or when an `--oracle` run's output stops being lossless; `diff` when
every record is true and only acceptance suffers.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    name: str
    revealed_by: str  # "check" or "diff"
    breaks: str
    algos: tuple = ("chain", "tree")  # where the fault has an effect


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
    return "\n".join(f"{f.name:<{w}}  {f.revealed_by:<5}  {f.breaks}" for f in FAULTS.values())
