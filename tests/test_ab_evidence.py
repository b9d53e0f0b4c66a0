"""`specaudit ab A B`: A/B from evidence (engine logs, scrapes, trace datasets), fairly.

The seed case is rendered as SGLang decode lines: a linear arm (A) logged at high and
low concurrency, a tree arm (B) at one running request only. The pooled gap (about 3.5
vs 2.0 tokens per step) must be named as concurrency, the matched verdict be "same".
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from specaudit.audit.ab_evidence import compare_sides
from specaudit.audit.ab_evidence.comparison import NoOverlap, compare_windows
from specaudit.audit.ab_evidence.sides import windows_from_traces
from specaudit.audit.ab_evidence.text import format_text
from specaudit.audit.ab_evidence.window import EvWindow, concurrency_bin
from specaudit.cli import main
from specaudit.trace.safe_io import InputError
from specaudit.trace.synth import synth_run_rows, write_run

ENGINES = Path(__file__).parent / "fixtures" / "engines"


# ------------------------------------------------------------------ renderers

def sglang_log(path, windows, *, seed=0, algo="DFLASH", D=8, model="org/big-275b", rank="", bonus_rate=False):
    """Write an SGLang server log: a server_args line, then per (c, accept len, n, cuda
    graph) n `Decode batch` lines at that concurrency. The accept lens spread evenly
    around their mean (+-0.04, in a seeded order), so a stratum's mean is the one asked for."""
    r = random.Random(seed)
    spread = [-0.04, -0.02, 0.0, 0.02, 0.04]
    lines = [f"[2026-11-02 10:00:00] server_args=ServerArgs(model_path='{model}', speculative_algorithm='{algo}', "
             f"speculative_num_steps={D - 1}, speculative_eagle_topk=1, speculative_num_draft_tokens={D}, "
             "dp_size=1, decode_log_interval=40)"]
    t = 0
    for c, L, n, graph in windows:
        offs = [spread[i % 5] for i in range(n)]
        r.shuffle(offs)
        for off in offs:
            t += 3
            acc = L + off
            tps = c * acc / (0.012 + 0.0004 * c) * (1 + off / 4)
            lines.append(f"[2026-11-02 1{t // 3600}:{t // 60 % 60:02d}:{t % 60:02d}{rank}] Decode batch, "
                         f"#running-req: {c}, #token: {700 * c}, token usage: 0.01, accept len: {acc:.2f}, "
                         f"accept rate: {(acc / D if bonus_rate else (acc - 1) / (D - 1)):.2f}, cuda graph: {graph}, "
                         f"gen throughput (token/s): {tps:.2f}, #queue-req: 0, ")
    Path(path).write_text("\n".join(lines) + "\n")
    return str(path)


def vllm_log(path, windows, *, seed=0, engine_line=True, k=3):
    """Write a vLLM V1 log: per (c, mean acceptance length, n) n stats intervals."""
    r = random.Random(seed)
    lines = ["(APIServer pid=1) INFO 10-02 14:10:04 [api_server.py:1805] vLLM API server version 0.10.1.1"]
    s = 0
    for c, L, n in windows:
        for _ in range(n):
            s += 10
            drafts = 400
            acc_tok = int(round((r.gauss(L, 0.03) - 1) * drafts))
            drafted = drafts * k
            ts = f"10-02 14:{s // 60 % 60:02d}:{s % 60:02d}"
            if engine_line:
                lines.append(f"(APIServer pid=1) INFO {ts} [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 "
                             f"tokens/s, Avg generation throughput: {c * 90.0:.1f} tokens/s, Running: {c} reqs, "
                             "Waiting: 0 reqs, GPU KV cache usage: 1.2%, Prefix cache hit rate: 0.0%")
            mean = 1 + acc_tok / drafts
            per = [min(1.0, (mean - 1) * f) for f in (0.5, 0.3, 0.2)]
            lines.append(f"(APIServer pid=1) INFO {ts} [metrics.py:120] SpecDecoding metrics: Mean acceptance length: "
                         f"{mean:.2f}, Accepted throughput: 10.00 tokens/s, Drafted throughput: 20.00 tokens/s, "
                         f"Accepted: {acc_tok} tokens, Drafted: {drafted} tokens, Per-position acceptance rate: "
                         f"{per[0]:.3f}, {per[1]:.3f}, {per[2]:.3f}, Avg Draft acceptance rate: "
                         f"{100 * acc_tok / drafted:.1f}%")
    Path(path).write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture()
def seed_logs(tmp_path):
    (tmp_path / "logs").mkdir()
    a = sglang_log(tmp_path / "logs" / "linear.log", [(32, 3.95, 60, True), (1, 2.05, 20, True)], seed=1)
    b = sglang_log(tmp_path / "logs" / "ddtree.log", [(1, 2.05, 40, True)], seed=2, algo="DDTREE")
    return a, b


# ------------------------------------------------------------------ the seed case

def test_seed_case_pooled_gap_is_concurrency(seed_logs):
    a, b = seed_logs
    res = compare_sides(a, b)
    pooled, matched = res["pooled"]["accept_len"], res["matched"]["accept_len"]
    # the unfair comparison: about 3.5 vs 2.0, "A better"
    assert 3.3 < pooled["a"]["mean"] < 3.6 and 1.95 < pooled["b"]["mean"] < 2.15
    assert pooled["verdict"] == "A better"
    # the fair one: at 1 running request, the same
    assert [s["stratum"] for s in res["strata"]] == [{"concurrency": "1"}]
    s = res["strata"][0]
    assert (s["windows_a"], s["windows_b"]) == (20, 40)
    assert s["metrics"]["accept_len"]["verdict"] == "same"
    assert matched["verdict"] == "same" and res["verdict"] == "same"
    lo, hi = s["metrics"]["accept_len"]["a"]["ci95"]
    assert lo < 2.05 < hi
    # the high-concurrency windows are listed, never compared
    assert res["one_sided"] == [{"stratum": {"concurrency": "17-32"}, "label": "concurrency 17-32",
                                 "side": "A", "windows": 60}]
    # Simpson: said first
    assert [p["metric"] for p in res["paradox"]][0] == "accept_len"
    assert res["paradox"][0]["pooled_verdict"] == "A better" and res["paradox"][0]["matched_verdict"] == "same"
    text = format_text(res)
    assert text.splitlines()[0].startswith("WARNING: pooled accept length says A better")
    # the confounder report: concurrency explains (nearly) all of the gap; the algorithm is what is compared
    conc = next(e for e in res["confounders"] if e["key"] == "concurrency")
    assert conc["explains"] > 0.9 and conc["a"] == {"1": 0.25, "17-32": 0.75} and conc["b"] == {"1": 1.0}
    algo = next(e for e in res["confounders"] if e["key"] == "algo")
    assert algo["role"] == "varied" and algo["explains"] is None and "inseparable" in algo["note"]
    assert res["varied"] == {"algo": {"a": ["DFLASH"], "b": ["DDTREE"]}}
    c = res["conclusion"]
    assert c.startswith("the pooled gap in accept length 3.")
    assert "vs 2.0" in c and " is concurrency: at 1 running request A gives 2.0" in c and c.endswith("the same.")
    assert text.splitlines()[-1] == c


def test_seed_case_cli_text_and_json(seed_logs, capsys, tmp_path):
    a, b = seed_logs
    assert main(["ab", a, b]) == 0
    out = capsys.readouterr().out
    assert out.startswith("WARNING: pooled accept length says A better")
    assert "on one side only (not compared):\n  concurrency 17-32: A only, 60 windows" in out
    assert main(["ab", a, b, "--output-format", "json", "-o", str(tmp_path / "ab.json")]) == 0
    d = json.loads((tmp_path / "ab.json").read_text())
    assert d["kind"] == "specaudit-ab-evidence" and d["verdict"] == "same"
    assert d["conclusion"] == compare_sides(a, b)["conclusion"]  # seeded: the same result twice


def test_cuda_graph_moving_with_concurrency_is_named(tmp_path):
    # SGLang runs without CUDA graphs above cuda_graph_max_bs: on A both changed together
    a = sglang_log(tmp_path / "a.log", [(64, 3.9, 30, False), (1, 2.0, 20, True)], seed=3)
    b = sglang_log(tmp_path / "b.log", [(1, 2.0, 30, True)], seed=4, algo="DDTREE")
    res = compare_sides(a, b)
    keys = {e["key"]: e for e in res["confounders"]}
    assert keys["concurrency"]["moves_with"] == ["cuda_graph"] and keys["cuda_graph"]["moves_with"] == ["concurrency"]
    assert "concurrency and cuda graph (they moved together" in res["conclusion"]


def test_real_difference_is_found_where_comparable(tmp_path):
    # B really is worse at the shared concurrency: the verdict says so, no paradox
    a = sglang_log(tmp_path / "a.log", [(8, 3.2, 30, True), (1, 3.2, 30, True)], seed=5)
    b = sglang_log(tmp_path / "b.log", [(8, 2.6, 30, True), (1, 2.6, 30, True)], seed=6, algo="DDTREE")
    res = compare_sides(a, b)
    assert [s["metrics"]["accept_len"]["verdict"] for s in res["strata"]] == ["A better", "A better"]
    assert res["verdict"] == "A better" and res["paradox"] == []
    assert res["conclusion"].startswith("accept length: at ") and "A is better" in res["conclusion"]
    assert "over all 2 matched strata: A better (2 of 2 strata say so)" in res["conclusion"]


def test_several_files_on_one_side(tmp_path):
    a1 = sglang_log(tmp_path / "a1.log", [(1, 2.0, 10, True)], seed=7)
    a2 = sglang_log(tmp_path / "a2.log", [(1, 2.0, 10, True)], seed=8)
    b = sglang_log(tmp_path / "b.log", [(1, 2.0, 20, True)], seed=9)
    res = compare_sides(f"{a1},{a2}", b)
    assert res["sides"]["A"]["windows"] == 20 and len(res["sides"]["A"]["files"]) == 2
    res2 = compare_sides(str(tmp_path / "a*.log"), b)
    assert res2["sides"]["A"]["windows"] == 20
    assert res["strata"][0]["metrics"]["accept_len"]["verdict"] == "same"


def test_vllm_logs_and_vary(tmp_path):
    a = vllm_log(tmp_path / "a.log", [(4, 2.4, 20)], seed=1)
    b = vllm_log(tmp_path / "b.log", [(4, 2.4, 20)], seed=2)
    res = compare_sides(a, b)
    assert res["strata"][0]["metrics"]["accept_len"]["verdict"] == "same"
    # accept rate from the counts: accepted / drafted
    assert abs(res["pooled"]["accept_rate"]["a"]["mean"] - 1.4 / 3) < 0.02
    assert "cuda_graph" not in res["matched_keys"]    # vLLM does not print it
    # an operational key named in --vary is compared across, with a warning
    c = vllm_log(tmp_path / "c.log", [(16, 2.4, 20)], seed=3)
    res = compare_sides(a, c, vary=["concurrency"])
    assert any("compared across concurrency" in w for w in res["warnings"])


# ------------------------------------------------------------------ trace datasets

def _trace(out, *, algo="chain", accept_p=0.6, concurrency=1, seed=0, n=24, inflate=False):
    s, q, m = synth_run_rows(n_requests=n, algo=algo, budget=7, accept_p=accept_p, concurrency=concurrency,
                             seed=seed, run_id=f"{algo}-c{concurrency}-s{seed}", max_new_tokens=160)
    if inflate:  # the commit_len counter lies (x3); the tensors do not
        import pyarrow as pa
        i = s.schema.get_field_index("commit_len")
        s = s.set_column(i, "commit_len", pa.array(np.asarray(s["commit_len"]) * 3, pa.int32()))
    return write_run(out, s, q, m)


def test_trace_windows_from_rows_not_counters(tmp_path):
    _trace(tmp_path / "honest", seed=1)
    _trace(tmp_path / "lying", seed=1, inflate=True)
    w1 = windows_from_traces(tmp_path / "honest", "A")
    w2 = windows_from_traces(tmp_path / "lying", "B")
    assert len(w1) > 5 and [w.accept_len for w in w1] == [w.accept_len for w in w2]
    s, _, _ = synth_run_rows(n_requests=24, algo="chain", budget=7, accept_p=0.6, concurrency=1, seed=1,
                             run_id="x", max_new_tokens=160)
    per_step = np.array([len(x) for x in s["committed_tokens"].to_pylist()], dtype=float)
    # every window's accept length lies within the rows' range, and the mean is near the rows' mean
    assert all(1 <= w.accept_len <= 8 for w in w1)
    assert abs(np.mean([w.accept_len for w in w1]) - per_step.mean()) < 0.3
    assert all(w.strata["concurrency"] == 1 and w.strata["k"] == 7 and w.strata["algo"] == "chain" for w in w1)


def test_trace_datasets_ab(tmp_path):
    _trace(tmp_path / "a", accept_p=0.6, concurrency=4, seed=1)
    _trace(tmp_path / "a", accept_p=0.6, concurrency=1, seed=2)
    _trace(tmp_path / "b", algo="tree", accept_p=0.6, concurrency=1, seed=3, n=32)
    res = compare_sides(str(tmp_path / "a"), str(tmp_path / "b"))
    assert set(res["varied"]) == {"algo", "topk"}
    assert any("cannot be pinned on one of them" in w for w in res["warnings"])
    by = {s["label"]: s for s in res["strata"]}
    assert "concurrency 1" in by and by["concurrency 1"]["metrics"]["tokens_per_s"]["a"]["n"] >= 3
    assert {o["side"] for o in res["one_sided"]} == {"A"}


# ------------------------------------------------------------------ unit: strata and statistics

def _w(side, c, L, **strata):
    st = {"concurrency": concurrency_bin(c), "cuda_graph": True, "rank": "0", "k": 7, "topk": 1, "algo": "x",
          "engine": "sglang", "version": None, "model": None, **strata}
    return EvWindow(side=side, file=f"{side}.log", ref="line 1", strata=st, accept_len=L, concurrency=c)


def test_concurrency_bins():
    assert [concurrency_bin(c) for c in (1, 2, 3, 4, 5, 8, 9, 17, 32, 33)] == \
        [1, 2, "3-4", "3-4", "5-8", "5-8", "9-16", "17-32", "17-32", "33-64"]
    assert concurrency_bin(17, "exact") == 17


def test_simpson_reversal():
    # A better in every stratum, B better pooled: the mix of concurrencies points the wrong way
    rng = np.random.default_rng(0)
    wa = [_w("A", 1, 2.2 + rng.normal(0, .02)) for _ in range(40)] + [_w("A", 32, 1.5 + rng.normal(0, .02))
                                                                       for _ in range(160)]
    wb = [_w("B", 1, 2.0 + rng.normal(0, .02)) for _ in range(160)] + [_w("B", 32, 1.3 + rng.normal(0, .02))
                                                                        for _ in range(40)]
    res = compare_windows(wa, wb)
    assert res["pooled"]["accept_len"]["verdict"] == "B better"
    assert res["matched"]["accept_len"]["verdict"] == "A better"
    assert res["paradox"][0]["reversal"] and "Simpson's paradox" in res["paradox"][0]["message"]
    assert format_text(res).startswith("WARNING: pooled accept length says B better")


def test_same_within_band_and_undecided():
    rng = np.random.default_rng(1)
    wa = [_w("A", 1, 2.0 + rng.normal(0, .3)) for _ in range(4)]
    wb = [_w("B", 1, 2.0 + rng.normal(0, .3)) for _ in range(4)]
    assert compare_windows(wa, wb)["verdict"] == "undecided"   # four noisy windows decide nothing


def test_thin_strata_are_listed_not_compared():
    wa = [_w("A", 1, 2.0) for _ in range(10)] + [_w("A", 8, 3.0) for _ in range(2)]
    wb = [_w("B", 1, 2.0) for _ in range(10)] + [_w("B", 8, 3.0) for _ in range(2)]
    res = compare_windows(wa, wb)
    assert [s["label"] for s in res["strata"]] == ["concurrency 1"]
    assert res["too_few_windows"] == [{"stratum": {"concurrency": "5-8"}, "label": "concurrency 5-8",
                                       "windows_a": 2, "windows_b": 2}]


def test_unknown_key_is_not_matched():
    wa = [_w("A", 1, 2.0, cuda_graph=None) for _ in range(5)]
    wb = [_w("B", 1, 2.0) for _ in range(5)]
    res = compare_windows(wa, wb)
    assert "cuda_graph" not in res["matched_keys"] and res["unknown_keys"] == {"cuda_graph": ["A"]}
    assert any("cuda graph is not reported by A" in w for w in res["warnings"])


# ------------------------------------------------------------------ bad input

def _err(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_no_overlapping_stratum_exit_2(tmp_path, capsys):
    a = sglang_log(tmp_path / "a.log", [(32, 3.9, 20, True)], seed=1)
    b = sglang_log(tmp_path / "b.log", [(1, 2.0, 20, True)], seed=2)
    with pytest.raises(NoOverlap):
        compare_sides(a, b)
    assert main(["ab", a, b]) == 2
    e = _err(capsys)
    assert "share no stratum: A has concurrency 17-32, B 1" in e
    assert "collect windows of B at concurrency 17-32 or of A at 1" in e
    assert not (tmp_path / "ab.json").exists()


def test_mixed_engines_on_one_side_exit_2(tmp_path, capsys):
    s = sglang_log(tmp_path / "s.log", [(1, 2.0, 10, True)])
    v = vllm_log(tmp_path / "v.log", [(1, 2.0, 10)])
    assert main(["ab", f"{s},{v}", s]) == 2
    e = _err(capsys)
    assert "side A mixes engines" in e and "sglang" in e and "vllm" in e


def test_windows_without_concurrency_exit_2(tmp_path, capsys):
    a = vllm_log(tmp_path / "a.log", [(4, 2.4, 10)], engine_line=False)
    b = vllm_log(tmp_path / "b.log", [(4, 2.4, 10)])
    assert main(["ab", a, b]) == 2
    e = _err(capsys)
    assert "none of its 10 windows says how many requests were running" in e
    # some windows without it: left out, with a warning
    wa = [_w("A", 1, 2.0) for _ in range(5)] + [EvWindow(side="A", file="a.log", ref="line 9",
                                                         strata={}, accept_len=2.0)]
    res = compare_windows(wa, [_w("B", 1, 2.0) for _ in range(5)])
    assert res["sides"]["A"]["windows"] == 5
    assert "1 of 6 windows have no (or a zero) running-request count" in res["warnings"][0]


@pytest.mark.parametrize("make,needle", [
    (lambda p: p.write_text(""), "empty file"),
    (lambda p: p.write_bytes(b"\x00\x01binary"), "binary file"),
    (lambda p: p.write_text("hello\nworld\n"), "not a recognised engine log"),
    (None, "no such file"),
])
def test_empty_or_unreadable_exit_2(tmp_path, capsys, make, needle):
    bad = tmp_path / "bad.log"
    if make:
        make(bad)
    good = sglang_log(tmp_path / "good.log", [(1, 2.0, 10, True)])
    assert main(["ab", good, str(bad)]) == 2
    assert needle in _err(capsys)


@pytest.mark.parametrize("argv,needle", [
    (["x.log"], "give two sides, A and B (got 1)"),
    (["x.log", "y.log", "--a=--algo chain"], "either two sides (evidence) or --a/--b"),
    ([], "give two sides to compare"),
    (["{a}", "{b}", "--vary", "colour"], "--vary colour: not a stratum key"),
    (["{a}", "{b}", "--baseline-tps", "98"], "needs both --baseline-tps"),
    (["{a}", "{b}", "--baseline-tps", "1=x", "--cost-factor", "1.5"], "--baseline-tps '1=x'"),
    (["{a}", "{b}", "--primary", "commit_len_tput"], "needs --baseline-tps and --cost-factor"),
    (["{a}", "{b}", "--min-windows", "1"], "--min-windows must be at least 2"),
    (["{a}", str(Path("/nonexistent") / "*.log")], "the pattern matches no file"),
])
def test_cli_usage_errors(tmp_path, capsys, argv, needle):
    a = sglang_log(tmp_path / "a.log", [(1, 2.0, 10, True)])
    b = sglang_log(tmp_path / "b.log", [(1, 2.0, 10, True)], seed=3)
    argv = [x.format(a=a, b=b) for x in argv]
    assert main(["ab", *argv]) == 2
    assert needle in _err(capsys)


# ------------------------------------------------------------------ throughput-derived commit length

def test_throughput_commit_length(seed_logs):
    a, b = seed_logs
    res = compare_sides(a, b, baseline_tps="1=40,32=30", cost_factor="1.0", primary="commit_len_tput")
    x = res["strata"][0]["metrics"]["commit_len_tput"]
    # tps / c / baseline * r with the renderer's step time: 2.05 / 0.0124 / 40 ~ 4.1 on both sides
    assert 3.9 < x["a"]["mean"] < 4.4 and x["verdict"] == "same"
    assert res["primary"] == "commit_len_tput" and res["baseline_tps"] == {"1": 40.0, "32": 30.0}


# ------------------------------------------------------------------ the engines' corpus

@pytest.mark.parametrize("name", ["sglang_clean.log", "vllm_clean.log", "sglang_clean_dp2.log", "vllm_clean_dp2.log"])
def test_corpus_a_a_names_no_winner(name):
    # a log against itself: never "A better" / "B better" (a false alarm), in any stratum or pooled
    res = compare_sides(str(ENGINES / name), str(ENGINES / name), min_windows=2)
    verdicts = [x["verdict"] for s in res["strata"] for x in s["metrics"].values()]
    verdicts += [x["verdict"] for x in list(res["pooled"].values()) + list(res["matched"].values())]
    assert verdicts and set(verdicts) <= {"same", "undecided"}
    assert res["paradox"] == [] and res["one_sided"] == [] and res["varied"] == {}


def test_corpus_cuda_graph_off_windows_are_one_sided():
    res = compare_sides(str(ENGINES / "sglang_clean.log"), str(ENGINES / "sglang_cuda_graph_degraded.log"))
    assert [(o["side"], o["stratum"]) for o in res["one_sided"]] == [("B", {"cuda_graph": "off"})]
    assert [s["stratum"] for s in res["strata"]] == [{"cuda_graph": "on"}]
    graph = next(e for e in res["confounders"] if e["key"] == "cuda_graph")
    assert graph["a"] == {"on": 1.0} and abs(graph["b"]["off"] - 1 / 3) < 1e-9


def test_corpus_dp_ranks_matched_by_rank():
    res = compare_sides(str(ENGINES / "sglang_clean_dp2.log"), str(ENGINES / "sglang_clean.log"))
    assert [s["stratum"] for s in res["strata"]] == [{"rank": "0"}]
    assert [(o["side"], o["stratum"]) for o in res["one_sided"]] == [("A", {"rank": "1"})]


def test_corpus_concurrency_shift_has_no_shared_stratum(capsys):
    assert main(["ab", str(ENGINES / "sglang_clean.log"), str(ENGINES / "sglang_concurrency_shift.log")]) == 2
    e = _err(capsys)
    assert "A has concurrency 5-8, B 1/9-16" in e and "windows of B at concurrency 5-8 or of A at 1/9-16" in e


def test_corpus_vllm_k_differs_is_varied():
    res = compare_sides(str(ENGINES / "vllm_clean.log"), str(ENGINES / "vllm_clean_k5.log"), min_windows=2)
    assert res["varied"]["k"] == {"a": ["3"], "b": ["5"]}


# ------------------------------------------------------------------ report

def test_report_plots_an_ab_result(seed_logs, tmp_path, capsys):
    a, b = seed_logs
    (tmp_path / "res").mkdir()
    out = tmp_path / "res" / "ab.json"
    assert main(["ab", a, b, "--output-format", "json", "-o", str(out)]) == 0
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    page = (tmp_path / "rep" / "report.html").read_text()
    assert 'id="ab"' in page and "is concurrency" in page and "pooled accept length says A better" in page
    assert "<td>concurrency 1</td><td>accept length</td>" in page and "<td>concurrency</td>" in page
    png = (tmp_path / "rep" / "ab.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "res" / "other.json"
    bad.write_text('{"x": 1}')
    capsys.readouterr()
    assert main(["report", str(bad), "--out", str(tmp_path / "rep2")]) == 2
    assert "neither a run.json nor an A/B result" in _err(capsys)


# ------------------------------------------------------------------ Prometheus: scrapes and a server's range

def _scrapes(tmp_path, case="vllm_clean", n=12, name="s.prom"):
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    import prom_replay
    p = tmp_path / name
    p.write_text(prom_replay.text_scrapes(prom_replay.CASES[case], n))
    return str(p)


def test_prometheus_scrape_files(tmp_path):
    s = _scrapes(tmp_path)
    res = compare_sides(s, s)
    assert res["sides"]["A"]["files"][0]["kind"] == "prom-text" and res["sides"]["A"]["windows"] >= 10
    assert res["verdict"] == "same"     # counter deltas: the same file gives the same windows


def test_prometheus_url_side(tmp_path, monkeypatch):
    from specaudit.audit.sources import prom_http, read_source
    s = _scrapes(tmp_path)
    calls = []

    def fake(url, range_s, step_s, match, **kw):
        calls.append((url, range_s, step_s, list(match)))
        return [read_source(s)]
    monkeypatch.setattr(prom_http, "read_prometheus", fake)
    res = compare_sides('http://127.0.0.1:9090?match={job="a",model_name="m"}&range=2h&step=15s', s)
    assert calls == [("http://127.0.0.1:9090", 7200.0, 15.0, ['{job="a",model_name="m"}'])]
    assert res["sides"]["A"]["files"][0]["kind"] == "prometheus" and res["verdict"] == "same"
    with pytest.raises(InputError, match="not a duration"):
        compare_sides("http://127.0.0.1:9090?range=soon", s)


def test_report_plots_a_runtime_ab_result(tmp_path):
    # the ab.json of `specaudit ab --a --b --out` (runtime mode) plots too: one group, three metrics
    from specaudit.postmortem.report import _ab_groups
    m = {"a": {"mean": 5.0, "ci95": [4.5, 5.5]}, "b": {"mean": 5.0, "ci95": [4.5, 5.5]},
         "diff_b_minus_a": {"mean": 0.0, "ci95": [0.0, 0.0]}, "verdict": "same"}
    res = {"a": {}, "b": {}, "metrics": {"accepted_depth": m, "commit_len": m, "tokens_per_s": m},
           "verdict": "same", "primary": "tokens_per_s", "warnings": ["A and B differ in 2 settings"]}
    metrics, labels, _ = _ab_groups(res)
    assert metrics == ["tokens_per_s", "accepted_depth", "commit_len"] and labels == ["runs"]
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "ab.json").write_text(json.dumps(res))
    assert main(["report", str(tmp_path / "res" / "ab.json"), "--out", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "report.html").read_text()
    assert "A and B differ in 2 settings" in page and (tmp_path / "r" / "ab.png").stat().st_size > 1000


def test_seed_case_explains_every_metric(seed_logs):
    res = compare_sides(*seed_logs)
    conc = next(e for e in res["confounders"] if e["key"] == "concurrency")
    assert set(conc["explains_by_metric"]) == {"accept_len", "accept_rate", "tokens_per_s"}
    assert all(v > 0.9 for v in conc["explains_by_metric"].values())


def test_large_side_bootstrap_is_bounded():
    from specaudit.audit.ab_evidence import stats
    rng = np.random.default_rng(0)
    x = rng.normal(2.0, 0.1, stats.BOOT_EXACT_MAX + 1)
    reps = stats.mean_replicates(np.random.default_rng(1), x, 2000)
    assert reps.shape == (2000,) and abs(reps.std() - 0.1 / np.sqrt(len(x))) < 2e-4


def _ar1(rng, n, phi, mu=2.0, sd=0.05):
    x = np.empty(n)
    e = rng.normal(0, sd, n)
    x[0] = e[0] / np.sqrt(1 - phi ** 2)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return mu + x


def test_correlated_windows_do_not_make_false_alarms():
    # neighbouring windows share their load (AR(1), phi 0.8): two healthy engines with the
    # same mean. Resampling single windows calls a winner about half the time; the block
    # bootstrap with its effective-sample-size floor stays near the nominal 5%.
    alarms = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        xa, xb = _ar1(rng, 60, 0.8), _ar1(rng, 60, 0.8)
        res = compare_windows([_w("A", 1, v) for v in xa], [_w("B", 1, v) for v in xb], n_boot=400,
                              same_within=0.0)
        alarms += res["verdict"] in ("A better", "B better")
    assert alarms <= 5
    # and a real 5% difference in the same noise is still found
    rng = np.random.default_rng(99)
    res = compare_windows([_w("A", 1, v) for v in _ar1(rng, 120, 0.8, 2.0)],
                          [_w("B", 1, v) for v in _ar1(rng, 120, 0.8, 2.1)], n_boot=400)
    assert res["verdict"] == "B better"


def test_output_never_over_an_input(seed_logs, capsys):
    a, b = seed_logs
    before = Path(b).read_bytes()
    assert main(["ab", f"{a},{b}", b, "-o", b]) == 2   # b is inside side A's comma-separated list too
    assert "one of the files this command reads" in _err(capsys)
    assert Path(b).read_bytes() == before


CORPUS = ENGINES / "corpus" / "rendered"


def test_real_corpus_sglang_16274_dp_attention_regression(capsys):
    # SGLang issue 16274 (facts in tests/fixtures/engines/corpus/sglang.json): TP4 gave accept
    # length 2.34-2.37 over four chunked-prefill sizes, TP4 + DP4 attention 1.48-1.49. Each
    # scrape alone is consistent; only the comparison shows the regression. The gauges carry
    # no running-request count: refused unless the user names concurrency as not matched.
    a, b = str(CORPUS / "sglang-16274-tp4-chunk*.prom"), str(CORPUS / "sglang-16274-dp4-chunk*.prom")
    assert main(["ab", a, b, "--min-windows", "2"]) == 2
    e = _err(capsys)
    assert "none of its 4 windows says how many requests were running" in e and "--vary concurrency" in e
    res = compare_sides(a, b, min_windows=2, vary=["concurrency"])
    x = res["strata"][0]["metrics"]["accept_len"]
    assert (x["a"]["n"], x["b"]["n"]) == (4, 2) and x["verdict"] == "A better"
    assert abs(x["a"]["mean"] - (2.3377 + 2.3541 + 2.3676 + 2.3711) / 4) < 1e-9
    assert any("concurrency is not reported by A and B" in w for w in res["warnings"])


def test_printed_accept_rate_formula_does_not_decide(tmp_path):
    # B's engine version prints the accept rate with the bonus in the numerator and the root
    # in the denominator (SGLang before PR 23530): the printed rates differ (0.26 vs 0.15),
    # the acceptance does not. The A/B derives the rate from accept length and k on both.
    a = sglang_log(tmp_path / "a.log", [(1, 2.05, 30, True)], seed=1)
    b = sglang_log(tmp_path / "b.log", [(1, 2.05, 30, True)], seed=2, bonus_rate=True)
    assert "accept rate: 0.26" in Path(b).read_text()
    res = compare_sides(a, b)
    x = res["strata"][0]["metrics"]["accept_rate"]
    assert abs(x["a"]["mean"] - 0.15) < 0.005 and abs(x["b"]["mean"] - 0.15) < 0.005 and x["verdict"] == "same"


@pytest.mark.parametrize("name,needle", [
    ("vllm-request-llama-swap-1032.json", "none of its 1 windows says how many requests were running"),
    ("trtllm-pr5146-llama70b-eagle3.json", "none of its 1 windows says how many requests were running"),
    ("llamacpp-pr24536-slot-eagle3.log", "none of its 1 windows says how many requests were running"),
    ("vllm-7301-v0-cumulative-k5.log", "only cumulative figures since start-up"),
])
def test_real_corpus_without_comparable_windows_exit_2(name, needle, capsys):
    # per-request records and per-slot lines carry no load; a V0 cumulative line has no interval
    assert main(["ab", str(CORPUS / name), str(CORPUS / name)]) == 2
    assert needle in _err(capsys)
