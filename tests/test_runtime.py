"""The reference runtime: losslessness, chain/tree equivalence, EOS and limits, units."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import CLEAN_CONFIGS

from specaudit.runtime.engine import SpecConfig, cut_commit
from specaudit.runtime.proposer import propose_chain, propose_tree
from specaudit.runtime.verifier import accept_greedy, build_batch
from specaudit.trace.schema import ancestor_mask, mask_hash, tree_depths


def steps_of(res):
    # file by file: a list of paths would make pyarrow add the hive key run_id again
    return [r for f in sorted(res.run_dir.glob("steps-*.parquet")) for r in pq.ParquetFile(f).read().to_pylist()]


@pytest.mark.parametrize("i", range(len(CLEAN_CONFIGS)), ids=lambda i: "-".join(
    f"{k}{v}" for k, v in CLEAN_CONFIGS[i].items()))
def test_lossless(clean_dataset, i):
    """Speculative output equals plain greedy decoding of the target, token for token."""
    _, results = clean_dataset
    res = results[i]
    assert res.reference is not None and len(res.outputs) == 4
    assert res.outputs == res.reference
    assert res.summary["lossless"] is True
    # and the trace says the same: output = first token + commits in step order
    steps = steps_of(res)
    assert steps, "no step rows"
    by_req = {}
    for s in sorted(steps, key=lambda s: (s["request_id"], s["step"])):
        by_req.setdefault(s["request_id"], []).extend(s["committed_tokens"])
    reqs = {r["request_id"]: r for r in pq.read_table(res.run_dir / "requests.parquet").to_pylist()}
    for rid, r in reqs.items():
        assert r["output_tokens"] == [r["first_token"]] + by_req.get(rid, [])
        assert r["reference_tokens"] == r["output_tokens"]


def test_eos_and_limit_cut_mid_commit(clean_dataset):
    """The fixtures really exercise EOS and the token limit in the middle of a commit."""
    _, results = clean_dataset
    eos_cut = limit_cut = 0
    for res, cfg in zip(results, CLEAN_CONFIGS):
        eos = cfg.get("eos_id", 0)
        for s in steps_of(res):
            full = len(s["accepted_path"])  # accepted drafts + bonus
            if s["finished"] and s["commit_len"] < full:
                if s["committed_tokens"][-1] == eos:
                    eos_cut += 1
                else:
                    limit_cut += 1
    assert eos_cut >= 1, "no EOS inside an accepted prefix in the fixtures"
    assert limit_cut >= 1, "no token-limit cut inside a commit in the fixtures"


def test_tree_topk1_equals_chain(make_run):
    """A tree with topk=1 is the chain: same nodes, same acceptance, same commits."""
    a = make_run(algo="chain", budget=7, topk=1)
    b = make_run(algo="tree", budget=7, topk=1)
    sa, sb = steps_of(a), steps_of(b)
    key = lambda s: (s["request_id"], s["step"])
    sa.sort(key=key)
    sb.sort(key=key)
    assert len(sa) == len(sb)
    for x, y in zip(sa, sb):
        for col in ("node_tokens", "parents", "positions", "mask_hash", "target_argmax",
                    "accepted_path", "committed_tokens"):
            assert x[col] == y[col], col


def test_branching_tree_uses_branches(make_run):
    res = make_run(algo="tree", budget=12, topk=3, concurrency=2)
    steps = steps_of(res)
    assert res.summary["tokens"] > 0
    branched = sum(1 for s in steps if len(set(s["parents"][1:])) < len(s["parents"]) - 1)
    assert branched == len(steps), "a topk=3 tree should branch at every step"
    off_path = sum(1 for s in steps if s["accepted_path"] != list(range(len(s["accepted_path"]))))
    assert off_path >= 1, "no step accepted a node off the first-child chain (compaction untested)"
    assert max(s["batch_size"] for s in steps) == 2


def test_positions_and_mask_are_the_fed_tensors():
    parents = np.array([-1, 0, 0, 1, 1, 2, 3, 5])
    from specaudit.runtime.proposer import Draft
    d = Draft(np.arange(8), parents, np.zeros(8, np.float32))
    vb = build_batch([d], np.array([10]), "cpu")
    assert vb.positions[0].tolist() == (10 + tree_depths(parents[None])[0]).tolist()
    assert int(mask_hash(vb.node_mask.numpy())[0]) == 0xECB8ABC2BAAE7FE3  # contract vector tree_8
    vb2 = build_batch([d], np.array([10]), "cpu", causal=True)
    assert int(mask_hash(vb2.node_mask.numpy())[0]) != 0xECB8ABC2BAAE7FE3


def test_accept_greedy_walks_the_matching_branch():
    # root 0 -> {1: 'a', 2: 'b'}; 2 -> {3: 'c'}; argmax says root->b, b->c, c->z (no child)
    tokens = np.array([[9, 1, 2, 3]])
    parents = np.array([[-1, 0, 0, 2]])
    argmax = np.array([[2, 7, 3, 5]])
    (path,) = accept_greedy(tokens, parents, np.array([4]), argmax)
    assert path.tolist() == [0, 2, 3]
    # padding nodes are never accepted
    (path,) = accept_greedy(tokens, parents, np.array([3]), argmax)
    assert path.tolist() == [0, 2]


def _rand_logprobs(R, K, V, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(R, K, V, generator=g) * 3, -1).numpy()


@pytest.mark.parametrize("seed", range(5))
def test_propose_tree_properties(seed):
    lp = _rand_logprobs(3, 8, 50, seed)
    roots = np.array([1, 2, 3])
    for budget, topk in [(7, 1), (12, 3), (20, 4), (5, 5)]:
        for d in propose_tree(roots, lp, budget, topk):
            n = d.n
            assert n == budget + 1
            assert d.parents[0] == -1 and all(0 <= d.parents[i] < i for i in range(1, n))
            kids = np.bincount(d.parents[1:], minlength=n)
            assert kids.max() <= topk
            # siblings carry distinct tokens (greedy acceptance is unambiguous)
            for p in range(n):
                sib = d.tokens[1:][d.parents[1:] == p]
                assert len(set(sib.tolist())) == len(sib)
            depth = tree_depths(d.parents[None])[0]
            assert depth.max() <= 8
            # best-first is optimal: every chosen node scores at least as high as every
            # candidate left out (a top-k child of a chosen node that is not in the tree)
            score = np.zeros(n)
            for i in range(1, n):
                score[i] = score[d.parents[i]] + d.logprob[i]
            r = int(np.flatnonzero(roots == d.tokens[0])[0])
            top = np.argsort(-lp[r], axis=-1, kind="stable")[:, :topk]  # [K, topk]
            left_out = []
            for p in range(n):
                if depth[p] >= 8:
                    continue
                have = set(d.tokens[1:][d.parents[1:] == p].tolist())
                left_out += [score[p] + lp[r, depth[p], t] for t in top[depth[p]] if t not in have]
            if left_out:
                assert score[1:].min() >= max(left_out) - 1e-5
    # topk = 1 tree is exactly the chain
    c = propose_chain(roots, lp, 7)
    t = propose_tree(roots, lp, 7, 1)
    for a, b in zip(c, t):
        assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()


def test_ancestor_mask_matches_contract_definition():
    parents = np.array([-1, 0, 0, 1, 1, 2, 3, 5])
    V = ancestor_mask(parents)
    for i in range(8):
        anc = {i}
        j = i
        while parents[j] >= 0:
            j = parents[j]
            anc.add(j)
        assert set(np.flatnonzero(V[i]).tolist()) == anc


@pytest.mark.parametrize("accepted,bonus,remaining,expect", [
    ([5, 6], 7, 10, ([5, 6, 7], None)),
    ([5, 0, 6], 7, 10, ([5, 0], "eos")),           # EOS inside the accepted prefix
    ([5, 6], 0, 10, ([5, 6, 0], "eos")),           # EOS as the bonus
    ([5, 6, 7], 8, 2, ([5, 6], "length")),         # limit mid-commit
    ([5, 6], 7, 3, ([5, 6, 7], "length")),         # limit exactly at the end
    ([5, 0], 7, 2, ([5, 0], "eos")),               # both at once: EOS wins
])
def test_cut_commit(accepted, bonus, remaining, expect):
    assert cut_commit(accepted, bonus, remaining, eos_id=0) == expect


def test_eos_overcount_fault_does_not_cut():
    assert cut_commit([5, 0, 6], 7, 10, 0, cut_at_eos=False) == ([5, 0, 6, 7], "eos")


@pytest.mark.parametrize("kw,msg", [
    (dict(budget=0), "budget"), (dict(topk=0), "topk"), (dict(algo="tree", budget=3, topk=4), "exceed"),
    (dict(algo="beam"), "algo"), (dict(fault="nope"), "unknown fault"), (dict(budget=9), "drafter"),
])
def test_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SpecConfig(**kw).validate(drafter_depth=8)


def test_cached_forward_equals_full_forward(models):
    target = models[0]
    x = torch.randint(1, 256, (2, 24))
    with torch.no_grad():
        full, _ = target.forward_train(x)
        cache = target.new_cache(2)
        lens = torch.zeros(2, dtype=torch.long)
        T = 16
        lo, _ = target(x[:, :T], torch.arange(T)[None].expand(2, T), cache, lens,
                       torch.ones(T, T, dtype=torch.bool).tril()[None].expand(2, T, T))
        lens += T
        lo2, _ = target(x[:, T:], (T + torch.arange(8))[None].expand(2, 8), cache, lens,
                        torch.ones(8, 8, dtype=torch.bool).tril()[None].expand(2, 8, 8))
    assert torch.allclose(torch.cat([lo, lo2], 1), full, atol=1e-4)


def test_continuous_batching_and_abort(models, tmp_path):
    """Requests join a running batch between steps; an aborted one is closed as abort."""
    from specaudit.runtime.engine import Request, SpecEngine
    from specaudit.tokenizer import default_prompts, encode
    from specaudit.trace.parquet import ParquetSink
    from specaudit.trace.tracer import Tracer

    target, drafter, _ = models
    tr = Tracer([ParquetSink(tmp_path, "cb")], {"schema_version": 1}, "cb")
    eng = SpecEngine(target, drafter, SpecConfig(concurrency=3, max_new_tokens=40), tracer=tr)
    ps = [encode(p) for p in default_prompts()[:3]]
    a = eng.add(Request("a", ps[0], 40))
    eng.step()
    b = eng.add(Request("b", ps[1], 40))  # joins the running batch
    eng.step()
    assert {r.request_id for r in eng.running} == {"a", "b"}
    eng.abort(a)
    assert a.finish_reason == "abort" and eng.free_slots() == [0, 2]
    c = eng.add(Request("c", ps[2], 40))  # takes the freed slot 0
    assert c.slot == 0
    while eng.running:
        eng.step()
    tr.close(reported=eng.metrics.reported(1.0))
    reqs = {r["request_id"]: r for r in pq.read_table(tmp_path / "run_id=cb" / "requests.parquet").to_pylist()}
    assert reqs["a"]["finish_reason"] == "abort"
    assert reqs["b"]["finish_reason"] in ("eos", "length") and reqs["c"]["finish_reason"] in ("eos", "length")
    # b and c are still lossless after sharing batches with others
    from specaudit.runtime.engine import greedy_generate
    ref, _ = greedy_generate(target, ps[1:], 40, target.eos_id)
    assert [b.output, c.output] == ref
    steps = [r for f in sorted((tmp_path / "run_id=cb").glob("steps-*.parquet"))
             for r in pq.ParquetFile(f).read().to_pylist()]
    assert {s["batch_size"] for s in steps} >= {1, 2}
