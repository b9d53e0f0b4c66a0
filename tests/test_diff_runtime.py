"""`specaudit diff` on the reference runtime: chain == topk=1 tree, and every fault's class.

Each injected fault (conftest `fault_run`) is diffed against a clean twin run with the same
configuration. What each fault changes decides its class:
  commit-counter, bonus-double-count   counters only                 -> metric, step 0
  position-off-by-one                  verify positions              -> verify (positions)
  causal-mask-on-tree                  verify mask (trees)           -> verify (mask)
  stale-draft                          the proposal                  -> draft, from step 1
  kv-compaction                        the KV cache after a branch   -> verify, same positions and mask
  eos-overcount                        the commit at the EOS step    -> metric (committed tokens): the
                                       drafts and predictions are identical; only what the engine
                                       appended differs, so it is bookkeeping, and the outputs diverge
"""
from __future__ import annotations

import json

import pytest

from specaudit.audit.diff import diff_runs
from specaudit.cli import main


@pytest.fixture(scope="module")
def twin(make_run, tmp_path_factory):
    """twin(algo, eos_id=None) -> the clean run fault_run's config would give, cached."""
    cache = {}

    def _get(algo, eos_id=None):
        key = (algo, eos_id)
        if key not in cache:
            kw = {"algo": algo, "budget": 7 if algo == "chain" else 12, "topk": 1 if algo == "chain" else 3}
            if eos_id is not None:
                kw["eos_id"] = eos_id
            cache[key] = make_run(out=tmp_path_factory.mktemp(f"twin-{algo}"), oracle=True, **kw)
        return cache[key]
    return _get


def fault_vs_twin(fault_run, twin, name, algo):
    _, res = fault_run(name, algo)
    clean = twin(algo, 10 if name == "eos-overcount" else None)
    return diff_runs(clean.run_dir, res.run_dir), clean


def test_chain_equals_topk1_tree(clean_dataset):
    """A chain and a topk=1 tree of the same block are the same computation: diff is clean."""
    _, results = clean_dataset
    chain = next(r for r in results if r.manifest["config"]["algo"] == "chain"
                 and r.manifest["config"]["concurrency"] == 1)
    tree1 = next(r for r in results if r.manifest["config"]["algo"] == "tree"
                 and r.manifest["config"]["topk"] == 1)
    res = diff_runs(chain.run_dir, tree1.run_dir)
    assert res.clean, [(r.request_id, r.cls, r.step, r.what) for r in res.requests if r.cls != "none"]
    assert res.counts["none"] == len(res.requests) == chain.summary["requests"]
    assert sum(r.steps_compared for r in res.requests) == chain.summary["steps"]
    assert "algo" in res.settings_differ and "topk" not in res.settings_differ


# One algorithm per fault keeps the file fast (each run is a real decode); the tree-only
# faults run on a tree, the others alternate so both proposers are covered.
@pytest.mark.parametrize("name,algo", [("commit-counter", "chain"), ("bonus-double-count", "tree")])
def test_counter_faults_are_metric(fault_run, twin, name, algo):
    res, _ = fault_vs_twin(fault_run, twin, name, algo)
    assert res.counts["metric"] == len(res.requests) > 0
    for r in res.requests:
        assert r.step == 0, r.what  # the counters are wrong from the first step
        assert set(r.fields) <= {"accepted_depth", "commit_len"} and r.fields
        if name == "bonus-double-count":
            assert r.fields == ["accepted_depth"]


def test_position_off_by_one_is_verify_positions(fault_run, twin):
    res, _ = fault_vs_twin(fault_run, twin, "position-off-by-one", "chain")
    assert res.counts["verify"] == len(res.requests) > 0
    for r in res.requests:
        assert (r.step, r.verify_kind) == (0, "positions")
        assert "positions" in r.fields and "mask_hash" not in r.fields
        assert "+1 on every node" in r.what


def test_causal_mask_on_tree_is_verify_mask(fault_run, twin):
    res, _ = fault_vs_twin(fault_run, twin, "causal-mask-on-tree", "tree")
    assert res.counts["verify"] == len(res.requests) > 0
    for r in res.requests:
        assert r.verify_kind == "mask" and "mask_hash" in r.fields and "positions" not in r.fields
        assert "positions agree" in r.what


def test_stale_draft_is_draft(fault_run, twin):
    res, _ = fault_vs_twin(fault_run, twin, "stale-draft", "chain")
    diverged = [r for r in res.requests if r.cls != "none"]
    # a request whose stale proposal always equals the fresh one (a run of spaces, say) is
    # rightly identical; every other request diverges at its drafts
    assert len(diverged) >= len(res.requests) // 2
    for r in diverged:
        assert r.cls == "draft" and r.step >= 1, r.what  # step 0 has no previous proposal to reuse
        assert "node_tokens" in r.fields


def test_kv_compaction_is_verify_same_input(fault_run, twin):
    res, _ = fault_vs_twin(fault_run, twin, "kv-compaction", "tree")
    diverged = [r for r in res.requests if r.cls != "none"]
    assert diverged, "no request accepted a branch: the fixture no longer exercises compaction"
    for r in diverged:
        assert r.cls == "verify" and r.verify_kind == "same-input", (r.cls, r.what)
        assert r.step >= 1  # the cache goes wrong after the first accepted branch
        assert "positions and mask hash agree" in r.what


def test_eos_overcount_is_metric_commit(fault_run, twin):
    import pyarrow.parquet as pq
    res, clean = fault_vs_twin(fault_run, twin, "eos-overcount", "chain")
    diverged = [r for r in res.requests if r.cls != "none"]
    assert diverged, "no commit ran past an EOS: the fixture no longer exercises the fault"
    steps = [r for f in sorted(clean.run_dir.glob("steps-*.parquet"))
             for r in pq.read_table(f, partitioning=None).to_pylist()]
    for r in diverged:
        assert r.cls == "metric" and "committed_tokens" in r.fields, r.what
        assert "outputs diverge" in r.what
        row = next(s for s in steps if s["request_id"] == r.request_id and s["step"] == r.step)
        assert row["finished"] and row["committed_tokens"][-1] == 10  # the clean commit ends at EOS


def test_cli_json_on_fault(capsys, fault_run, twin):
    _, res = fault_run("stale-draft", "chain")
    clean = twin("chain")
    code = main(["diff", str(clean.run_dir), str(res.run_dir), "--output-format", "json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 1
    assert d["counts"]["draft"] >= 1 and d["counts"]["draft"] + d["counts"]["none"] == len(d["requests"])
    assert d["settings_differ"] == {"fault": [None, "stale-draft"]}
    assert all(set(r) >= {"request_id", "class", "step"} for r in d["requests"])
    # a dataset folder holding one run works as well as the run folder
    code = main(["diff", str(clean.run_dir.parent), str(clean.run_dir)])
    assert code == 0 and "none " in capsys.readouterr().out
