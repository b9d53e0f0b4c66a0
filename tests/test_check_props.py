"""Property tests: synthetic valid runs always pass; single-field mutations are flagged
exactly as the plain per-row oracle (specaudit.check_reference) flags them."""
from __future__ import annotations

import copy
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specaudit.invariants.fixtures import FixtureRun, _table

from specaudit.audit.check import check_tables
from specaudit.audit.reference import check_rows
from specaudit.trace.schema import REQUESTS_SCHEMA, STEPS_SCHEMA
from specaudit.trace.synth import synth_run_rows

# SPECAUDIT_EXAMPLES=2000 for a long hunt; CI keeps it short
SETTINGS = settings(max_examples=int(os.environ.get("SPECAUDIT_EXAMPLES", 40)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
STEP_REQUEST_SCOPES = ("SA1", "SA2", "SA3", "SA4")

run_params = st.fixed_dictionaries({
    "algo": st.sampled_from(["chain", "tree"]),
    "seed": st.integers(0, 10_000),
    "ragged": st.booleans(),
    "n_requests": st.integers(1, 6),
    "budget": st.integers(1, 9),
    "max_new_tokens": st.integers(2, 40),
    "eos_id": st.sampled_from([0, 10, 255]),
    "eos_frac": st.floats(0, 1),
    "accept_p": st.floats(0, 0.95),
    "concurrency": st.integers(1, 4),
    "zero_step_frac": st.sampled_from([0.0, 0.3]),
    "conventions": st.sampled_from([None, {"mean": "per_request"}, {"accept_length": "excludes_bonus"},
                                    {"mean": "per_request", "accept_length": "excludes_bonus"}]),
})


def _run(params):
    p = dict(params)
    if p["algo"] == "tree":
        p["topk"] = min(3, p["budget"])
    return synth_run_rows(**p)


def _engine_hits(res):
    """(code, request, step) of every step/request finding (step -1 for request scope)."""
    return {(f.code, str(f.request_id), -1 if f.step is None else f.step) for f in res.findings
            if f.code[:3] in STEP_REQUEST_SCOPES}


@SETTINGS
@given(run_params)
def test_valid_synthetic_runs_always_pass(params):
    steps, requests, manifest = _run(params)
    res = check_tables(steps, requests, manifest, max_per_code=0)
    assert res.counts == {}, [f.message for f in res.findings[:5]]
    oracle = check_rows(steps.to_pylist(), requests.to_pylist(), manifest)
    assert not oracle


# ------------------------------------------------------------ mutations

def _path_step(s):
    return len(s["accepted_path"]) >= 2


# (name, precondition on the row, mutation(row, value)); each always changes a
# quantity the contract derives, so the checker must flag it
ALWAYS = [
    ("accepted_depth", lambda s: True, lambda s, v: s.update(accepted_depth=s["accepted_depth"] + v)),
    ("commit_len", lambda s: True, lambda s, v: s.update(commit_len=s["commit_len"] + v)),
    ("seq_len", lambda s: True, lambda s, v: s.update(seq_len=s["seq_len"] + v)),
    ("positions", lambda s: True, lambda s, v: s["positions"].__setitem__(
        abs(v) % len(s["positions"]), s["positions"][abs(v) % len(s["positions"])] + v)),
    ("mask_hash", lambda s: True, lambda s, v: s.update(mask_hash=s["mask_hash"] ^ (abs(v) or 1))),
    ("committed_token", lambda s: True, lambda s, v: s["committed_tokens"].__setitem__(
        abs(v) % len(s["committed_tokens"]),
        (s["committed_tokens"][abs(v) % len(s["committed_tokens"])] + abs(v)) % 256 or 1)),
    ("path_edge_argmax", _path_step, lambda s, v: s["target_argmax"].__setitem__(
        s["accepted_path"][0], (s["target_argmax"][s["accepted_path"][0]] + abs(v)) % 256)),
    ("root", lambda s: True, lambda s, v: s["node_tokens"].__setitem__(0, (s["node_tokens"][0] + abs(v)) % 256)),
    ("step", lambda s: True, lambda s, v: s.update(step=s["step"] + v)),
    ("finished", lambda s: True, lambda s, v: s.update(finished=not s["finished"])),
    ("path_truncate", _path_step, lambda s, v: s.update(accepted_path=s["accepted_path"][:-1])),
]


@SETTINGS
@given(run_params, st.sampled_from(ALWAYS), st.sampled_from([-5, -3, -2, -1, 1, 2, 3, 5]), st.integers(0, 10_000))
def test_single_field_mutation_is_flagged_like_the_oracle(params, mutation, value, pick):
    steps, requests, manifest = _run(params)
    rows = steps.to_pylist()
    name, pre, mutate = mutation
    cand = [i for i, s in enumerate(rows) if pre(s)]
    if not cand:
        return
    row = rows[cand[pick % len(cand)]]
    before = copy.deepcopy(row)
    mutate(row, value)
    if row == before:
        return
    mt = _table(rows, STEPS_SCHEMA)
    res = check_tables(mt, requests, manifest, max_per_code=0)
    assert res.errors > 0, f"{name} mutation of {before['request_id']}/{before['step']} not flagged"
    oracle = {k for k in check_rows(rows, requests.to_pylist(), manifest)}
    assert _engine_hits(res) == oracle


ANY_FIELDS = ["accepted_depth", "commit_len", "seq_len", "step", "budget", "topk", "finished",
              "node_tokens", "parents", "positions", "target_argmax", "accepted_path", "committed_tokens"]


@SETTINGS
@given(run_params, st.sampled_from(ANY_FIELDS), st.integers(-3, 300), st.integers(0, 10_000),
       st.integers(0, 10_000))
def test_any_mutation_engine_equals_oracle(params, field, value, pick, idx):
    """Arbitrary single-field edits (some legal, some not): the vectorised engine and
    the per-row oracle flag exactly the same (code, request, step)."""
    steps, requests, manifest = _run(params)
    rows = steps.to_pylist()
    if not rows:
        return
    row = rows[pick % len(rows)]
    v = row[field]
    if isinstance(v, bool):
        row[field] = not v
    elif isinstance(v, list):
        if not v:
            return
        v[idx % len(v)] = value
    else:
        row[field] = value
    res = check_tables(_table(rows, STEPS_SCHEMA), requests, manifest, max_per_code=0)
    oracle = set(check_rows(rows, requests.to_pylist(), manifest))
    assert _engine_hits(res) == oracle


REQUEST_EDITS = ["first_token", "output_tokens", "finish_reason", "reference_tokens", "prompt_tokens"]


@SETTINGS
@given(run_params, st.sampled_from(REQUEST_EDITS), st.integers(0, 300), st.integers(0, 10_000))
def test_request_table_mutation_engine_equals_oracle(params, field, value, pick):
    steps, requests, manifest = _run(params)
    rq = requests.to_pylist()
    r = rq[pick % len(rq)]
    if field == "finish_reason":
        r[field] = ["eos", "length", "abort", "stop"][value % 4]
    elif field == "first_token":
        r[field] = value
    else:
        lst = r[field]
        if not lst:
            return
        lst[value % len(lst)] = value
    res = check_tables(steps, _table(rq, REQUESTS_SCHEMA), manifest, max_per_code=0)
    oracle = set(check_rows(steps.to_pylist(), rq, manifest))
    assert _engine_hits(res) == oracle


@pytest.mark.parametrize("key", ["verify_steps", "drafted_tokens", "accepted_tokens", "committed_tokens",
                                 "generated_tokens", "mean_accepted_depth", "mean_commit_len",
                                 "gen_throughput_tps", "accept_rate", "mean_accept_length"])
@pytest.mark.parametrize("algo", ["chain", "tree"])
def test_every_reported_figure_is_audited(key, algo):
    run = FixtureRun.make(algo, seed=11)
    v = run.reported[key]
    run.reported[key] = v + 1 if isinstance(v, int) else v * 1.1 + 0.05
    res = run.check()
    assert res.errors > 0, key
    assert all(f.code[:3] in ("SA5", "SA6") for f in res.findings), [f.message for f in res.findings]
