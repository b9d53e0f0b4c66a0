"""Triton audit kernels (TRITON_INTERPRET=1 on CPU) against their torch references,
the runtime's own numpy code, a plain-Python oracle, and the contract's vectors.

Each property draws a batch shape with hypothesis and fills it from a seeded numpy
generator (random recursive trees biased deep, chains, stars, one-node trees; ragged
n; argmax that mostly follows a child so walks go deep).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import mask_hash_vectors
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from specaudit.kernels import (
    AUDIT_MAX_N,
    CHAIN_MAX_N,
    NUM_COUNTERS,
    RULES,
    as_uint64,
    audit_step,
    audit_step_ref,
    chain_accept,
    chain_accept_ref,
    decode_flags,
    mask_hash,
    mask_hash_ref,
    new_counters,
    tree_walk,
    tree_walk_ref,
)
from specaudit.kernels._common import require_triton

from specaudit.runtime.engine import cut_commit
from specaudit.runtime.metrics import SpecMetrics
from specaudit.runtime.proposer import Draft
from specaudit.runtime.verifier import accept_greedy, build_batch
from specaudit.trace.schema import ancestor_mask
from specaudit.trace.schema import mask_hash as np_mask_hash

PROP = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------ generators
def make_batch(kind: str, B: int, N: int, seed: int, ragged: bool = True) -> dict:
    """Random padded batch like the runtime's VerifyBatch: numpy int64 arrays."""
    rng = np.random.default_rng(seed)
    V = int(rng.integers(2, 6))  # small vocab: siblings collide, matches are common
    n = rng.integers(1, N + 1, size=B) if ragged and rng.random() < 0.6 else np.full(B, N)
    parents = np.full((B, N), -1, dtype=np.int64)
    tokens = np.zeros((B, N), dtype=np.int64)
    for b in range(B):
        chain_p = rng.random()  # per row: how deep the tree leans
        for i in range(1, n[b]):
            if kind == "chain":
                parents[b, i] = i - 1
            elif kind == "star":
                parents[b, i] = 0
            else:
                parents[b, i] = i - 1 if rng.random() < chain_p else rng.integers(0, i)
        tokens[b, : n[b]] = rng.integers(0, V, size=n[b])
    # argmax follows a random child's token 80% of the time
    argmax = rng.integers(0, V, size=(B, N)).astype(np.int64)
    for b in range(B):
        for i in range(n[b]):
            kids = [c for c in range(1, n[b]) if parents[b, c] == i]
            if kids and rng.random() < 0.8:
                argmax[b, i] = tokens[b, rng.choice(kids)]
    return dict(tokens=tokens, parents=parents, n=n.astype(np.int64), argmax=argmax, V=V, rng=rng)


@st.composite
def batches(draw, kinds=("tree", "chain", "star", "single"), max_b=16, max_n=64):
    kind = draw(st.sampled_from(kinds))
    B = draw(st.integers(1, max_b))
    N = 1 if kind == "single" else draw(st.integers(1, max_n))
    return make_batch(kind, B, N, draw(st.integers(0, 2**32 - 1)))


def t(x, dtype=torch.int64):
    return torch.as_tensor(np.ascontiguousarray(x)).to(dtype)


# ------------------------------------------------------------ plain-Python oracle
def oracle_row(tok, par, am, n, *, chain, eos, rd, rc, fin, vis=None, pos=None, seq=None):
    """One request's broken rules, by loops over the contract's words."""
    N = len(tok)
    nn = min(max(int(n), 1), N)
    edge = lambda c: 0 <= par[c] < c
    tree_bad = par[0] != -1 or any(not edge(c) for c in range(1, nn)) or not 1 <= n <= N
    if chain:
        tree_bad |= any(par[c] != c - 1 for c in range(1, nn))
    path = [0]
    while True:
        kids = [c for c in range(1, nn) if edge(c) and par[c] == path[-1] and tok[c] == am[path[-1]]]
        if not kids:
            break
        path.append(min(kids))
    d = len(path) - 1
    commit = [am[x] for x in path]  # accepted drafts then the bonus
    k = commit.index(eos) if eos >= 0 and eos in commit else None
    bad = {"tree": tree_bad, "depth": rd != d,
           "commit": not (1 <= rc <= d + 1) if fin else rc != d + 1,
           "eos": k is not None and (rc > k + 1 or not fin), "mask": False, "positions": False}
    depth = [0] * nn
    anc = [{i} for i in range(nn)]
    for i in range(1, nn):
        if edge(i):
            depth[i] = depth[par[i]] + 1
            anc[i] = anc[par[i]] | {i}
    if vis is not None:
        bad["mask"] = any(bool(vis[i][j]) != (j in anc[i]) for i in range(nn) for j in range(nn))
    if pos is not None:
        bad["positions"] = any(pos[i] != seq + depth[i] for i in range(nn))
    return {r for r, v in bad.items() if v}, d, commit[-1]


# ------------------------------------------------------------- contract vectors
def vector_masks():
    out = []
    for v in mask_hash_vectors():
        if "mask_rows" in v:
            V = np.array(v["mask_rows"], dtype=bool)
        else:
            V = ancestor_mask(np.array(v["parents"]))
        out.append((v["name"], V, v["mask_hash_uint64"]))
    return out


def additive(vis: torch.Tensor, style: str) -> torch.Tensor:
    """bool visibility -> the additive float masks engines feed."""
    if style == "bool":
        return vis
    dtype, low = {"f32-inf": (torch.float32, float("-inf")),
                  "bf16-min": (torch.bfloat16, torch.finfo(torch.bfloat16).min),
                  "f16-1e4": (torch.float16, -1.0e4)}[style]
    return torch.where(vis, torch.zeros((), dtype=dtype), torch.full((), low, dtype=dtype)).contiguous()


@pytest.mark.parametrize("style", ["bool", "f32-inf", "bf16-min", "f16-1e4"])
@pytest.mark.parametrize("fn", [mask_hash, mask_hash_ref], ids=["triton", "torch"])
def test_mask_hash_contract_vectors(fn, style):
    for name, V, want in vector_masks():
        got = as_uint64(fn(additive(torch.from_numpy(V)[None], style)))[0]
        assert int(got) == want, f"{name}: {int(got):#018x} != {want:#018x}"
        assert int(np_mask_hash(V)) == want  # the numpy implementation agrees too


@pytest.mark.parametrize("fn", [mask_hash, mask_hash_ref], ids=["triton", "torch"])
def test_mask_hash_ragged_batch_of_vectors(fn):
    """All vectors padded into one [B, 70, 70] batch (as the tracer pads): each row
    hashes its own [n, n] block; the padding's garbage must not leak in."""
    vecs = vector_masks()
    Nmax = max(V.shape[0] for _, V, _ in vecs)
    mask = torch.ones((len(vecs), Nmax, Nmax), dtype=torch.bool)  # garbage outside blocks
    for b, (_, V, _) in enumerate(vecs):
        mask[b, : V.shape[0], : V.shape[0]] = torch.from_numpy(V)
    n = torch.tensor([V.shape[0] for _, V, _ in vecs])
    got = as_uint64(fn(mask, n)).tolist()
    assert got == [w for _, _, w in vecs]


# ------------------------------------------------------------------ properties
@PROP
@given(batches(kinds=("chain", "single")), st.sampled_from([torch.int32, torch.int64]))
@example(make_batch("chain", 16, 64, 1), torch.int64)
def test_chain_accept_matches_reference_and_runtime(b, dtype):
    tok, am, n = t(b["tokens"], dtype), t(b["argmax"], dtype), t(b["n"], dtype)
    d_k, bonus_k = chain_accept(tok, am, n)
    d_r, bonus_r = chain_accept_ref(tok, am, n)
    assert d_k.tolist() == d_r.tolist() and bonus_k.tolist() == bonus_r.tolist()
    assert bonus_k.dtype == dtype and d_k.dtype == torch.int32
    paths = accept_greedy(b["tokens"], b["parents"], b["n"], b["argmax"])  # the runtime's walk
    assert d_k.tolist() == [len(p) - 1 for p in paths]
    assert bonus_k.tolist() == [int(b["argmax"][i, p[-1]]) for i, p in enumerate(paths)]


@PROP
@given(batches(), st.sampled_from([torch.int32, torch.int64]))
@example(make_batch("tree", 16, 64, 2), torch.int32)
@example(make_batch("star", 16, 64, 3), torch.int64)
def test_tree_walk_matches_reference_and_runtime(b, dtype):
    args = (t(b["tokens"], dtype), t(b["parents"], dtype), t(b["argmax"], dtype), t(b["n"]))
    path_k, d_k, bonus_k = tree_walk(*args)
    path_r, d_r, bonus_r = tree_walk_ref(*args)
    assert torch.equal(path_k, path_r) and torch.equal(d_k, d_r) and torch.equal(bonus_k, bonus_r)
    paths = accept_greedy(b["tokens"], b["parents"], b["n"], b["argmax"])
    B, N = b["tokens"].shape
    want = np.full((B, N), -1)
    for i, p in enumerate(paths):
        want[i, : len(p)] = p
    assert path_k.tolist() == want.tolist()
    assert bonus_k.tolist() == [int(b["argmax"][i, p[-1]]) for i, p in enumerate(paths)]


@PROP
@given(batches(max_n=80), st.sampled_from(["bool", "f32-inf", "bf16-min"]), st.booleans())
@example(make_batch("tree", 16, 80, 4), "bool", True)
def test_mask_hash_matches_numpy(b, style, corrupt):
    """Random ancestor masks (and corrupted ones, bit flips) hash as schema.mask_hash does."""
    V = ancestor_mask(b["parents"])
    if corrupt:
        rng = b["rng"]
        for _ in range(3):
            r, i, j = (int(rng.integers(0, s)) for s in V.shape)
            V[r, i, j] ^= True
    m = additive(torch.from_numpy(V), style)
    n = t(b["n"])
    want = [int(np_mask_hash(V[r, : k, : k])) for r, k in enumerate(b["n"])]
    assert as_uint64(mask_hash(m, n)).tolist() == want
    assert as_uint64(mask_hash_ref(m, n)).tolist() == want


def perturbed_audit_inputs(b: dict):
    """Engine-like reported counters, mask and positions for a batch, each row honest or
    broken in one random way; returns tensors for audit_step and the oracle's inputs."""
    rng = b["rng"]
    tokens, parents, n, argmax = b["tokens"], b["parents"].copy(), b["n"], b["argmax"]
    B, N = tokens.shape
    chain = bool(rng.random() < 0.3)
    eos = int(rng.integers(-1, b["V"]))
    paths = accept_greedy(tokens, parents, n, argmax)
    rd, rc, fin = np.zeros(B, np.int64), np.zeros(B, np.int64), np.zeros(B, bool)
    for i, p in enumerate(paths):
        committed, reason = cut_commit(tokens[i, p[1:]].tolist(), int(argmax[i, p[-1]]),
                                       int(rng.integers(1, len(p) + 3)), eos if eos >= 0 else -99)
        rd[i], rc[i], fin[i] = len(p) - 1, len(committed), reason is not None
    vis = ancestor_mask(parents)
    depth = np.zeros((B, N), np.int64)
    for i in range(1, N):
        ok = (parents[:, i] >= 0) & (parents[:, i] < i)
        depth[ok, i] = depth[ok, parents[ok, i]] + 1
    seq = rng.integers(0, 500, size=B)
    pos = seq[:, None] + depth
    for r in range(B):
        how = rng.integers(0, 10)
        if how == 1:
            rd[r] += rng.choice([-1, 1, 2])
        elif how == 2:
            rc[r] += rng.choice([-1, 1])
        elif how == 3:
            fin[r] = not fin[r]
        elif how == 4:
            i, j = rng.integers(0, n[r], size=2)
            vis[r, i, j] ^= True
        elif how == 5:
            pos[r, rng.integers(0, n[r])] += 1
        elif how == 6 and n[r] > 1:
            parents[r, rng.integers(1, n[r])] = rng.choice([-1, N + 5, 2**33])
        elif how == 7:
            parents[r, 0] = 0
    return dict(chain=chain, eos=eos, parents=parents, rd=rd, rc=rc, fin=fin, vis=vis, pos=pos, seq=seq)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(max_n=AUDIT_MAX_N), st.sampled_from(["bool", "f32-inf"]),
       st.sampled_from([torch.int32, torch.int64]), st.booleans())
@example(make_batch("tree", 16, 64, 5), "bool", torch.int64, True)
@example(make_batch("chain", 16, 64, 6), "f32-inf", torch.int32, True)
def test_fused_audit_matches_reference_and_oracle(b, style, dtype, with_optional):
    x = perturbed_audit_inputs(b)
    B, N = b["tokens"].shape
    mask = additive(torch.from_numpy(x["vis"]), style) if with_optional else None
    pos, seq = (t(x["pos"], dtype), t(x["seq"], dtype)) if with_optional else (None, None)
    fin = torch.from_numpy(x["fin"]) if dtype == torch.int64 else t(x["fin"], torch.int32)
    args = (t(b["tokens"], dtype), t(x["parents"]), t(b["n"], dtype), t(b["argmax"], dtype),
            t(x["rd"], dtype), t(x["rc"]), fin)
    kw = dict(chain=x["chain"], eos_id=x["eos"], node_mask=mask, positions=pos, seq_len=seq)
    c_k, c_r = new_counters("cpu"), new_counters("cpu")
    c_k += 5  # counters accumulate; they are never reset by a step
    res_k = audit_step(*args, c_k, **kw)
    res_r = audit_step_ref(*args, c_r, **kw)
    assert res_k.flags.tolist() == res_r.flags.tolist()
    assert res_k.depth.tolist() == res_r.depth.tolist()
    assert res_k.bonus.tolist() == res_r.bonus.tolist()
    assert (c_k - 5).tolist() == c_r.tolist()
    for r, rules in enumerate(decode_flags(res_k.flags)):
        want, d, bonus = oracle_row(
            b["tokens"][r], x["parents"][r], b["argmax"][r], b["n"][r], chain=x["chain"],
            eos=x["eos"], rd=x["rd"][r], rc=x["rc"][r], fin=x["fin"][r],
            vis=x["vis"][r] if with_optional else None, pos=x["pos"][r] if with_optional else None,
            seq=x["seq"][r])
        assert set(rules) == want, f"row {r}"
        assert int(res_k.depth[r]) == d and int(res_k.bonus[r]) == bonus
    assert c_r[-1] == B and c_r[-2] == sum(1 for f in res_r.flags.tolist() if f)
    if with_optional:
        want_h = [int(np_mask_hash(x["vis"][r, : k, : k])) for r, k in enumerate(b["n"])]
        assert as_uint64(res_k.mask_hash).tolist() == want_h
        assert as_uint64(res_r.mask_hash).tolist() == want_h
    else:
        assert res_k.mask_hash is None and res_r.mask_hash is None


# ------------------------------------------------- injected faults, per step
FAULTS = ["commit-counter", "bonus-double-count", "eos-overcount", "causal-mask-on-tree",
          "position-off-by-one"]


def engine_step(b: dict, fault: str | None, algo: str, eos: int):
    """What SpecEngine.step hands the auditor for this verify batch under `fault`, built
    with the runtime's own build_batch, accept_greedy, cut_commit and SpecMetrics."""
    rng = b["rng"]
    tokens, parents, n, argmax = b["tokens"], b["parents"], b["n"], b["argmax"]
    drafts = [Draft(tokens[r, : n[r]], parents[r, : n[r]], np.zeros(n[r], np.float32))
              for r in range(len(n))]
    seq_lens = rng.integers(5, 300, size=len(n))
    vb = build_batch(drafts, seq_lens, "cpu", causal=fault == "causal-mask-on-tree",
                     position_shift=1 if fault == "position-off-by-one" else 0)
    am = argmax[:, : vb.tokens.shape[1]]
    paths = accept_greedy(vb.tokens.numpy(), vb.parents, vb.n_nodes, am)
    metrics = SpecMetrics(fault)
    depths, commits, fins, eos_k = [], [], [], []
    for r, p in enumerate(paths):
        full = am[r, p].tolist()  # accepted drafts then the bonus
        committed, reason = cut_commit(full[:-1], full[-1], int(rng.integers(len(p), len(p) + 3)),
                                       eos, cut_at_eos=fault != "eos-overcount")
        d, c = metrics.step_counters(p, int(vb.n_nodes[r]), committed)
        depths.append(d)
        commits.append(c)
        fins.append(reason is not None)
        eos_k.append(full.index(eos) if eos in full else None)
    hook = dict(algo=algo, node_tokens=vb.tokens, parents=vb.parents, n_nodes=vb.n_nodes,
                target_argmax=torch.from_numpy(am).contiguous(), accepted_depth=depths,
                commit_len=commits, finished=fins, node_mask=vb.node_mask, positions=vb.positions,
                seq_len=seq_lens, eos_id=eos)
    return hook, paths, eos_k


def expected_rules(fault, b, paths, eos_k, hook):
    """The rows each fault must flag, from its definition in runtime/faults.py."""
    out = []
    for r, p in enumerate(paths):
        d, nn = len(p) - 1, int(b["n"][r])
        fin = hook["finished"][r]
        if fault == "commit-counter":
            # depth reads the drafted count; commit reads 1 + (any accepted), which also
            # runs past an EOS at the first commit position
            rules = {"depth"} if nn - 1 != d else set()
            if not fin and d >= 2:
                rules.add("commit")
            if eos_k[r] is not None and hook["commit_len"][r] > eos_k[r] + 1:
                rules.add("eos")
        elif fault == "bonus-double-count":
            rules = {"depth"}
        elif fault == "eos-overcount":
            k = eos_k[r]
            rules = {"eos"} if k is not None and hook["commit_len"][r] > k + 1 else set()
        elif fault == "causal-mask-on-tree":
            par = b["parents"][r, :nn]
            rules = {"mask"} if any(par[i] != i - 1 for i in range(1, nn)) else set()
        elif fault == "position-off-by-one":
            rules = {"positions"}
        else:
            rules = set()
        out.append(rules)
    return out


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("fault", [None] + FAULTS)
def test_fused_audit_catches_each_fault_signature(fault, backend):
    """Runtime-shaped steps: clean steps never flag; each fault flags exactly the rows
    where its per-step signature shows, with its rule."""
    from specaudit.kernels import InlineAuditor
    algo = "chain" if fault in ("commit-counter", "eos-overcount") else "tree"
    seen, steps = set(), 0
    aud = InlineAuditor("cpu", backend=backend)
    for seed in range(6):
        b = make_batch(algo, 8, 13 if algo == "tree" else 8, 1000 * seed + 7, ragged=algo == "tree")
        eos = int(b["rng"].integers(0, b["V"]))
        hook, paths, eos_k = engine_step(b, fault, algo, eos)
        res = aud.audit(**hook)
        got = [set(r) for r in decode_flags(res.flags)]
        assert got == expected_rules(fault, b, paths, eos_k, hook), f"seed {seed}"
        seen |= set().union(*got)
        steps += len(paths)
    snap = aud.read()
    assert snap["steps"] == steps
    if fault is None:
        assert snap["violating_steps"] == 0 and seen == set()
    else:
        rule = {"commit-counter": "depth", "bonus-double-count": "depth", "eos-overcount": "eos",
                "causal-mask-on-tree": "mask", "position-off-by-one": "positions"}[fault]
        assert rule in seen and snap["rules"][rule] > 0, f"{fault} never showed in {snap}"
        if fault == "commit-counter":
            assert snap["rules"]["commit"] > 0


def test_seed_case_depth_seven_commit_two():
    """The chain that reported depth 7.00 next to commit 2.00, unfinished."""
    N = 8
    tok = torch.arange(N)[None]                  # drafts 1..7
    am = torch.arange(1, N + 1)[None]            # the target agrees with every draft
    par = torch.arange(-1, N - 1)[None]
    one = lambda v: torch.tensor([v])
    for fn in (audit_step, audit_step_ref):
        c = new_counters("cpu")
        res = fn(tok, par, one(N), am, one(7), one(2), one(False), c, chain=True)
        assert decode_flags(res.flags) == [["commit"]] and res.depth.tolist() == [7]
        assert res.bonus.tolist() == [8]
        c2 = new_counters("cpu")
        ok = fn(tok, par, one(N), am, one(7), one(8), one(False), c2, chain=True)
        assert decode_flags(ok.flags) == [[]] and c2.tolist() == [0] * 7 + [1]


# ----------------------------------------------------------------- bad input
def _good():
    B, N = 2, 4
    return dict(tok=torch.zeros(B, N, dtype=torch.long), par=torch.tensor([[-1, 0, 1, 2]] * B),
                am=torch.zeros(B, N, dtype=torch.long), n=torch.full((B,), N),
                d=torch.zeros(B, dtype=torch.long), c=torch.ones(B, dtype=torch.long),
                fin=torch.zeros(B, dtype=torch.bool), cnt=new_counters("cpu"))


@pytest.mark.parametrize("fn", [audit_step, audit_step_ref], ids=["triton", "torch"])
@pytest.mark.parametrize("change,msg", [
    (dict(am=torch.zeros(2, 5, dtype=torch.long)), r"target_argmax has shape \[2, 5\], expected \[2, 4\]"),
    (dict(n=torch.full((3,), 4)), r"n_nodes has shape \[3\], expected \[2\]"),
    (dict(tok=torch.zeros(2, 4)), r"node_tokens has dtype float32, expected int32 or int64"),
    (dict(par=torch.zeros(2, 4, dtype=torch.int16)), r"parents has dtype int16"),
    (dict(am=torch.zeros(4, 2, dtype=torch.long).t()), r"target_argmax is not contiguous"),
    (dict(cnt=torch.zeros(8, dtype=torch.int32)), r"counters has dtype int32, expected int64"),
    (dict(cnt=torch.zeros(3, dtype=torch.long)), r"counters has shape \[3\], expected \[8\]"),
    (dict(tok=torch.zeros(1, AUDIT_MAX_N + 1, dtype=torch.long)),
     r"N = 65 nodes, above this kernel's limit of 64"),
    (dict(tok=torch.zeros(2, 0, dtype=torch.long)), r"N = 0 nodes"),
    (dict(d=[0, 0]), r"accepted_depth must be a torch.Tensor, not list"),
])
def test_audit_bad_input_is_refused_before_launch(fn, change, msg):
    g = {**_good(), **change}
    before = g["cnt"].clone()
    with pytest.raises(ValueError, match=msg):
        fn(g["tok"], g["par"], g["n"], g["am"], g["d"], g["c"], g["fin"], g["cnt"])
    assert torch.equal(g["cnt"], before) if g["cnt"].shape == before.shape else True


@pytest.mark.parametrize("fn", [audit_step, audit_step_ref], ids=["triton", "torch"])
def test_audit_bad_optional_inputs(fn):
    g = _good()
    args = (g["tok"], g["par"], g["n"], g["am"], g["d"], g["c"], g["fin"], g["cnt"])
    with pytest.raises(ValueError, match="positions and seq_len go together"):
        fn(*args, positions=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"node_mask has shape \[2, 4, 3\], expected \[2, 4, 4\]"):
        fn(*args, node_mask=torch.ones(2, 4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"node_mask has dtype int64, expected bool or float16"):
        fn(*args, node_mask=torch.ones(2, 4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"node_mask is not contiguous"):
        fn(*args, node_mask=torch.ones(2, 4, 4, dtype=torch.bool).transpose(1, 2))
    assert g["cnt"].tolist() == [0] * NUM_COUNTERS


@pytest.mark.parametrize("fns", [(chain_accept, chain_accept_ref), (tree_walk, tree_walk_ref),
                                 (mask_hash, mask_hash_ref)], ids=["chain", "tree", "hash"])
def test_standalone_kernels_bad_input(fns):
    for fn in fns:
        if fns[0] is mask_hash:
            with pytest.raises(ValueError, match=r"mask has shape \[2, 4, 5\], expected \[B, N, N\]"):
                fn(torch.ones(2, 4, 5, dtype=torch.bool))
            with pytest.raises(ValueError, match="above this kernel's limit of 4096"):
                fn(torch.zeros(1, 4097, 4097, dtype=torch.bool))  # 16 MB
            with pytest.raises(ValueError, match=r"n_nodes has dtype float32"):
                fn(torch.ones(2, 4, 4, dtype=torch.bool), torch.ones(2))
            continue
        tok = torch.zeros(2, 4, dtype=torch.long)
        extra = (tok,) if fns[0] is tree_walk else ()
        with pytest.raises(ValueError, match=r"target_argmax has shape \[2, 3\], expected \[2, 4\]"):
            fn(tok, *extra, torch.zeros(2, 3, dtype=torch.long))
        with pytest.raises(ValueError, match="is not contiguous"):
            fn(tok, *extra, torch.zeros(4, 2, dtype=torch.long).t())
        big = torch.zeros(1, CHAIN_MAX_N + 1, dtype=torch.long)
        with pytest.raises(ValueError, match="above this kernel's limit of 1024"):
            fn(big, *((big,) if extra else ()), big)


def test_triton_refuses_cpu_tensors_without_interpreter():
    class Compiled:  # stands in for a JIT kernel outside the interpreter
        pass
    with pytest.raises(ValueError, match=r"need CUDA tensors \(got cpu\); call x_ref on CPU"):
        require_triton(Compiled(), torch.device("cpu"), "x_ref")
    with pytest.raises(ValueError, match="Triton is not installed; call x_ref"):
        require_triton(None, torch.device("cuda"), "x_ref")


def test_degenerate_shapes():
    """One-node trees and empty batches, through every kernel."""
    tok = torch.tensor([[5], [7]])
    am = torch.tensor([[1], [2]])
    par = torch.tensor([[-1], [-1]])
    assert [x.tolist() for x in chain_accept(tok, am)] == [[0, 0], [1, 2]]
    path, d, bonus = tree_walk(tok, par, am)
    assert path.tolist() == [[0], [0]] and d.tolist() == [0, 0] and bonus.tolist() == [1, 2]
    one_hash = mask_hash(torch.ones(2, 1, 1, dtype=torch.bool))
    assert as_uint64(one_hash).tolist() == [int(np_mask_hash(np.ones((1, 1), bool)))] * 2
    c = new_counters("cpu")
    res = audit_step(tok, par, torch.tensor([1, 1]), am, torch.tensor([0, 0]), torch.tensor([1, 1]),
                     torch.tensor([False, True]), c, chain=True, eos_id=2)
    assert decode_flags(res.flags) == [[], []] and c.tolist()[-2:] == [0, 2]
    e = torch.zeros(0, 3, dtype=torch.long)
    assert chain_accept(e, e)[0].shape == (0,) and tree_walk(e, e, e)[1].shape == (0,)
    assert mask_hash(torch.zeros(0, 3, 3, dtype=torch.bool)).shape == (0,)
    res = audit_step(e, e, e[:, 0], e, e[:, 0], e[:, 0], e[:, 0].bool(), c)
    assert res.flags.shape == (0,) and c.tolist()[-1] == 2


def test_rules_are_eight_counters():
    assert len(RULES) + 2 == NUM_COUNTERS == 8


# ----------------------------------------------------------------- benchmark
def _bench_module():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_kernels.py"
    spec = importlib.util.spec_from_file_location("bench_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of the benchmark")
def test_bench_kernels_says_it_needs_cuda(capsys):
    import json
    assert _bench_module().main([]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last)["skipped"] == "needs CUDA"


def test_bench_kernels_dry_run_plumbing(capsys):
    """The benchmark's inputs, agreement checks, host-sync versions and JSON, on CPU."""
    import json
    bench = _bench_module()
    assert bench.main(["--dry-run", "--sizes", "3x8", "--iters", "1", "--host-iters", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert [r["kernel"] for r in summary["results"]] == list(bench.KERNELS)
    for r in summary["results"]:
        assert r["B"] == 3 and r["N"] == 8 and r["triton_us"] > 0 and r["host_sync_us"] > 0
    assert summary["meets_target_graph"] is None and "dry run" in summary["device"]
    with pytest.raises(SystemExit):
        bench.main(["--sizes", "3by8"])
