"""Cost profiles (measured, by hand, from traces) and trace datasets as estimator input."""
from __future__ import annotations

import json
import math
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from specaudit import cli
from specaudit.audit.calibrate import algo_for, measure_profile, plain_steps, profile_from_traces
from specaudit.audit.cost_profile import CostProfile
from specaudit.audit.observed_throughput import observations_from_traces
from specaudit.model import GPT, BlockDrafter, DrafterConfig, GPTConfig
from specaudit.trace.synth import synth_run_rows, write_run


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


def _steady_rate(steps, conc):
    """Independent derivation: tokens appended / step time over forwards that ran c rows."""
    t = steps.append_column("n", pc.list_value_length(steps.column("committed_tokens")))
    g = t.group_by("t_start").aggregate([("n", "sum"), ("step_s", "max"), ("request_id", "count")]).to_pydict()
    full = [i for i, k in enumerate(g["request_id_count"]) if k >= conc]
    return sum(g["n_sum"][i] for i in full) / sum(g["step_s_max"][i] for i in full), len(full)


def test_observation_from_trace_timestamps(synth_dataset):
    out, steps, requests, manifest = synth_dataset
    (o,) = observations_from_traces(out)
    rate, n_full = _steady_rate(steps, 4)
    assert o.tps == pytest.approx(rate, rel=1e-9)
    assert o.samples == n_full and o.extra["steady"] and o.extra["stalls"] == 0
    assert o.extra["tokens"] == sum(len(x) for x in requests.column("output_tokens").to_pylist()) - 8
    assert o.concurrency == 4 and o.n_nodes == 8 and o.label == "synth-est"
    assert o.reported_commit_len == pytest.approx(manifest["reported"]["mean_commit_len"])
    assert o.tps_std > 0  # tokens per forward differ


def test_observation_sets_stalls_apart(tmp_path):
    steps, requests, manifest = synth_run_rows(n_requests=8, concurrency=4, max_new_tokens=40, seed=3, run_id="st")
    base, _ = _steady_rate(steps, 4)
    ts = steps.column("t_start").to_pylist()
    first = ts[0]
    step_s = [0.25 if t == first else s for t, s in zip(ts, steps.column("step_s").to_pylist())]  # a 25x stall
    steps = steps.set_column(steps.schema.get_field_index("step_s"), "step_s", pa.array(step_s, pa.float64()))
    write_run(tmp_path, steps, requests, manifest)
    (o,) = observations_from_traces(tmp_path)
    assert o.extra["stalls"] == 1
    rows0 = [i for i, t in enumerate(ts) if t == first]
    tok0 = sum(len(steps.column("committed_tokens")[i].as_py()) for i in rows0)
    _, n_full = _steady_rate(steps, 4)
    assert o.tps == pytest.approx((base * 0.01 * n_full - tok0) / (0.01 * (n_full - 1)), rel=1e-6)


def test_observation_excludes_bonus_convention(tmp_path):
    steps, requests, manifest = synth_run_rows(n_requests=4, concurrency=2, seed=1, run_id="ex",
                                               conventions={"accept_length": "excludes_bonus"})
    write_run(tmp_path / "a", steps, requests, manifest)
    (o,) = observations_from_traces(tmp_path / "a")
    # mean_commit_len counts the bonus whatever the convention (the checker reads it so)
    assert o.reported_commit_len == pytest.approx(manifest["reported"]["mean_commit_len"])
    # an engine that reports only its own accept length, without the bonus: made bonus-included
    rep = dict(manifest["reported"])
    del rep["mean_commit_len"]
    write_run(tmp_path / "b", steps, requests, dict(manifest, reported=rep))
    (o,) = observations_from_traces(tmp_path / "b")
    assert o.reported_commit_len == pytest.approx(rep["mean_accept_length"] + 1)
    assert o.reported_commit_len == pytest.approx(manifest["reported"]["mean_commit_len"], rel=0.2)


def test_estimate_cli_on_traces(synth_dataset, capsys):
    out, steps, requests, manifest = synth_dataset
    # synthetic forwards take 0.01 s each; with a plain step of 0.01 s (r = 1) at c = 4 the
    # baseline is 400 tokens/s and C = steady tokens per forward / 4
    (o,) = observations_from_traces(out)
    assert cli.main(["estimate", str(out), "--baseline-tps", "400", "--cost-factor", "1.0",
                     "--cost-factor-std", "0.02", "--output-format", "json"]) in (0, 1)
    d = json.loads(capsys.readouterr().out)["results"][0]
    assert d["estimate"]["value"] == pytest.approx(o.tps / 400)
    assert d["n_nodes"] == 8 and d["reported_commit_len"] == pytest.approx(manifest["reported"]["mean_commit_len"])
    # a full synthetic forward commits 4 x (mean commit) tokens: the estimate recovers it
    assert d["estimate"]["value"] == pytest.approx(manifest["reported"]["mean_commit_len"], rel=0.15)


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


def _timed_runs_and_profile(make_run, models):
    """An honest chain run, the commit-counter bug and a profile, timed back to back."""
    res = make_run(algo="chain", budget=7, concurrency=2, num_prompts=6, max_new_tokens=64)
    bug = make_run(algo="chain", budget=7, concurrency=2, num_prompts=6, max_new_tokens=64, inject="commit-counter")
    p = res.run_dir.parent.parent / f"{res.run_dir.parent.name}-cost.json"
    measure_profile(models=models, n_grid=(8,), c_grid=(2,), repeats=3, max_new_tokens=64).save(p)
    return res, bug, p


@pytest.mark.alone   # wall-clock timings: under xdist the other worker waits (tests/conftest.py)
def test_reference_run_as_estimator_input(make_run, models, capsys):
    """Real traced runs of the reference runtime: an honest one and the commit-counter bug
    (the seed case), judged from their own timestamps and a profile measured here.

    The estimate rests on wall-clock timings taken minutes apart on a shared 2-core machine:
    another job that starts between the runs and the profile moves it (an estimate above N
    is then refused as a calibration mismatch, exit 2). Up to three fresh measurements; the
    assertions hold for the last one, so an estimator that is always wrong still fails."""
    for attempt in range(3):
        res, bug, p = _timed_runs_and_profile(make_run, models)
        argv = ["--profile", str(p), "--baseline-from-profile", "--output-format", "json"]
        cli.main(["estimate", str(res.run_dir.parent)] + argv)
        honest = json.loads(capsys.readouterr().out)["results"][0]
        rc = cli.main(["estimate", str(bug.run_dir.parent)] + argv)
        judged = json.loads(capsys.readouterr().out)["results"][0]
        truth = res.manifest["reported"]["mean_commit_len"]
        if (honest["estimate"]["value"] == pytest.approx(truth, rel=0.35) and rc == 1
                and judged["verdict"] == "inconsistent"):
            break
        # to stderr: stdout is the next attempt's JSON (capsys keeps the two apart)
        print(f"attempt {attempt + 1}: estimate {honest['estimate']['value']} vs {truth}, bug rc {rc}",
              file=sys.stderr)
    dataset = res.run_dir.parent
    (o,) = observations_from_traces(dataset)
    assert o.extra["tokens"] == res.summary["tokens"] - 6  # decode tokens: first tokens are prefill's
    assert (o.concurrency, o.n_nodes) == (2, 8)
    assert o.reported_commit_len == pytest.approx(res.manifest["reported"]["mean_commit_len"])
    assert o.tps > res.summary["tokens_per_s"]  # steady decode beats the whole run (prefill, drain)
    prof = profile_from_traces(dataset, models=models, steps=8)
    (e,) = prof.entries
    assert (e.n_nodes, e.concurrency) == (8, 2) and e.r > 0 and e.t_ar_s > 0
    assert honest["estimate"]["value"] == pytest.approx(truth, rel=0.35)  # timing on a shared machine
    # the bug reports about 2 tokens per step while the clock says about the truth: inconsistent
    assert rc == 1
    assert judged["reported_commit_len"] < 2.1 and judged["verdict"] == "inconsistent"
