"""Readers for the formats users paste (issue 31 item 1): each recognised by its own words,
with the version it belongs to, and the definitions that overstate named with their
arithmetic (SA729-SA732). Inputs are written here in each engine's layout; real excerpts
live in the corpus (tests/fixtures/engines/corpus)."""
from __future__ import annotations

import json

import pytest

from specaudit.audit.sources import audit_file, detect, list_sources, read_source

BENCH = """============ Serving Benchmark Result ============
Successful requests:                     80
---------------Speculative Decoding---------------
Acceptance rate (%):                     {rate}
Acceptance length:                       2.83
Drafts:                                  1234
Draft tokens:                            3702
Accepted tokens:                         2259
Per-position acceptance (%):
  Position 0:                            80.00
  Position 1:                            60.70
  Position 2:                            42.36
==================================================
"""


def _codes(fs, sev=None):
    return {f.code for f in fs if sev is None or f.severity == sev}


def test_list_sources_names_every_reader():
    text = list_sources()
    for name in ("sglang-log", "vllm-log", "llamacpp-log", "vllm-bench", "tokenspeed-log", "prom-text",
                 "json-records"):
        assert text.count(name) == 1, name


def test_vllm_bench_serve_section(tmp_path):
    f = tmp_path / "bench.txt"
    f.write_text(BENCH.format(rate="61.02"))
    assert detect(f) == "vllm-bench"
    (w,) = read_source(f).windows
    assert "vllm bench serve" in w.version
    assert (w.drafts, w.draft_tokens, w.accepted_tokens, w.k) == (1234, 3702, 2259, 3)
    assert audit_file(f) == []
    f.write_text(BENCH.format(rate="71.02"))   # the printed rate no longer = 2259 / 3702
    fs = audit_file(f)
    assert "SA726" in _codes(fs, "error") and any("0.6102" in x.message for x in fs)


def test_spec_decode_example_output_bound(tmp_path):
    f = tmp_path / "ex.txt"
    f.write_text("total_num_output_tokens: 9000\nnum_drafts: 3925\nnum_draft_tokens: 11775\n"
                 "num_accepted_tokens: 7110\nmean acceptance length: 2.81\n")
    fs = audit_file(f)
    (sa731,) = [x for x in fs if x.code == "SA731"]
    assert "9000 < verify steps 3925 + accepted 7110 = 11035" in sa731.message and "2035" in sa731.message


def test_vllm_dp_aggregated_line_and_deferred(tmp_path):
    f = tmp_path / "dp.log"
    f.write_text(
        "INFO 09-12 10:00:10 [loggers.py:259] 2 Engines Aggregated: Avg prompt throughput: 120.3 tokens/s, Avg "
        "generation throughput: 812.4 tokens/s, Running: 16 reqs, Waiting: 5 reqs, Deferred: 2 reqs, GPU KV cache "
        "usage: 12.1%\n"
        "INFO 09-12 10:00:10 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 2.64, Accepted: 619 "
        "tokens, Drafted: 1134 tokens, Per-position acceptance rate: 0.802, 0.500, 0.336, Avg Draft acceptance "
        "rate: 54.6%\n")
    (w,) = read_source(f).windows
    assert "data parallel aggregated" in w.version
    assert (w.gen_tps, w.concurrency, w.extra["waiting"], w.extra["deferred"]) == (812.4, 16, 5, 2)
    assert audit_file(f) == []


def test_sglang_finish_line_meta_info_beside_the_log(tmp_path):
    f = tmp_path / "sglang.log"
    meta = {"id": "r1", "completion_tokens": 106, "spec_verify_ct": 43, "spec_num_correct_drafts": 63,
            "spec_num_proposed_drafts": 215, "spec_accept_length": 2.4651162790697674,
            "spec_accept_rate": 0.2930232558139535}
    f.write_text("[2026-08-07 10:00:01] Finish: obj=GenerateReqInput(rid='r1'), out={'meta_info': "
                 + repr(meta) + ", 'text': 'hi'}\n" + json.dumps({"text": "x", "meta_info": meta}) + "\n")
    assert detect(f) == "sglang-log"
    ws = read_source(f).windows
    assert len(ws) == 2 and all("meta_info in the server log" in w.version for w in ws)
    assert audit_file(f) == []
    meta["spec_num_correct_drafts"] = 90   # the rate and the length no longer agree with the counts
    f.write_text("[2026-08-07 10:00:01] Finish: obj=GenerateReqInput(rid='r1'), out={'meta_info': "
                 + repr(meta) + "}\n")
    assert _codes(audit_file(f), "error")


def test_tokenspeed_meta_info_counts(tmp_path):
    f = tmp_path / "ts.json"
    good = {"meta_info": {"completion_tokens": 120, "spec_verify_ct": 40, "spec_accepted_tokens": 79,
                          "spec_draft_tokens": 280}}
    f.write_text(json.dumps(good) + "\n")
    (w,) = read_source(f).windows
    assert w.engine == "tokenspeed" and w.k == 7 and "PR 1443" in w.version
    assert audit_file(f) == []
    bad = {"meta_info": {**good["meta_info"], "spec_accepted_tokens": 95}}   # more than 120 - 40 can hold
    f.write_text(json.dumps(bad) + "\n")
    assert "SA731" in _codes(audit_file(f))


def test_fastdeploy_accept_ratio_is_sized(tmp_path):
    f = tmp_path / "fd.json"
    sm = {"accepted_tokens": 128, "rejected_tokens": 112, "accept_ratio": 0.53125,
          "average_accept_length": 2.1333333333333333, "accepted_tokens_per_head": [60, 36, 23, 9]}
    f.write_text(json.dumps({"choices": [{"speculate_metrics": sm}]}) + "\n")
    fs = audit_file(f)
    assert _codes(fs) == {"SA729"}
    assert "68 / emitted tokens 128" in fs[0].message and "0.3778" in fs[0].message


def test_mlx_vlm_timings(tmp_path):
    f = tmp_path / "mlx.json"
    t = {"predicted_n": 111, "draft_kind": "mtp", "draft_rounds": 30, "draft_n": 90, "draft_n_accepted": 81}
    f.write_text(json.dumps({"timings": t}) + "\n")
    (w,) = read_source(f).windows
    assert w.engine == "mlx-vlm" and w.drafts == 30
    assert audit_file(f) == []
    f.write_text(json.dumps({"timings": {**t, "predicted_n": 100}}) + "\n")
    assert "SA731" in _codes(audit_file(f))


def test_tokenspeed_log_infers_k(tmp_path):
    line = ("[2026-06-10 10:00:0{s}] Decode batch. #running-req: 8, #pages(active/cached/total): 412/96/8192, "
            "page ratio: 0.05, gen throughput (token/s): 812.45, avg_accept_len: {L}, accept_rate: {r}, "
            "#queue-req: 0\n")
    f = tmp_path / "ts.log"
    f.write_text(line.format(s=1, L="3.40", r="0.80") + line.format(s=2, L="3.10", r="0.70"))
    assert detect(f) == "tokenspeed-log"
    r = read_source(f)
    assert r.config["num_spec_tokens"] == 3 and all(w.k == 3 for w in r.windows)


def test_older_llamacpp_layout_slot_header_on_its_own_line(tmp_path):
    f = tmp_path / "llama.log"
    f.write_text("slot print_timing: id  2 | task 7 | \n"
                 "       eval time =    2296.72 ms /   256 tokens (    8.97 ms per token,   111.46 tokens per second)\n"
                 "draft acceptance rate = 0.57576 (   19 accepted /    33 generated)\n")
    (w,) = read_source(f).windows
    assert (w.extra["slot"], w.extra["task"]) == (2, 7) and "own line" in w.version


def test_vllm_scrape_with_created_beside_total(tmp_path):
    """A `_created` gauge beside each `_total` counter is a creation time: never summed."""
    f = tmp_path / "m.prom"
    lines = []
    for name, v in (("num_drafts", 100.0), ("num_draft_tokens", 300.0), ("num_accepted_tokens", 180.0)):
        lines += [f"# TYPE vllm:spec_decode_{name} counter",
                  f'vllm:spec_decode_{name}_total{{engine="0",model_name="m"}} {v}',
                  f'vllm:spec_decode_{name}_created{{engine="0",model_name="m"}} 1.7593e9']
    f.write_text("\n".join(lines) + "\n")
    (w,) = read_source(f).windows
    assert (w.drafts, w.draft_tokens, w.accepted_tokens) == (100, 300, 180)
    assert audit_file(f) == []


@pytest.mark.parametrize("wrap", [lambda s: "> " + s, lambda s: "- " + s, lambda s: s + "\r"])
def test_markdown_and_crlf_wrapped_lines(tmp_path, wrap):
    f = tmp_path / "paste.md"
    f.write_text("```\n" + "\n".join(wrap(x) for x in BENCH.format(rate="61.02").splitlines()) + "\n```\n")
    (w,) = read_source(f).windows
    assert w.accepted_tokens == 2259 and w.per_pos and len(w.per_pos) == 3
