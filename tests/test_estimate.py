"""The throughput-derived estimator: model, interval, verdict, profiles, inputs, CLI."""
from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specaudit import cli
from specaudit.audit.cost_profile import CostEntry, CostProfile
from specaudit.audit.estimate_model import CONSISTENT, INCONSISTENT, NOT_ENOUGH_DATA, estimate_commit_length, verdict
from specaudit.audit.observed_throughput import observation_from_load_json
from specaudit.trace.safe_io import InputError

FIX = __import__("pathlib").Path(__file__).parent / "fixtures" / "engines"


# ----------------------------------------------------------------------- the model


def test_seed_numbers():
    e = estimate_commit_length(109, 98, 1.5)
    assert e.value == pytest.approx(109 / 98 * 1.5)
    assert round(e.value, 2) == 1.67
    assert e.low == e.high == e.value  # no spread given: a point
    # the hand profile's default 10% spread makes 2.0 plausible and 8 (depth 7 + bonus) impossible
    r, sd = CostProfile.manual(1.5).lookup()
    e = estimate_commit_length(109, 98, r, cost_factor_std=sd)
    assert e.low < 1.67 < e.high
    assert verdict(e, 2.0) == CONSISTENT
    assert verdict(e, 8.0) == INCONSISTENT
    assert verdict(e, 1.0) == INCONSISTENT  # below: 1 / 1.37 is far off too
    v, lo, hi = e.predicted_tps(2.0)
    assert v == pytest.approx(2.0 / 1.5 * 98)
    assert lo < 109 < hi


def test_point_estimate_tolerance_edges():
    e = estimate_commit_length(100, 100, 2.0)  # C = 2 exactly
    assert verdict(e, 2.0) == CONSISTENT
    assert verdict(e, 2.19, tolerance=0.1) == CONSISTENT
    assert verdict(e, 2.21, tolerance=0.1) == INCONSISTENT
    assert verdict(e, 1.81, tolerance=0.1) == CONSISTENT
    assert verdict(e, 1.79, tolerance=0.1) == INCONSISTENT
    assert verdict(e, 2.05, tolerance=0.0) == INCONSISTENT


def test_not_enough_data():
    e = estimate_commit_length(100, 100, 2.0, cost_factor_std=0.8)  # 40% spread on r
    assert e.rel_std > 0.25
    assert verdict(e, 2.0) == NOT_ENOUGH_DATA
    assert verdict(e, 9.0) == NOT_ENOUGH_DATA
    ok = estimate_commit_length(100, 100, 2.0)
    assert verdict(ok, None) == NOT_ENOUGH_DATA
    assert verdict(ok, float("nan")) == NOT_ENOUGH_DATA


@pytest.mark.parametrize("args", [(0, 98, 1.5), (-5, 98, 1.5), (109, 0, 1.5), (109, 98, 0), (109, 98, -1),
                                  (float("nan"), 98, 1.5), (109, float("inf"), 1.5), ("fast", 98, 1.5)])
def test_bad_numbers_are_value_errors(args):
    with pytest.raises(ValueError):
        estimate_commit_length(*args)


def test_bad_std_and_tolerance():
    with pytest.raises(ValueError):
        estimate_commit_length(1, 1, 1, cost_factor_std=-0.1)
    with pytest.raises(ValueError):
        verdict(estimate_commit_length(1, 1, 1), 1.0, tolerance=1.5)


@settings(max_examples=200, deadline=None)
@given(tps=st.floats(1, 1e5), base=st.floats(1, 1e5), r=st.floats(0.5, 20),
       s1=st.floats(0, 0.3), s2=st.floats(0, 0.3), s3=st.floats(0, 0.3))
def test_interval_properties(tps, base, r, s1, s2, s3):
    e = estimate_commit_length(tps, base, r, cost_factor_std=s3 * r, tps_std=s1 * tps, baseline_std=s2 * base)
    assert e.low <= e.value <= e.high
    # symmetric on the log scale, width from the quadrature sum of relative spreads
    assert math.log(e.high / e.value) == pytest.approx(math.log(e.value / e.low), rel=1e-6, abs=1e-9)
    assert e.rel_std == pytest.approx(math.sqrt(s1 ** 2 + s2 ** 2 + s3 ** 2), rel=1e-6, abs=1e-12)
    wider = estimate_commit_length(tps, base, r, cost_factor_std=(s3 + 0.1) * r, tps_std=s1 * tps,
                                   baseline_std=s2 * base)
    assert wider.low <= e.low and wider.high >= e.high


def test_interval_covers_truth_95_percent():
    """Simulate noisy measurements of a known C; the 95% interval must cover it ~95% of the time."""
    rng = random.Random(7)
    C, t_ar, r = 2.4, 0.01, 1.6
    base_true, tps_true = 1 / t_ar, C / (r * t_ar)
    sd = (0.05, 0.04, 0.08)  # relative sd of tps, baseline, r measurements
    hits, n = 0, 4000
    for _ in range(n):
        tps = tps_true * math.exp(rng.gauss(0, sd[0]))
        base = base_true * math.exp(rng.gauss(0, sd[1]))
        rr = r * math.exp(rng.gauss(0, sd[2]))
        e = estimate_commit_length(tps, base, rr, cost_factor_std=sd[2] * rr, tps_std=sd[0] * tps,
                                   baseline_std=sd[1] * base)
        hits += e.low <= C <= e.high
    assert 0.93 <= hits / n <= 0.97


def test_to_dict_is_json():
    d = estimate_commit_length(109, 98, 1.5, cost_factor_std=0.1).to_dict()
    assert json.loads(json.dumps(d))["value"] == pytest.approx(1.668, abs=1e-3)
    assert {"value", "low", "high"} <= set(d)


# ---------------------------------------------------------------------- profiles


def grid():
    es = [CostEntry(r=1.0 + 0.1 * n + 0.05 * c, r_std=0.01 * n, n_nodes=n, concurrency=c)
          for n in (2, 4, 8) for c in (1, 4, 8)]
    return CostProfile(es, source="measured")


def test_profile_lookup_exact_and_interpolated():
    p = grid()
    assert p.lookup(4, 4) == pytest.approx((1.0 + 0.4 + 0.2, 0.04))
    r, _ = p.lookup(6, 4)  # halfway between N=4 and N=8
    assert r == pytest.approx(1.0 + 0.6 + 0.2)
    r, _ = p.lookup(6, 6)  # bilinear: the model is linear, so exact
    assert r == pytest.approx(1.0 + 0.6 + 0.3)


@pytest.mark.parametrize("n,c,word", [(16, 4, "N=16"), (4, 16, "concurrency 16"), (1, 1, "N=1"), (None, 4, "N")])
def test_profile_refuses_outside_grid(n, c, word):
    with pytest.raises(InputError) as ei:
        grid().lookup(n, c)
    assert word in str(ei.value)


def test_profile_roundtrip_and_bad_files(tmp_path):
    p = tmp_path / "cost.json"
    grid().save(p)
    q = CostProfile.load(p)
    assert q.lookup(8, 8) == grid().lookup(8, 8)
    assert CostProfile.load(p).coverage() == "N 2..8, c 1..8"
    cases = {
        "notjson.json": "{not json",
        "kind.json": json.dumps({"kind": "other", "version": 1, "entries": [{"r": 1}]}),
        "version.json": json.dumps({"kind": "specaudit-cost-profile", "version": 9, "entries": [{"r": 1}]}),
        "empty.json": json.dumps({"kind": "specaudit-cost-profile", "version": 1, "entries": []}),
        "neg.json": json.dumps({"kind": "specaudit-cost-profile", "version": 1, "entries": [{"r": -2}]}),
    }
    for name, text in cases.items():
        f = tmp_path / name
        f.write_text(text)
        with pytest.raises(InputError):
            CostProfile.load(f)
    with pytest.raises(InputError, match="not found"):
        CostProfile.load(tmp_path / "missing.json")


def test_manual_profile_spread():
    assert CostProfile.manual(1.5).lookup(7, 3) == pytest.approx((1.5, 0.15))
    assert CostProfile.manual(1.5, 0.0).lookup() == (1.5, 0.0)
    with pytest.raises(ValueError):
        CostProfile.manual(0)


# ------------------------------------------------------------------------ inputs


def test_load_json_observation(tmp_path):
    f = tmp_path / "load.out"
    per = [10.0, 12.0, 11.0, 9.0]
    f.write_text("warming up\n" + json.dumps({"tokens_per_s": 42.0, "per_request_tokens_per_s": per, "concurrency": 4,
                                              "requests": 4, "completion_tokens": 420, "wall_s": 10.0}) + "\n")
    o = observation_from_load_json(f)
    assert o.tps == 42.0 and o.concurrency == 4 and o.samples == 4
    m = sum(per) / 4
    se = math.sqrt(sum((x - m) ** 2 for x in per) / 3 / 4)
    assert o.tps_std == pytest.approx(42.0 * se / m)
    for text, word in (("no json here\n", "no JSON object"), (json.dumps({"wall_s": 1}), "tokens_per_s"),
                       (json.dumps({"tokens_per_s": 0}), "positive")):
        f.write_text(text)
        with pytest.raises(InputError, match=word):
            observation_from_load_json(f)


def test_cli_load_json_against_plain_load_json(tmp_path, capsys):
    spec, plain = tmp_path / "spec.out", tmp_path / "plain.out"
    spec.write_text(json.dumps({"tokens_per_s": 240.0, "per_request_tokens_per_s": [60, 61, 59, 60],
                                "concurrency": 4, "requests": 4, "completion_tokens": 960, "wall_s": 4.0,
                                "mean_commit_len": 3.1}) + "\n")
    plain.write_text(json.dumps({"tokens_per_s": 100.0, "per_request_tokens_per_s": [25, 25, 25, 25],
                                 "concurrency": 4, "requests": 4, "completion_tokens": 400, "wall_s": 4.0}) + "\n")
    argv = ["estimate", "--load", str(spec), "--baseline", str(plain), "--cost-factor", "1.3",
            "--cost-factor-std", "0.05", "--output-format", "json"]
    assert cli.main(argv) == 0  # 2.4 * 1.3 = 3.12 against the server's 3.1
    d = json.loads(capsys.readouterr().out)["results"][0]
    assert d["estimate"]["value"] == pytest.approx(3.12) and d["reported_commit_len"] == 3.1
    assert d["concurrency"] == 4 and d["source"] == "load"
    assert cli.main(argv + ["--reported-commit-len", "4.5"]) == 1


# --------------------------------------------------------------------------- CLI

SEED = ["estimate", "--observed-tps", "109", "--baseline-tps", "98", "--cost-factor", "1.5"]


def test_cli_seed_consistent(capsys):
    assert cli.main(SEED + ["--reported-commit-len", "2.0"]) == 0
    out = capsys.readouterr().out
    assert "estimated commit length 1.67" in out and "verdict: consistent" in out


def test_cli_seed_inconsistent_json(capsys):
    assert cli.main(SEED + ["--reported-commit-len", "8", "--output-format", "json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["verdict"] == "inconsistent"
    r = d["results"][0]
    assert r["estimate"]["value"] == pytest.approx(1.668, abs=1e-3)
    assert r["predicted_tps"]["value"] == pytest.approx(8 / 1.5 * 98, abs=0.01)
    assert cli.main(SEED + ["--reported-accept-depth", "7"]) == 1


@pytest.mark.parametrize("flag,typed,code", [
    ("--reported-commit-len", "2.3", 0), ("--reported-commit-len", "2.3000", 1),
    ("--reported-accept-depth", "1.3", 0), ("--reported-accept-depth", "1.3000", 1)])
def test_cli_reported_figure_keeps_the_digits_it_was_typed_with(flag, typed, code, capsys):
    """The band's top here is 2.0296 x 1.11 = 2.2529: "2.3" stands for 2.25 to 2.35 and may be
    inside it, "2.3000" cannot (a float would have read both as 2.3). A depth is judged plus one
    with its digits kept."""
    assert cli.main(SEED + ["--tolerance", "0.11", flag, typed, "--output-format", "json"]) == code
    d = json.loads(capsys.readouterr().out)
    assert d["results"][0]["estimate"]["high"] * 1.11 == pytest.approx(2.2529, abs=1e-4)
    assert d["verdict"] == ("consistent" if code == 0 else "inconsistent")


def test_a_typed_figure_keeps_its_digits_through_a_copy_and_depth_plus_one():
    import copy
    import pickle

    from specaudit.audit.compare import Printed, precision
    a = Printed("7.0000")
    for b in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a)):
        assert isinstance(b, Printed) and precision(b) == precision(a) != precision(7.0)
    assert (Printed("6.00") + 1).text == "7.00" and precision(Printed("6.00") + 1) == precision(7.0, "7.00")


@pytest.mark.parametrize("argv,word", [
    (["estimate", "--observed-tps", "0", "--baseline-tps", "98", "--cost-factor", "1.5"], "positive"),
    (["estimate", "--observed-tps", "-3", "--baseline-tps", "98", "--cost-factor", "1.5"], "positive"),
    (["estimate", "--observed-tps", "109", "--cost-factor", "1.5"], "no baseline"),
    (["estimate", "--observed-tps", "109", "--baseline-tps", "98"], "no cost factor"),
    (["estimate", "--baseline-tps", "98", "--cost-factor", "1.5"], "no observed throughput"),
    (["estimate", str(FIX / "bad_empty.log"), "--baseline-tps", "98", "--cost-factor", "1.5"], "empty file"),
    (["estimate", str(FIX / "bad_mixed_engines.log"), "--baseline-tps", "98", "--cost-factor", "1.5"], "mixed"),
    (["estimate", str(FIX / "vllm_clean_single_scrape.prom"), "--baseline-tps", "98", "--cost-factor", "1.5"],
     "no rate"),
    (["estimate", "--observed-tps", "109", "--baseline-tps", "98", "--profile", "nope.json"], "not found"),
])
def test_cli_bad_input_one_line_exit_2(capsys, argv, word):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert word in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_profile_outside_grid(tmp_path, capsys):
    p = tmp_path / "cost.json"
    grid().save(p)
    argv = ["estimate", "--observed-tps", "109", "--baseline-tps", "98", "--profile", str(p), "--concurrency", "4"]
    assert cli.main(argv + ["--n-nodes", "32"]) == 2
    assert "does not cover N=32" in capsys.readouterr().err
    assert cli.main(argv + ["--n-nodes", "4", "--reported-commit-len", "1.7"]) == 0


def test_cli_not_enough_data_exit_2(capsys):
    assert cli.main(SEED[:-1] + ["1.5", "--cost-factor-std", "0.6", "--reported-commit-len", "2"]) == 2
    assert "not enough data" in capsys.readouterr().out
    assert cli.main(SEED) == 2  # nothing reported to judge
    assert "not enough data" in capsys.readouterr().out


def test_cli_engine_log_inputs(capsys):
    # SGLang: 8 requests at ~1900 tokens/s, accept len ~3.2. A baseline of 8 / t_ar(8) = 8 / 0.0133 and
    # r = t_step / t_ar = 1 give C = 1900 * 0.0133 / 8 = 3.2: consistent; a baseline twice as fast is not.
    base = 8 / (0.0105 + 0.00035 * 8)
    argv = ["estimate", str(FIX / "sglang_clean.log"), "--cost-factor", "1.0", "--cost-factor-std", "0.03",
            "--output-format", "json"]
    assert cli.main(argv + ["--baseline-tps", f"{base:.2f}"]) == 0
    d = json.loads(capsys.readouterr().out)["results"][0]
    assert d["estimate"]["value"] == pytest.approx(d["reported_commit_len"], rel=0.06)
    assert d["n_nodes"] == 4 and d["concurrency"] == 8
    assert cli.main(argv + ["--baseline-tps", f"{2 * base:.2f}"]) == 1
    capsys.readouterr()
    # vLLM multi-scrape: throughput from counter deltas over scraped_at
    assert cli.main(["estimate", str(FIX / "vllm_clean.prom"), "--cost-factor", "1.0", "--cost-factor-std", "0.03",
                     "--baseline-tps", f"{base:.2f}", "--output-format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)["results"][0]
    assert d["n_nodes"] == 4 and d["source"] == "prom-text"


def test_cli_counter_bug_in_log_is_inconsistent(capsys):
    """The depth/commit split log: accept len 7.00, throughput of 2 tokens per step."""
    base = 8 / (0.0105 + 0.00035 * 8)
    assert cli.main(["estimate", str(FIX / "sglang_accept_len_above_max.log"), "--cost-factor", "1.0",
                     "--baseline-tps", f"{base:.2f}", "--output-format", "json"]) == 1
    d = json.loads(capsys.readouterr().out)["results"][0]
    assert d["estimate"]["value"] == pytest.approx(2.0, rel=0.05)
    assert d["reported_commit_len"] == pytest.approx(7.0) and d["verdict"] == "inconsistent"


def test_estimate_help_teaches():
    from specaudit.commands import estimate
    assert "--reported-commit-len 2.0" in estimate.__doc__ and "Exit codes" in estimate.__doc__


# ------------------------------------------------- issue 13: the seed question, guards


SEED_Q = SEED + ["--reported-commit-len", "2", "--reported-accept-depth", "7"]


def test_seed_question_names_the_depth_counter(capsys):
    assert cli.main(SEED_Q) == 1
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1].strip()
    assert "supports the commit length counter (2.00)" in last
    assert "the accepted depth counter is the wrong one" in last
    assert "commit length = accepted depth + 1" in out and "broken" in out
    # flipped: an honest depth 0.67 (1.67 tokens per step) beside a commit counter of 8
    assert cli.main(SEED + ["--reported-commit-len", "8", "--reported-accept-depth", "0.67"]) == 1
    assert "the commit length counter is the wrong one" in capsys.readouterr().out


def test_seed_question_json_and_library_agree(capsys):
    from specaudit.audit.estimate import run_estimate
    assert cli.main(SEED_Q + ["--output-format", "json"]) == 1
    d = json.loads(capsys.readouterr().out)
    lib = run_estimate(observed_tps=109, baseline_tps=98, cost_factor=1.5, reported_commit_len=2,
                       reported_accept_depth=7)
    assert d == json.loads(json.dumps(lib.to_dict()))
    figs = {f["counter"]: f["verdict"] for f in d["results"][0]["figures"]}
    assert figs == {"commit length": CONSISTENT, "accepted depth": INCONSISTENT}


def test_seed_question_cannot_tell_when_the_interval_admits_both(capsys):
    # r's spread of 24%: the band is wide enough to hold 2 and 3 tokens per step, so the two
    # counters (2 and depth 2 -> 3) break the identity but throughput cannot say which
    argv = ["estimate", "--observed-tps", "120", "--baseline-tps", "100", "--cost-factor", "2",
            "--cost-factor-std", "0.48", "--reported-commit-len", "2", "--reported-accept-depth", "2"]
    assert cli.main(argv) == 2          # one of them is wrong, and the evidence cannot say which
    last = capsys.readouterr().out.strip().splitlines()[-1].strip()
    assert last.startswith("Cannot tell which counter is wrong") and "would decide" in last


def test_both_consistent_and_both_contradicted(capsys):
    assert cli.main(SEED + ["--reported-commit-len", "1.7", "--reported-accept-depth", "0.7"]) == 0
    assert "admits both counters" in capsys.readouterr().out
    assert cli.main(SEED + ["--reported-commit-len", "5", "--reported-accept-depth", "7"]) == 1
    assert "contradicts both counters" in capsys.readouterr().out


def test_trace_gives_both_counters(tmp_path, capsys):
    from specaudit.trace.synth import synth_run_rows, write_run
    s, r, m = synth_run_rows(6, algo="chain", budget=7, seed=3, run_id="both", max_new_tokens=40)
    write_run(tmp_path, s, r, m)
    assert cli.main(["estimate", str(tmp_path), "--baseline-tps", "100", "--cost-factor", "1",
                     "--output-format", "json"]) in (0, 1, 2)
    res = json.loads(capsys.readouterr().out)["results"][0]
    assert [f["counter"] for f in res["figures"]] == ["commit length", "accepted depth"]
    assert res["figures"][1]["reported"] == pytest.approx(m["reported"]["mean_accepted_depth"])


@pytest.mark.parametrize("tps,n,word", [(1090, 8, "above N = 8"), (30, 8, "below 1 token per step")])
def test_impossible_estimate_is_a_calibration_mismatch_not_a_verdict(tps, n, word, capsys):
    argv = ["estimate", "--observed-tps", str(tps), "--baseline-tps", "98", "--cost-factor", "1.5",
            "--n-nodes", str(n), "--reported-commit-len", "3"]
    assert cli.main(argv) == 2
    out = capsys.readouterr().out
    assert "verdict: calibration mismatch" in out and word in out and "Cannot judge the engine" in out
    e = estimate_commit_length(tps, 98, 1.5)
    assert verdict(e, 3, n_nodes=n) == "calibration mismatch"


@pytest.mark.parametrize("flag,value", [("--reported-commit-len", "-2"), ("--reported-commit-len", "0"),
                                        ("--reported-accept-depth", "-1"), ("--reported-accept-depth", "nan")])
def test_reported_at_or_below_zero_is_refused(flag, value, capsys):
    assert cli.main(SEED + [flag, value]) == 2
    err = capsys.readouterr().err
    assert flag in err and "above 0" in err and err.count("\n") == 1


def test_verdict_uses_the_printed_precision_of_the_reported_figure():
    e = estimate_commit_length(100, 100, 2.0)          # a point at 2.0, band [1.8, 2.2] at 10%
    assert verdict(e, 2.2) == CONSISTENT
    assert verdict(e, 2.25) == INCONSISTENT             # [2.245, 2.255) misses 2.2
    e = estimate_commit_length(3.4149, 1, 1.0)          # a point: the estimator then is compare.agrees
    assert verdict(e, 3.41, tolerance=0) == CONSISTENT
    assert verdict(e, 3.42, tolerance=0) == INCONSISTENT


def test_live_judgement_is_the_cli_pipeline():
    from specaudit.audit.estimate import live_judgement, run_estimate
    live = live_judgement(109, 0.0, concurrency=1, n_nodes=8, profile=CostProfile.manual(1.5), baseline_tps=98,
                          reported_commit_len=8)
    cli_res = run_estimate(observed_tps=109, baseline_tps=98, cost_factor=1.5, n_nodes=8, concurrency=1,
                           reported_commit_len=8).results[0]
    assert live["verdict"] == cli_res["verdict"] == INCONSISTENT
    assert live["estimate"] == cli_res["estimate"] and live["conclusion"] == cli_res["conclusion"]


# ------------------------------------- "admits" is not "supports" (the demo's sentence)


def test_one_admitted_figure_is_admitted_not_supported(capsys):
    # the seed band (about [1.2, 2.2]) holds 1.7 and every figure near it: it admits, it does not support
    assert cli.main(SEED + ["--reported-commit-len", "1.7"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1].strip()
    assert last.startswith("The evidence admits the commit length counter (1.70)") and "supports" not in last


def test_band_holding_the_counter_and_the_derived_figure_cannot_tell_them_apart(tmp_path, capsys):
    """The demo's injected run: the commit counter (2.00) is out of the band, the depth
    counter (as commit length) and the commit length re-derived from the trace's committed
    tokens both sit in it: throughput cannot tell those two apart, and the sentence says
    what decides, instead of saying the evidence supports the depth counter."""
    import pyarrow.compute as pc

    from specaudit.audit.observed_throughput import observations_from_traces
    from specaudit.trace.synth import synth_run_rows, write_run
    s, r, m = synth_run_rows(6, algo="chain", budget=7, seed=3, run_id="demo", max_new_tokens=40)
    truth = pc.sum(pc.list_value_length(s.column("committed_tokens"))).as_py() / s.num_rows
    depth = round(truth - 1 + 0.6, 2)          # a depth counter 0.6 tokens per step above the truth
    m["reported"].update(mean_commit_len=2.0, mean_accepted_depth=depth)
    write_run(tmp_path, s, r, m)
    (o,) = observations_from_traces(tmp_path)
    assert o.extra["derived_commit_len"] == pytest.approx(truth)
    base = o.tps / (truth + 0.3)               # an estimate between the two, its band holding both
    argv = ["estimate", str(tmp_path), "--baseline-tps", f"{base:.6f}", "--cost-factor", "1",
            "--cost-factor-std", "0.02"]
    assert cli.main(argv + ["--output-format", "json"]) == 1     # the commit counter is contradicted
    res = json.loads(capsys.readouterr().out)["results"][0]
    assert res["derived_commit_len"] == pytest.approx(truth, abs=1e-4)
    assert {f["counter"]: f["verdict"] for f in res["figures"]} == {"commit length": INCONSISTENT,
                                                                      "accepted depth": CONSISTENT}
    c = res["conclusion"]
    assert "supports" not in c and "contradicts the commit length counter (2.00)" in c
    assert f"admits the accepted depth counter ({depth:.2f}" in c and f"derived {truth:.2f}" in c
    assert "cannot tell the two apart" in c and "decides" in c
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    assert f"derived commit length {truth:.2f}" in out and out.strip().splitlines()[-1].strip() == c
    # a depth counter that agrees with the derived figure (depth + 1 at most 10% above it: the
    # cut last steps of requests): nothing to tell apart, it is supported
    m["reported"].update(mean_accepted_depth=truth - 1 + 0.05 * truth)
    write_run(tmp_path / "agree", s, r, m)
    assert cli.main(["estimate", str(tmp_path / "agree")] + argv[2:]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1].strip()
    assert last.startswith("The evidence supports the accepted depth counter") and "cannot tell" not in last
