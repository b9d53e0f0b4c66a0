"""Speculative sampling (issue 16): the transform, the acceptance rules, contract v2,
the SA8xx rules on real runs, every sampling fault caught, `specaudit lossless`."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from specaudit.audit.check import check_paths
from specaudit.audit.lossless import compare, compare_datasets, n_needed, run_reference
from specaudit.cli import main
from specaudit.runtime.sampling import SamplingParams, categorical, transform, verify_sampled
from specaudit.trace.schema import SAMPLING_COLUMNS, STEPS_SCHEMA

# ------------------------------------------------------------------ transform


def test_transform_temperature_topk_topp():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    p = transform(logits, SamplingParams(1.0))
    assert np.allclose(p, [0.5, 0.3, 0.15, 0.05])
    sharp = transform(logits, SamplingParams(0.5))
    assert np.allclose(sharp, np.array([0.25, 0.09, 0.0225, 0.0025]) / 0.365)
    k2 = transform(logits, SamplingParams(1.0, top_k=2))
    assert np.allclose(k2, [0.625, 0.375, 0, 0])
    # top-p 0.79: 0.5 + 0.3 reaches it, the rest is cut; 0.81 keeps the third token
    assert np.allclose(transform(logits, SamplingParams(1.0, top_p=0.79)), [0.625, 0.375, 0, 0])
    assert np.count_nonzero(transform(logits, SamplingParams(1.0, top_p=0.81))) == 3
    # the most likely token always survives
    assert np.allclose(transform(logits, SamplingParams(1.0, top_p=0.01)), [1, 0, 0, 0])


@pytest.mark.parametrize("kw,msg", [
    (dict(temperature=-0.1), "--temperature"), (dict(temperature=float("nan")), "--temperature"),
    (dict(temperature=1, top_p=0.0), "--top-p"), (dict(temperature=1, top_p=1.5), "--top-p"),
    (dict(temperature=1, top_k=0), "--top-k"),
])
def test_sampling_params_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kw).validate()


# ------------------------------------------------- the acceptance rules, exactly


def _first_token_freq(p, q, parents, fault=None, n=20000, seed=0):
    """Monte Carlo: the distribution of the first committed token of one verify step
    over a proposal `parents` whose drafts are i.i.d. draws from q at depth 1."""
    rng = np.random.default_rng(seed)
    V = len(p)
    N = len(parents)
    P = np.tile(p, (N, 1))
    Q = np.tile(q, (4, 1))
    counts = np.zeros(V)
    par = np.asarray(parents)
    for _ in range(n):
        toks = np.zeros(N, dtype=np.int64)
        toks[1:] = categorical(rng, Q[np.zeros(N - 1, dtype=np.int64)])
        st = verify_sampled(rng, toks, par, P, Q, np.log(P + 1e-30), fault)
        first = toks[st.path[1]] if len(st.path) > 1 else st.token
        counts[first] += 1
    return counts


P = np.array([0.5, 0.2, 0.2, 0.1])
Q = np.array([0.1, 0.6, 0.1, 0.2])


def chisquare(observed, expected):
    """scipy.stats.chisquare, imported where used: scipy.stats takes about a second to import,
    which every xdist worker paid while collecting this module."""
    from scipy.stats import chisquare as chi2
    return chi2(observed, expected)


@pytest.mark.parametrize("parents", [[-1, 0], [-1, 0, 0], [-1, 0, 0, 0]], ids=["chain", "mss-2", "mss-3"])
def test_first_token_follows_p(parents):
    """Chain speculative sampling and SpecInfer MSS with 2 and 3 i.i.d. children: the
    committed token is distributed exactly as p (chi-square, 20,000 draws)."""
    counts = _first_token_freq(P, Q, parents)
    assert chisquare(counts, counts.sum() * P).pvalue > 1e-3


@pytest.mark.parametrize("fault", ["ratio-inverted", "residual-from-p", "greedy-accept"])
def test_faulty_acceptance_does_not_follow_p(fault):
    counts = _first_token_freq(P, Q, [-1, 0], fault)
    assert chisquare(counts, counts.sum() * P).pvalue < 1e-6


def test_verify_record():
    """The v2 record of one step: u on tested nodes only, p' of later siblings is the residual."""
    rng = np.random.default_rng(3)
    p = np.tile([0.0, 0.5, 0.5, 0.0], (3, 1))    # the drafts (token 3) have p = 0: rejected
    q = np.tile([0.0, 0.0, 0.0, 1.0], (2, 1))
    st = verify_sampled(rng, np.array([1, 3, 3]), np.array([-1, 0, 0]), p, q, np.log(p + 1e-9))
    assert list(st.path) == [0] and st.from_residual
    assert np.isnan(st.accept_u[0]) and not np.isnan(st.accept_u[1:]).any()
    assert st.target_prob[1] == 0 and st.draft_prob[1] == 1
    assert st.token in (1, 2) and st.token_target_prob == 0.5 and st.token_draft_prob == 0.0


# ----------------------------------------------------------- the runtime, traced


@pytest.fixture(scope="module")
def sampled_runs(tmp_path_factory, make_run):
    out = tmp_path_factory.mktemp("sampled")
    chain = make_run(out=out, temperature=0.8, seed=1, run_id="chain")
    tree = make_run(out=out, algo="tree", budget=12, topk=3, concurrency=4, temperature=1.0, top_p=0.9,
                    top_k=20, seed=2, run_id="tree", eos_id=10)
    return out, chain, tree


def test_sampled_runs_are_clean_and_v2(sampled_runs):
    out, chain, tree = sampled_runs
    res = check_paths([out])
    assert res.exit_code == 0 and not res.findings, [f.message for f in res.findings][:5]
    for r in (chain, tree):
        m = json.loads((r.run_dir / "run.json").read_text())
        assert m["schema_version"] == 2 and m["config"]["sampling"]["temperature"] > 0
        t = pq.read_table(next(r.run_dir.glob("steps-*.parquet")))
        assert set(SAMPLING_COLUMNS) <= set(t.schema.names)
        u = t.column("accept_u").to_pylist()
        assert any(not np.isnan(x) for row in u for x in row[1:])
    # the tree sampled with top_k 20: every drawn token within it
    t = pq.read_table(next(tree.run_dir.glob("steps-*.parquet")))
    assert max(t.column("sampled_rank").to_pylist()) < 20


def test_greedy_default_is_unchanged(make_run, tmp_path):
    a = make_run(out=tmp_path / "a", num_prompts=2, max_new_tokens=24)
    b = make_run(out=tmp_path / "b", num_prompts=2, max_new_tokens=24, temperature=0.0, top_p=0.5, top_k=3)
    assert a.outputs == b.outputs
    t = pq.read_table(next(b.run_dir.glob("steps-*.parquet")))
    assert t.schema.equals(STEPS_SCHEMA)  # a greedy run writes contract v1, nothing more
    assert json.loads((b.run_dir / "run.json").read_text())["schema_version"] == 1


def test_seed_reproduces(make_run, tmp_path):
    kw = dict(num_prompts=2, max_new_tokens=24, temperature=1.0)
    a = make_run(out=tmp_path / "a", seed=5, **kw)
    b = make_run(out=tmp_path / "b", seed=5, **kw)
    c = make_run(out=tmp_path / "c", seed=6, **kw)
    assert a.outputs == b.outputs and a.outputs != c.outputs


@pytest.mark.parametrize("fault,code", [("greedy-accept", "SA801"), ("ratio-inverted", "SA801"),
                                        ("residual-from-p", "SA802")])
def test_check_catches_sampling_fault(make_run, tmp_path, fault, code):
    make_run(out=tmp_path, temperature=0.8, inject=fault, max_new_tokens=64)
    res = check_paths([tmp_path])
    assert res.exit_code == 1 and code in res.counts, dict(res.counts)


@pytest.mark.parametrize("fault,kw", [
    ("temperature-one-side", dict(temperature=0.3)),
    ("bonus-from-q", dict(temperature=0.5, budget=1)),
])
@pytest.mark.slow   # tens of seconds each: started first under xdist (tests/conftest.py)
def test_lossless_catches_sampling_fault(models, fault, kw):
    res = run_reference(samples=150, num_prompts=1, positions=4, inject=fault, models=models, **kw)
    assert res.differ and res.exit_code == 1, res.text()


@pytest.mark.slow
def test_lossless_clean_chain_and_tree(models):
    for kw in (dict(), dict(algo="tree", budget=4, topk=2)):
        res = run_reference(temperature=0.5, budget=kw.pop("budget", 1), samples=150, num_prompts=1,
                            positions=4, models=models, **kw)
        assert not res.differ and res.exit_code == 0, res.text()
        assert res.n_needed is not None and res.n_needed > 0


# ------------------------------------------------------------- the test itself


def _arm(rng, dists, n):
    return {"p": [[0] + [int(rng.choice(len(d), p=d)) for d in dists] for _ in range(n)]}


def test_compare_same_and_distorted():
    rng = np.random.default_rng(0)
    d = [np.array([0.5, 0.3, 0.2]), np.array([0.6, 0.25, 0.15])]
    same = compare(_arm(rng, d, 2000), _arm(rng, d, 2000), 2)
    assert not same.differ and same.p_value > 0.01
    bent = [np.array([0.44, 0.36, 0.2]), d[1]]   # 0.06 moved between the two most likely
    diff = compare(_arm(rng, d, 4000), _arm(rng, bent, 4000), 2)
    assert diff.differ and diff.positions[0].p_value < 1e-4
    # the sample size estimate falls with the distortion and matches what detected it
    assert same.positions[0].n_needed < 4000
    big = compare(_arm(rng, d, 50), _arm(rng, d, 50), 2, distortion=0.2)
    assert big.n_needed < same.n_needed
    assert n_needed(0.0, 3, 0.01) is None


def test_compare_bad_input():
    with pytest.raises(ValueError, match="share no prompt"):
        compare({"a": [[1, 2]]}, {"b": [[1, 2]]}, 1)
    with pytest.raises(ValueError, match="--positions"):
        compare({"a": [[1, 2]]}, {"a": [[1, 2]]}, 0)


def test_lossless_on_datasets(sampled_runs, make_run, tmp_path, capsys):
    out, chain, _ = sampled_runs
    from specaudit.tokenizer import default_prompts
    # the same prompts (the seed rotates the embedded set), another generator
    other = make_run(out=tmp_path / "b", temperature=0.8, seed=1 + len(default_prompts()))
    res = compare_datasets(chain.run_dir, other.run_dir, 4)
    assert res.prompts >= 1 and res.exit_code in (0, 1)
    code = main(["lossless", str(chain.run_dir), str(other.run_dir), "--positions", "4",
                 "--output-format", "json"])
    assert code == res.exit_code and json.loads(capsys.readouterr().out)["p_value"] == res.p_value
    # different parameters, a greedy dataset, one dataset only: one line, exit 2
    greedy = make_run(out=tmp_path / "g", num_prompts=1, max_new_tokens=8)
    for argv, needle in ([str(chain.run_dir), str(sampled_runs[2].run_dir)], "different parameters"), \
                        ([str(chain.run_dir), str(greedy.run_dir)], "did not sample"), \
                        ([str(chain.run_dir)], "two datasets"):
        assert main(["lossless", *argv]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


# ------------------------------------------------------------------- bad input


@pytest.mark.parametrize("argv,needle", [
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "1", "--top-p", "0"], "--top-p"),
    (["--temperature", "1", "--top-p", "1.5"], "--top-p"),
    (["--temperature", "1", "--top-k", "0"], "--top-k"),
    (["--temperature", "1", "--oracle"], "lossless"),
    (["--inject", "ratio-inverted"], "--temperature > 0"),
])
def test_run_bad_sampling_flags_exit_2(capsys, tmp_path, argv, needle):
    code = main(["run", "--out", str(tmp_path / "t"), "--num-prompts", "1", "--max-new-tokens", "8", *argv])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").iterdir())


def test_lossless_bad_flags_exit_2(capsys):
    for argv, needle in ((["--temperature", "0"], "--temperature"), (["--temperature", "-2"], "--temperature"),
                         (["--temperature", "1", "--samples", "1"], "--samples")):
        assert main(["lossless", *argv]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1


def test_v2_values_out_of_range_are_findings(sampled_runs, tmp_path):
    """A v2 probability above 1 or NaN in a real trace: SA800, the row hidden from SA801-SA804."""
    import pyarrow as pa
    _, chain, _ = sampled_runs
    src = next(chain.run_dir.glob("steps-*.parquet"))
    t = pq.read_table(src)
    dp = t.column("draft_prob").to_pylist()
    dp[0][1], dp[1][0] = 1.5, float("nan")
    t = t.set_column(t.schema.get_field_index("draft_prob"), "draft_prob", pa.array(dp, pa.list_(pa.float32())))
    import shutil
    dst = tmp_path / chain.run_dir.name
    shutil.copytree(chain.run_dir, dst)
    pq.write_table(t, dst / src.name)
    res = check_paths([dst])
    assert res.counts.get("SA800") == 2 and "SA801" not in res.counts, dict(res.counts)


def test_v2_column_of_wrong_type_is_sa000(sampled_runs, tmp_path):
    import shutil

    import pyarrow as pa
    _, chain, _ = sampled_runs
    dst = tmp_path / chain.run_dir.name
    shutil.copytree(chain.run_dir, dst)
    src = next(dst.glob("steps-*.parquet"))
    t = pq.read_table(src)
    u = [[str(x) for x in r] for r in t.column("accept_u").to_pylist()]
    pq.write_table(t.set_column(t.schema.get_field_index("accept_u"), "accept_u", pa.array(u)), src)
    res = check_paths([dst])
    assert res.counts.get("SA000") == 1 and res.exit_code in (1, 2), dict(res.counts)
    assert any("accept_u" in f.message and "type" in f.message for f in res.findings if f.code == "SA000")


def test_live_inline_rules_skip_argmax_rules_on_sampled_rows(sampled_runs):
    """The Prometheus sink's inline rules: no SA304/SA305/SA307 false alarm on a sampled
    batch (they fire when the v2 column is dropped, so the batch does exercise them)."""
    from specaudit.trace.inline_rules import inline_violations
    _, _, tree = sampled_runs
    b = pq.read_table(next(tree.run_dir.glob("steps-*.parquet"))).combine_chunks().to_batches()[0]
    assert not any(v.any() for v in inline_violations(b, eos_id=10).values())
    plain = b.drop_columns(["accept_u"])
    fired = inline_violations(plain, eos_id=10)
    assert fired["SA304"].any() or fired["SA305"].any() or fired["SA307"].any()
