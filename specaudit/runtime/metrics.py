"""The runtime's own metrics code: per-step counters and the run's aggregates.

This is the code under audit. It is deliberately separate from the trace writer:
the tracer records whatever these counters say, so a fault injected here reaches the
trace and run.json the way a real metrics bug would.

Words:
    accepted depth  draft tokens accepted this step (depth of the deepest accepted
                    node; the bonus token is not a draft and is not counted)
    commit length   tokens appended to the output this step
                    = accepted depth + 1 (the bonus), cut at EOS or the token limit
"""
from __future__ import annotations

import numpy as np


class SpecMetrics:
    """Counts steps and tokens as an engine's metrics module would."""

    def __init__(self, fault: str | None = None):
        self.fault = fault
        self.verify_steps = 0
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.committed_tokens = 0
        self.first_tokens = 0
        self.sum_depth = 0
        self.sum_commit = 0

    def on_prefill(self) -> None:
        self.first_tokens += 1

    def step_counters(self, path: np.ndarray, n_nodes: int, committed: list[int]) -> tuple[int, int]:
        """(accepted_depth, commit_len) for one request's step, as this engine reports them."""
        depth = len(path) - 1
        commit = len(committed)
        if self.fault == "commit-counter":
            # the bug: reads the drafted-node count and a bool where the sums belong
            depth = n_nodes - 1
            commit = 1 + int(len(path) > 1)
        elif self.fault == "bonus-double-count":
            depth = len(path)  # the bonus token counted as an accepted draft
        self.verify_steps += 1
        self.drafted_tokens += n_nodes - 1
        self.accepted_tokens += depth
        self.committed_tokens += commit
        self.sum_depth += depth
        self.sum_commit += commit
        return depth, commit

    def reported(self, wall_s: float) -> dict:
        s = max(self.verify_steps, 1)
        generated = self.committed_tokens + self.first_tokens
        return {
            "verify_steps": self.verify_steps,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "committed_tokens": self.committed_tokens,
            "generated_tokens": generated,
            "mean_accepted_depth": self.sum_depth / s,
            "mean_commit_len": self.sum_commit / s,
            "gen_throughput_tps": generated / wall_s if wall_s > 0 else 0.0,
            "wall_s": wall_s,
        }
