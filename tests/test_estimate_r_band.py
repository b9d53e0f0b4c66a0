"""`specaudit estimate` without a guessed constant (issue 28 item 2): each counter's implied
step cost factor r beside a band for r whose origin is said, a counter named only when its
r is outside the band.

The seed's figures: 109 tokens/s speculative, 98 plain at the same concurrency, a commit
counter of 2.00 and an accepted depth of 7.00 (8 tokens per step). They imply r = 1.80 and
7.19. With a cost profile measured on the deployment (r 7.0 at N = 8, c = 1: a step
costs seven plain ones) the commit counter is contradicted and the depth is consistent,
as the seed found; a hardware class alone cannot tell them apart and says what would.
"""
from __future__ import annotations

import json

import pytest

from specaudit.audit.cost_profile import CostEntry, CostProfile
from specaudit.audit.estimate import run_estimate
from specaudit.audit.r_band import band_from_hardware, implied_r
from specaudit.cli import main

SEED = ["--observed-tps", "109", "--baseline-tps", "98", "--reported-commit-len", "2", "--reported-accept-depth", "7"]


def _profile(tmp_path, r, sd, name="cost.json"):
    # what `specaudit calibrate` writes: step times measured at N = 8, c = 1
    t_ar = 0.010
    prof = CostProfile([CostEntry(r=r, r_std=sd, n_nodes=8, concurrency=1, t_ar_s=t_ar, t_draft_s=0.3 * r * t_ar,
                                  t_verify_s=0.7 * r * t_ar, samples=5)], source="measured")
    path = tmp_path / name
    prof.save(path)
    return str(path)


def _one_err_line(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_implied_r_of_the_seed_counters():
    assert round(implied_r(2.0, 109, 0, 98, 0)["value"], 2) == 1.80
    assert round(implied_r(8.0, 109, 0, 98, 0)["value"], 2) == 7.19
    ir = implied_r(2.0, 109, 5.0, 98, 2.0)
    assert ir["low"] < ir["value"] < ir["high"]


def test_seed_with_a_measured_profile_names_the_commit_counter(tmp_path, capsys):
    prof = _profile(tmp_path, 7.0, 0.3)
    rc = main(["estimate", *SEED, "--profile", prof, "--n-nodes", "8", "--concurrency", "1"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "commit length 2.00 implies r = 1.80" in out and "contradicted" in out
    assert "accepted depth 7.00 implies r = 7.19" in out
    assert "measured r 7.00" in out and "cost.json at N=8, c=1" in out
    assert "contradicts the commit length counter" in out
    rep = run_estimate(observed_tps=109, baseline_tps=98, reported_commit_len=2, reported_accept_depth=7,
                       profile=prof, n_nodes=8, concurrency=1)
    st = {f["counter"]: f["status"] for f in rep.results[0]["r_band"]["figures"]}
    assert st == {"commit length": "contradicted", "accepted depth": "possible"}


def test_hardware_class_alone_says_both_possible_and_what_decides(capsys):
    rc = main(["estimate", *SEED, "--hardware", "gpu", "--n-nodes", "8", "--output-format", "json"])
    res = json.loads(capsys.readouterr().out)["results"][0]
    assert rc == 2 and res["verdict"] == "not enough data"
    rb = res["r_band"]
    assert rb["outcome"] == "both possible" and rb["band"]["kind"] == "hardware"
    assert (rb["band"]["low"], rb["band"]["high"]) == (1.0, 9.0)
    assert "hardware class gpu at N=8" in rb["band"]["origin"]
    assert rb["conclusion"].startswith("Both possible")
    assert "`specaudit calibrate`" in rb["conclusion"] and "drafting off" in rb["conclusion"]


def test_hardware_band_names_a_counter_only_outside_it(capsys):
    # a commit counter of 1.0 at 109 vs 98 tokens/s implies r = 0.90: a step cheaper than one
    # plain forward, which no hardware gives; the depth 3 (r = 3.60) is possible on a GPU
    rc = main(["estimate", "--observed-tps", "109", "--baseline-tps", "98", "--reported-commit-len", "1.0",
               "--reported-accept-depth", "3", "--hardware", "gpu", "--n-nodes", "8"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "The evidence contradicts the commit length counter (1.00, implied r 0.90)" in out
    # the same depth alone, inside the band: possible, exit 0
    rc = main(["estimate", "--observed-tps", "109", "--baseline-tps", "98", "--reported-accept-depth", "3",
               "--hardware", "cpu", "--n-nodes", "8"])
    assert rc == 0 and "Possible:" in capsys.readouterr().out
    assert band_from_hardware("cpu", 8).high == 15.0
    # --budget B is N = B + 1 (k drafted tokens a step)
    rep = run_estimate(observed_tps=109, baseline_tps=98, reported_accept_depth=3, hardware="cpu", budget=7)
    assert rep.results[0]["r_band"]["band"]["high"] == 15.0


def test_band_excluding_both_counters_is_one_clear_line_with_the_account(tmp_path, capsys):
    prof = _profile(tmp_path, 4.0, 0.2)
    rc = main(["estimate", *SEED, "--profile", prof, "--n-nodes", "8", "--concurrency", "1"])
    out = capsys.readouterr().out
    assert rc == 1     # the estimate contradicts both counters (r 4 gives 4.45 tokens per step)
    assert "commit length 2.00 implies r = 1.80" in out and "accepted depth 7.00 implies r = 7.19" in out
    # without a cost estimate (a hardware band that excludes both): one sentence, exit 2
    rep = run_estimate(observed_tps=109, baseline_tps=98, reported_commit_len=0.5, reported_accept_depth=15,
                       hardware="gpu", n_nodes=8)
    r = rep.results[0]
    assert rep.exit_code == 2 and r["r_band"]["outcome"] == "both excluded"
    assert r["conclusion"].startswith("The r band [1.00, 9.00]") and "excludes both counters" in r["conclusion"]
    assert len([f for f in r["r_band"]["figures"] if f["status"] == "contradicted"]) == 2


@pytest.mark.parametrize("args, msg", [
    (["--hardware", "gpu"], "--hardware needs the verify width"),
    (["--hardware", "gpu", "--n-nodes", "8", "--cost-factor", "1.5"], "give one source of r"),
    ([], "no cost factor: give --profile FILE"),
    (["--hardware", "gpu", "--budget", "7", "--n-nodes", "4"], "--budget 7 means N = 8"),
    (["--hardware", "gpu", "--budget", "0"], "--budget must be at least 1"),
])
def test_bad_r_inputs_one_line_exit_2(args, msg, capsys):
    assert main(["estimate", *SEED, *args]) == 2
    assert msg in _one_err_line(capsys)


def test_hand_factor_shows_how_much_the_verdict_rests_on_it(capsys):
    for r, named in (("1.5", "the accepted depth counter is the wrong one"),
                     ("7", "the commit length counter is the wrong one")):
        assert main(["estimate", *SEED, "--cost-factor", r]) == 1
        out = capsys.readouterr().out
        assert named in out
        assert "by hand" in out and "a guess unless measured" in out
        assert "implies r = 1.80" in out and "implies r = 7.19" in out
