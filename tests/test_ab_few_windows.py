"""`specaudit ab A B` with few windows: the method is fit for them, named, and decides
where the data decide (issue 28 item 3).

The seed logs (tests/fixtures/engines/seed_linear.log, seed_chain.log, from _make.py):
linear's 4 windows at 1 running request are each faster than each of the DDTree chain's
8. Its 4 windows drift together, so their lag-1 correlation reads high; the moving-block
bootstrap with an effective sample size floored at 2 (a t with 1 df) made linear's
interval many times wider than its windows' spread and called the stratum
"undecided".
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from specaudit.audit.ab_evidence import compare_sides
from specaudit.audit.ab_evidence.comparison import compare_windows
from specaudit.audit.ab_evidence.stats import BLOCK_MIN_WINDOWS, more_windows, permutation_p
from specaudit.audit.ab_evidence.text import format_text
from specaudit.audit.ab_evidence.window import EvWindow, concurrency_bin
from specaudit.cli import main

ENGINES = Path(__file__).parent / "fixtures" / "engines"
LINEAR, CHAIN = str(ENGINES / "seed_linear.log"), str(ENGINES / "seed_chain.log")


def _w(side, c, L, **strata):
    st = {"concurrency": concurrency_bin(c), "cuda_graph": True, "rank": "0", "k": 7, "topk": 1, "algo": "x",
          "engine": "sglang", "version": None, "model": None, **strata}
    return EvWindow(side=side, file=f"{side}.log", ref="line 1", strata=st, accept_len=L, concurrency=c)


def _stratum_1(res):
    return next(s for s in res["strata"] if s["stratum"].get("concurrency", "1") == "1")


def test_seed_logs_decided_at_matched_concurrency_with_the_gap(capsys):
    res = compare_sides(LINEAR, CHAIN, primary="tokens_per_s")
    s = _stratum_1(res)
    assert (s["windows_a"], s["windows_b"]) == (4, 8)
    x = s["metrics"]["tokens_per_s"]
    assert x["verdict"] == "A better"
    assert x["a"]["method"] == x["b"]["method"] == "t"
    assert x["permutation_p"] is not None and x["permutation_p"] < 0.01
    # never wider than the data justify: A's interval within the t(3) interval of its 4 windows
    lines = [ln for ln in Path(LINEAR).read_text().splitlines() if "#running-req: 1," in ln]
    tps = np.array([float(ln.split("gen throughput (token/s): ")[1].split(",")[0]) for ln in lines])
    half_t3 = 3.182 * tps.std(ddof=1) / math.sqrt(len(tps))
    lo, hi = x["a"]["ci95"]
    assert (hi - lo) / 2 < 1.15 * half_t3
    assert res["verdict"] == "A better"
    assert "A is better by" in res["conclusion"] and "% of A" in res["conclusion"]
    # the method is named in the text and in the JSON
    assert main(["ab", LINEAR, CHAIN, "--primary", "tokens_per_s"]) == 0
    out = capsys.readouterr().out
    assert "intervals: t interval, n-1 df" in out and "permutation test" in out
    assert main(["ab", LINEAR, CHAIN, "--output-format", "json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert _stratum_1(js)["metrics"]["accept_len"]["a"]["method"] == "t"


def test_block_bootstrap_only_with_enough_windows():
    rng = np.random.default_rng(3)
    n = BLOCK_MIN_WINDOWS
    res = compare_windows([_w("A", 1, v) for v in rng.normal(2.0, 0.05, n)],
                          [_w("B", 1, v) for v in rng.normal(2.0, 0.05, n - 1)], n_boot=400)
    x = res["strata"][0]["metrics"]["accept_len"]
    assert (x["a"]["method"], x["b"]["method"]) == ("block", "t")
    assert "A moving-block bootstrap" in format_text(res) and "B t interval" in format_text(res)


def test_permutation_p_exact():
    # every A window above every B window: only the observed labelling (and at most its
    # mirror) is as extreme as itself among the C(12, 4) = 495
    a, b = np.array([10.0, 10.1, 10.2, 10.3]), np.arange(8, dtype=float)
    assert 1 / 495 <= permutation_p(a, b) <= 2 / 495
    a, b = np.array([0.0, 1.0, 6.0, 7.0]), np.array([2.0, 3.0, 4.0, 5.0, 2.5, 3.5, 4.5, 1.5])
    assert permutation_p(a, b) > 0.5
    assert permutation_p(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == 1.0
    assert permutation_p(np.array([]), b) is None


def test_undecided_says_how_many_more_windows_would_decide():
    # 4 noisy windows a side, a 3% gap: the data cannot tell yet
    a = [2.00, 2.20, 1.90, 2.10]
    b = [2.06, 2.26, 1.96, 2.18]
    res = compare_windows([_w("A", 1, v) for v in a], [_w("B", 1, v) for v in b], n_boot=2000, same_within=0.0)
    x = res["strata"][0]["metrics"]["accept_len"]
    assert x["verdict"] == "undecided"
    assert x["more_windows"] >= 1
    assert f"about {x['more_windows']} more windows per side" in res["conclusion"]
    # the count is the one that narrows the interval under the gap
    lo, hi = x["diff_b_minus_a"]["ci95"]
    d = x["diff_b_minus_a"]["mean"]
    n2 = 4 + x["more_windows"]
    assert (hi - lo) / 2 * math.sqrt(4 / n2) < abs(d)
    # a nil gap with no same-band: no number of windows decides, and it says so
    assert more_windows(4, 4, [-0.1, 0.1], 0.0, 2.0, 0.0) is None
    res = compare_windows([_w("A", 1, v) for v in a], [_w("B", 1, v) for v in a[::-1]], n_boot=500, same_within=0.0)
    assert "more of them at this spread would not" in res["conclusion"]


def test_confounder_report_honours_same_within():
    # the pooled gap is 3% of A: outside the default 2% "same" band, inside a 5% one.
    # Before the fix, confounder_report used a hard-coded 0.02 and explained the gap anyway.
    wa = [_w("A", 1, 2.0 + 0.01 * (i % 3)) for i in range(6)] + [_w("A", 8, 2.3 + 0.01 * (i % 3)) for i in range(6)]
    wb = [_w("B", 1, 2.0 + 0.01 * (i % 3)) for i in range(10)] + [_w("B", 8, 2.3 + 0.01 * (i % 3)) for i in range(2)]
    res = compare_windows(wa, wb, n_boot=300, same_within=0.02)
    conc = next(e for e in res["confounders"] if e["key"] == "concurrency")
    assert conc["explains"] is not None and conc["explains"] > 0.5
    res = compare_windows(wa, wb, n_boot=300, same_within=0.05)
    conc = next(e for e in res["confounders"] if e["key"] == "concurrency")
    assert conc["explains"] is None and conc["note"] == "the pooled figures already agree"
    assert conc["explains_by_metric"] == {}
