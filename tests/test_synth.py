"""specaudit.synth: contract-valid rows from the reference semantics (checked by the
independent per-row oracle and by direct assertions), deterministic, chunked writes."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from specaudit.audit.check import check_paths
from specaudit.audit.reference import check_rows
from specaudit.trace.schema import REQUESTS_SCHEMA, STEPS_SCHEMA, mask_hash_from_parents, tree_depths
from specaudit.trace.synth import synth_run_rows, write_synthetic_dataset


@pytest.mark.parametrize("algo,ragged,eos_id", [("chain", False, 0), ("chain", True, 10), ("tree", False, 0),
                                                 ("tree", True, 255)])
def test_rows_follow_the_contract(algo, ragged, eos_id):
    st, rq, m = synth_run_rows(12, algo=algo, ragged=ragged, eos_id=eos_id, seed=3, max_new_tokens=30)
    assert st.schema.equals(STEPS_SCHEMA) and rq.schema.equals(REQUESTS_SCHEMA)
    rows = st.to_pylist()
    assert not check_rows(rows, rq.to_pylist(), m)           # the plain oracle agrees
    budget, topk = m["config"]["budget"], m["config"]["topk"]
    ns = {len(s["node_tokens"]) for s in rows}
    assert max(ns) <= budget + 1 and (len(ns) > 1) == ragged
    for s in rows:                                          # spot the semantics directly
        p = np.asarray(s["parents"])
        d = tree_depths(p[None])[0]
        assert s["positions"] == (s["seq_len"] + d).tolist()
        assert s["mask_hash"] == mask_hash_from_parents(p)
        assert max(np.bincount(p[1:], minlength=1)) <= topk
        path = s["accepted_path"]
        assert s["accepted_depth"] == len(path) - 1
        exp = [s["node_tokens"][x] for x in path[1:]] + [s["target_argmax"][path[-1]]]
        assert s["committed_tokens"] == exp[: s["commit_len"]]
        if not s["finished"]:
            assert s["commit_len"] == len(exp) and eos_id not in exp
    by = {}
    for s in sorted(rows, key=lambda s: (s["request_id"], s["step"])):
        by.setdefault(s["request_id"], []).extend(s["committed_tokens"])
    for r in rq.to_pylist():
        assert r["output_tokens"] == [r["first_token"]] + by.get(r["request_id"], [])
        assert len(r["output_tokens"]) <= 30
        if r["finish_reason"] == "eos":
            assert r["output_tokens"][-1] == eos_id
        else:
            assert len(r["output_tokens"]) == 30


def test_eos_and_length_and_prefill_only_all_occur():
    st, rq, m = synth_run_rows(60, seed=1, eos_frac=0.5, zero_step_frac=0.1, max_new_tokens=20)
    reasons = {r["finish_reason"] for r in rq.to_pylist()}
    assert reasons == {"eos", "length"}
    assert any(len(r["output_tokens"]) == 1 for r in rq.to_pylist())       # ended at the first token
    fin = [s for s in st.to_pylist() if s["finished"]]
    assert any(s["commit_len"] < s["accepted_depth"] + 1 for s in fin)    # a commit cut short
    assert any(0 in s["committed_tokens"][:-1] or s["committed_tokens"][-1] == 0 for s in fin)


def test_deterministic_by_seed():
    a = synth_run_rows(5, algo="tree", seed=9)
    b = synth_run_rows(5, algo="tree", seed=9)
    c = synth_run_rows(5, algo="tree", seed=10)
    assert a[0].equals(b[0]) and a[1].equals(b[1]) and a[2] == b[2]
    assert not a[0].equals(c[0])


def test_reported_follows_the_declared_conventions():
    st, rq, m = synth_run_rows(10, seed=2, conventions={"mean": "per_request", "accept_length": "excludes_bonus"})
    rows = st.to_pylist()
    per = {}
    for s in rows:
        per.setdefault(s["request_id"], []).append(s["accepted_depth"])
    want = float(np.mean([np.mean(v) for v in per.values()]))
    assert m["reported"]["mean_accepted_depth"] == pytest.approx(want)
    assert m["reported"]["mean_accept_length"] == pytest.approx(want)       # no bonus
    assert m["conventions"] == {"mean": "per_request", "accept_length": "excludes_bonus"}


def test_write_synthetic_dataset_in_chunks(tmp_path):
    run_dir = write_synthetic_dataset(tmp_path, 30_000, n_nodes=6, algo="tree", chunk_steps=8_000,
                                      row_group_size=3_000)
    files = sorted(run_dir.glob("steps-*.parquet"))
    assert len(files) >= 4
    n = sum(pq.read_metadata(f).num_rows for f in files)
    assert 30_000 <= n < 40_000
    m = json.loads((run_dir / "run.json").read_text())
    assert m["reported"]["verify_steps"] == n
    res = check_paths([tmp_path])
    assert res.steps == n and dict(res.counts) == {}
