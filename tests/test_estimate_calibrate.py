"""Cost profiles (measured, by hand, from traces) and trace datasets as estimator input."""
from __future__ import annotations

import json
import math

import pyarrow.compute as pc
import pytest
import torch

from specaudit import cli
from specaudit.calibrate import algo_for, measure_profile, plain_steps, profile_from_traces
from specaudit.estimate import CostProfile, observations_from_traces
from specaudit.model import GPT, BlockDrafter, DrafterConfig, GPTConfig
from specaudit.synth import synth_run_rows, write_run


@pytest.fixture(scope="module")
def tiny_models():
    """Untrained small models: timing code paths only (acceptance does not matter here)."""
    torch.manual_seed(0)
    t = GPT(GPTConfig(n_layer=2, d_model=64, n_head=2, max_seq_len=256)).eval()
    d = BlockDrafter(DrafterConfig(d_target=64, d_model=64, depth=8)).eval()
    return t, d, {}


@pytest.fixture(scope="module")
def synth_dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    steps, requests, manifest = synth_run_rows(n_requests=8, concurrency=4, max_new_tokens=40, seed=3,
                                               run_id="synth-est")
    write_run(out, steps, requests, manifest)
    return out, steps, requests, manifest


def test_observation_from_trace_timestamps(synth_dataset):
    out, steps, requests, manifest = synth_dataset
    (o,) = observations_from_traces(out)
    # independent derivation: output tokens over first step start .. last step end
    tokens = sum(len(x) for x in requests.column("output_tokens").to_pylist())
    t0 = pc.min(steps.column("t_start")).as_py()
    t1 = pc.max(pc.add(steps.column("t_start"), steps.column("step_s"))).as_py()
    assert o.tps == pytest.approx(tokens / (t1 - t0), rel=1e-9)
    assert o.concurrency == 4 and o.n_nodes == 8 and o.label == "synth-est"
    assert o.reported_commit_len == pytest.approx(manifest["reported"]["mean_commit_len"])
    assert o.tps_std > 0  # per-request rates differ


def test_observation_excludes_bonus_convention(tmp_path):
    steps, requests, manifest = synth_run_rows(n_requests=4, concurrency=2, seed=1, run_id="ex",
                                               conventions={"accept_length": "excludes_bonus"})
    write_run(tmp_path, steps, requests, manifest)
    (o,) = observations_from_traces(tmp_path)
    assert o.reported_commit_len == pytest.approx(manifest["reported"]["mean_commit_len"] + 1)


def test_estimate_cli_on_traces(synth_dataset, capsys):
    out, steps, requests, manifest = synth_dataset
    # the synthetic steps take 0.01 s per batched forward; with the mean batch of the run,
    # a plain step of 0.01 s (r = 1) makes C = tps / (batch / 0.01)
    mean_batch = steps.num_rows / len(set(steps.column("t_start").to_pylist()))
    (o,) = observations_from_traces(out)
    base = mean_batch / 0.01
    assert cli.main(["estimate", str(out), "--baseline-tps", f"{base}", "--cost-factor", "1.0",
                     "--cost-factor-std", "0.02", "--output-format", "json"]) in (0, 1)
    d = json.loads(capsys.readouterr().out)["results"][0]
    assert d["estimate"]["value"] == pytest.approx(o.tps / base)
    assert d["n_nodes"] == 8 and d["reported_commit_len"] == pytest.approx(manifest["reported"]["mean_commit_len"])


def test_algo_for():
    assert algo_for(8, 8) == ("chain", 7, 1)
    assert algo_for(9, 8) == ("chain", 8, 1)
    assert algo_for(13, 8) == ("tree", 12, 4)
    with pytest.raises(ValueError):
        algo_for(1, 8)


def test_measure_profile_structure(tiny_models):
    prof = measure_profile(models=tiny_models, n_grid=(2, 12), c_grid=(1, 2), repeats=2, max_new_tokens=12,
                           prompts=["def f(x):\n    return x + 1\n", "import os\nprint(os.getcwd())\n"])
    assert prof.source == "measured"
    assert {(e.n_nodes, e.concurrency) for e in prof.entries} == {(2, 1), (12, 1), (2, 2), (12, 2)}
    for e in prof.entries:
        assert math.isfinite(e.r) and 0.1 < e.r < 50 and e.r_std >= 0
        assert e.t_ar_s > 0 and e.t_verify_s > 0 and e.t_draft_s > 0 and e.samples == 2
    r, sd = prof.lookup(7, 2)  # interpolated inside the grid
    lo, hi = sorted([prof.lookup(2, 2)[0], prof.lookup(12, 2)[0]])
    assert lo <= r <= hi


def test_plain_steps_count(tiny_models):
    t = plain_steps(tiny_models[0], [[1, 2, 3], [4, 5, 6, 7]], 5, "cpu")
    assert len(t) == 5 and all(x > 0 for x in t)


def test_profile_from_traces(synth_dataset, tiny_models):
    out, *_ = synth_dataset
    prof = profile_from_traces(out, models=tiny_models, steps=8)
    (e,) = prof.entries
    assert (e.n_nodes, e.concurrency) == (8, 4)
    # the synthetic rows say draft 2 ms + verify 6 ms per forward; r = that / the plain step timed here
    assert e.t_verify_s == pytest.approx(0.008)
    assert e.r == pytest.approx(0.008 / e.t_ar_s, rel=1e-3)


def test_calibrate_cli_by_hand(tmp_path, capsys):
    p = tmp_path / "cost.json"
    assert cli.main(["calibrate", "--out", str(p), "--cost-factor", "1.5"]) == 0
    assert "r = 1.500" in capsys.readouterr().out
    assert CostProfile.load(p).lookup(8, 4) == pytest.approx((1.5, 0.15))
    assert cli.main(["estimate", "--observed-tps", "109", "--baseline-tps", "98", "--profile", str(p),
                     "--reported-commit-len", "2"]) == 0


@pytest.mark.parametrize("argv,word", [
    (["calibrate", "--out", "x.json", "--cost-factor", "-1"], "positive"),
    (["calibrate", "--out", "x.json", "--n-nodes", "4,a"], "integers"),
    (["calibrate", "--out", "x.json", "--concurrency", "0"], "positive"),
    (["calibrate", "--out", "x.json", "--cost-factor", "1.5", "--from-traces", "t/"], "at most one"),
])
def test_calibrate_cli_bad_input(argv, word, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert word in err and err.count("\n") == 1


def test_calibrate_from_empty_folder(tmp_path, capsys):
    assert cli.main(["calibrate", "--out", str(tmp_path / "c.json"), "--from-traces", str(tmp_path)]) == 2
    assert "no trace runs" in capsys.readouterr().err


def test_reference_run_as_estimator_input(make_run, models, capsys):
    """A real traced run of the reference runtime: the observation and the trace profile."""
    res = make_run(algo="chain", budget=7, concurrency=2, num_prompts=4, max_new_tokens=40)
    dataset = res.run_dir.parent
    (o,) = observations_from_traces(dataset)
    assert o.extra["tokens"] == res.summary["tokens"]
    assert (o.concurrency, o.n_nodes) == (2, 8)
    assert o.reported_commit_len == pytest.approx(res.manifest["reported"]["mean_commit_len"])
    # the trace spans the steps, run_traced's wall also the first prefill and the close
    assert o.tps >= 0.95 * res.summary["tokens"] / res.wall_s
    prof = profile_from_traces(dataset, models=models, steps=8)
    (e,) = prof.entries
    assert (e.n_nodes, e.concurrency) == (8, 2) and e.r > 0 and e.t_ar_s > 0
    # the run's own figures through the CLI, with r from its own timings
    p = dataset.parent / f"{dataset.name}-cost.json"
    prof.save(p)
    assert cli.main(["estimate", str(dataset), "--baseline-tps", str(2 / e.t_ar_s), "--profile", str(p),
                     "--output-format", "json"]) in (0, 1, 2)
    d = json.loads(capsys.readouterr().out)["results"][0]
    assert d["n_nodes"] == 8 and d["concurrency"] == 2 and d["cost_factor_from"].startswith("profile")
