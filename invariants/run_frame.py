"""RunFrame: what run rules see, one run's manifest and the aggregates re-derived."""
from __future__ import annotations


class RunFrame:
    """One run: manifest, reported, conventions, and the aggregates re-derived.

    derived: steps, drafted (sum of N - 1), accepted (sum of len(path) - 1),
    accepted_counter (sum of accepted_depth), committed (sum of len(committed_tokens)),
    commit_len_sum, generated (sum of len(output_tokens), complete runs), requests,
    per_request_mean_depth / per_request_mean_commit (mean of per-request means),
    width_sum (steps x budget), depth_hist (steps by true depth), wall_s (from
    t_start/step_s), partitions: {name: same counters for that file or rank}.
    R = 1 (one row), so step-style rules work unchanged.
    """

    def __init__(self, run_id: str, manifest: dict | None, derived: dict, complete: bool,
                 conventions: dict, incomplete_reason: str | None = None):
        self.run_id = run_id
        self.manifest = manifest or {}
        self.reported = (manifest or {}).get("reported") or {}
        self.derived = derived
        self.complete = complete
        self.conventions = conventions
        self.incomplete_reason = incomplete_reason
        self.config = (manifest or {}).get("config") or {}
        self.R = 1
