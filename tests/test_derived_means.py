"""Derived mean accepted depth and commit length: one definition (specaudit/trace/derived.py)
with the conventions of trace-schema.md (depth = len(accepted_path) - 1, commit =
len(committed_tokens), bonus in the commit; a run's declared `mean` is pooled over steps or
the mean of per-request means), so `specaudit run`'s summary (traced_run.py), `specaudit diff`, the post-mortem's
figures view and the synthetic runs' `reported` give one figure for one trace."""
from __future__ import annotations

import json

import pytest

from specaudit.audit.diff import diff_runs
from specaudit.postmortem.sql_guard import fetch_arrow
from specaudit.postmortem.views import connect
from specaudit.trace.synth import synth_run_rows, write_run
from specaudit.traced_run import derived_means


@pytest.mark.parametrize("conventions", [{"mean": "per_request"}, {"mean": "pooled"},
                                         {"mean": "per_request", "accept_length": "excludes_bonus"}])
def test_run_summary_and_diff_derive_the_same_means(tmp_path, conventions):
    # requests of very different lengths (eos_frac: some stop after a step or two), so the
    # mean of per-request means is far from the pooled mean: the convention matters
    steps, reqs, man = synth_run_rows(12, seed=3, eos_frac=0.6, max_new_tokens=64, conventions=conventions)
    run_dir = write_run(tmp_path / "ds", steps, reqs, man)
    declared = json.loads((run_dir / "run.json").read_text())["conventions"]
    assert declared["mean"] == conventions["mean"]
    ours = derived_means(run_dir, [])
    rows = diff_runs(run_dir, run_dir).acceptance["A"]["rows_in_declared_conventions"]
    con = connect([tmp_path / "ds"])
    sql = {r["metric"]: r["derived"] for r in fetch_arrow(con, "SELECT metric, derived FROM figures").to_pylist()}
    con.close()
    for k in ("mean_accepted_depth", "mean_commit_len"):
        assert ours[k] == round(rows[k], 3), (k, ours, rows)
        assert ours[k] == round(man["reported"][k], 3), (k, ours, man["reported"])   # synth's honest reported
        assert sql[k] == pytest.approx(rows[k], rel=1e-12), (k, sql, rows)             # the post-mortem's figures


def test_the_convention_matters_on_this_trace(tmp_path):
    """The fixture above is not vacuous: pooled and per-request means differ on it."""
    steps, reqs, man = synth_run_rows(12, seed=3, eos_frac=0.6, max_new_tokens=64)
    pooled = derived_means(write_run(tmp_path / "a", steps, reqs, man), [])
    steps, reqs, man = synth_run_rows(12, seed=3, eos_frac=0.6, max_new_tokens=64, conventions={"mean": "per_request"})
    per_request = derived_means(write_run(tmp_path / "b", steps, reqs, man), [])
    assert abs(pooled["mean_commit_len"] - per_request["mean_commit_len"]) > 0.05, (pooled, per_request)
