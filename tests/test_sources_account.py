"""Every engine reading accounts for itself (issue 28 item 1): `check` says the source and
version recognised, windows read and skipped (with the first skipped line), the figures
found, each identity checked with its numbers, and what could not be checked and why.
Bad input (Markdown around a paste, CRLF, a line cut mid-write, a scrape without spec
series, a partial scrape) is read for what it holds; exit 2 only for no engine's output."""
from __future__ import annotations

import json
from pathlib import Path

from specaudit.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "engines"
CORPUS = FIX / "corpus" / "rendered"
SGL = ("[2026-03-18 11:22:0{s} TP0] Decode batch, #running-req: 2, #token: 5046, token usage: 0.01, "
       "accept len: {L}, accept rate: {r}, cuda graph: True, gen throughput (token/s): {t}")


def _check(capsys, *args):
    rc = main(["check", *map(str, args)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_text_account_names_source_version_identities_and_what_is_missing(capsys):
    f = CORPUS / "llamacpp-pr24536-slot-eagle3.log"
    rc, out, _ = _check(capsys, f)
    assert rc == 0
    assert "[--source llamacpp-log]" in out and "PR 24536" in out
    assert "read 1 window (lines 1-1); skipped none" in out
    # the identity with its own arithmetic, and its verdict from the rules
    assert "1 + sum(0.805, 0.632, 0.483) = 2.920 vs printed 2.92; holds on all 1 window" in out
    assert "259 <= 3 x 87 = 261" in out
    assert "not checkable: no running-request count" in out
    assert "no depth counter in this output" in out and "--reported-accept-depth" in out
    assert "verdict: nothing contradicts the" in out
    assert "No violations in what could be checked" in out
    rc, out, _ = _check(capsys, f, "--output-format", "github")
    assert rc == 0 and "::notice" in out and "nothing contradicts" in out


def test_json_account_and_broken_identity(capsys):
    f = CORPUS / "llamacpp-broken-slot-rate.log"
    rc, out, _ = _check(capsys, f, "--output-format", "json")
    assert rc == 1
    doc = json.loads(out)
    (acc,) = doc["summary"]["readings"]
    assert acc["source"] == "llamacpp-log" and acc["engine"] == "llamacpp" and acc["windows"] == 1
    rate = [c for c in acc["checked"] if c["identity"].startswith("acceptance rate = accepted")][0]
    assert "128 / 144 = 0.8889 vs printed 0.8194" in rate["example"] and rate["result"].startswith("broken: SA726")
    assert "1 finding contradicts" in acc["verdict"]


def test_markdown_crlf_and_a_cut_line_are_read_for_what_they_hold(tmp_path, capsys):
    f = tmp_path / "paste.md"
    f.write_bytes(("> ```\r\n> " + SGL.format(s=5, L="2.64", r="0.66", t="242.08") + "\r\n- "
                   + SGL.format(s=9, L="2.60", r="0.65", t="240.08") + "\r\n> ```\r\n"
                   + SGL.format(s=9, L="2.60", r="0.65", t="240.08")[:110]).encode())
    rc, out, err = _check(capsys, f)
    assert rc == 0 and not err
    assert "read 2 windows (lines 2-3)" in out
    assert "skipped 1 (first: line 5: truncated SGLang decode line" in out


def test_scrape_without_spec_series_is_judged_exit_0(tmp_path, capsys):
    f = tmp_path / "sglang.prom"
    f.write_text('sglang:num_running_reqs{tp_rank="0"} 3\nsglang:gen_throughput{tp_rank="0"} 120.5\n')
    rc, out, err = _check(capsys, f)
    assert rc == 0 and not err
    assert "SGLang Prometheus scrape" in out and "no speculative figures in it" in out


def test_trtllm_iteration_stats_without_spec_stats_exit_0(capsys):
    rc, out, _ = _check(capsys, CORPUS / "trtllm-6364-trt-backend-no-spec-stats.json")
    assert rc == 0 and "TensorRT-LLM iteration stats" in out and "engine trtllm" in out
    assert "no speculative figures" in out


def test_partial_vllm_scrape_is_judged_on_its_series(capsys):
    rc, out, _ = _check(capsys, FIX / "bad_vllm_missing_series.prom")
    assert rc == 0
    assert "series absent from this scrape: vllm:spec_decode_num_accepted_tokens_total" in out
    assert "drafted per verify step 3 " in out and "no accepted token count" in out


def test_json_that_is_no_engines_output_is_exit_2(tmp_path, capsys):
    f = tmp_path / "other.json"
    f.write_text('{"hello": 1}\n')
    rc, out, err = _check(capsys, f)
    assert rc == 2 and "no usable spec-decoding figures" in err and len(err.strip().splitlines()) == 1


def test_logs_with_no_speculative_lines_are_recognised_exit_0(tmp_path, capsys):
    """A vLLM or llama.cpp log with speculative decoding off is still that engine's: the
    account says there was nothing to judge, exit 0 (issue 28: judged on what it holds)."""
    v = tmp_path / "vllm.log"
    v.write_text("INFO 10-02 14:11:08 [loggers.py:123] Engine 000: Avg prompt throughput: 37.3 tokens/s, Avg "
                 "generation throughput: 1717.6 tokens/s, Running: 8 reqs, Waiting: 0 reqs\n")
    ll = tmp_path / "llama.log"
    ll.write_text("slot print_timing: id  0 | task 0 |        eval time =    2296.72 ms /   256 tokens (    8.97 ms "
                  "per token,   111.46 tokens per second)\n")
    for f, what in ((v, "vLLM log"), (ll, "llama.cpp")):
        rc, out, err = _check(capsys, f)
        assert rc == 0 and not err, (f, err)
        assert what in out and "no speculative figures in it" in out


def test_parallel_audit_gives_the_same_account(tmp_path, monkeypatch):
    """A large log is audited in byte ranges by worker processes: the merged account is
    the sequential one (windows, lines, figures, identities)."""
    import specaudit.audit.sources as sources
    from specaudit.audit.sources import parallel
    src = (CORPUS / "vllm-ascend-13640-dspark-k7.log").read_text()
    f = tmp_path / "big.log"
    f.write_text(src * 40)
    seq_f, seq = sources.audit_file_account(f)
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 1)
    monkeypatch.setenv("SPECAUDIT_WORKERS", "2")
    par_f, par = sources.audit_file_account(f)
    assert [x.code for x in par_f] == [x.code for x in seq_f]
    for key in ("windows", "lines", "figures", "skipped", "versions"):
        assert par[key] == seq[key], key
    assert [c["result"] for c in par["checked"]] == [c["result"] for c in seq["checked"]]


def test_applicable_matches_numbers_on_every_fixture_window():
    """The account counts windows with _applicable() and writes the first one's arithmetic
    with _numbers(): both must agree on which identities apply, on every real and fixture window."""
    from specaudit.audit.sources import read_source
    from specaudit.audit.sources.account import IDENTITIES, _applicable, _numbers
    from specaudit.trace.safe_io import InputError
    n = 0
    for f in sorted([*CORPUS.iterdir(), *FIX.glob("*.log"), *FIX.glob("*.prom")]):
        try:
            r = read_source(f)
        except InputError:
            continue
        for w in r.windows:
            assert set(_applicable(w, r.config)) == {i for i in IDENTITIES if _numbers(i, w, r.config) is not None}, f
            n += 1
    assert n > 100


def test_a_derived_accept_length_is_marked_and_its_identity_not_claimed(capsys):
    """vLLM's /metrics export no mean acceptance length: the reader computes 1 + accepted /
    verify steps, so that identity would hold by construction. The account marks the figure
    derived, lists the identity as not checkable, and names the two counters the per-position
    identity compares."""
    rc, out, _ = _check(capsys, FIX / "vllm_clean.prom")
    assert rc == 0
    assert "mean acceptance length (derived: 1 + accepted / verify steps) 2.776..2.781 (2)" in out
    assert "not checkable: no mean acceptance length exported" in out
    assert "= 2.781 vs 1 + accepted / verify steps = 2.781; holds on all 2 windows" in out
    assert "mean acceptance length = 1 + accepted / verify steps [SA704" not in out and "vs printed" not in out
    # a log that prints the length keeps the identity, checked against the printed figure
    rc, out, _ = _check(capsys, CORPUS / "llamacpp-pr24536-slot-eagle3.log")
    assert rc == 0 and "(derived" not in out and "no mean acceptance length exported" not in out


def test_engine_input_counts_the_rules_that_ran(capsys):
    """The summary's "rules" and JUnit's passing tests name the SA7xx rules that ran on an
    engine's output (it said rules: 0, as if nothing had); --select narrows them; rules
    over other evidence (SA59x: a client's export beside a trace) did not run and are not named."""
    import xml.etree.ElementTree as ET

    from specaudit.invariants import load_rules
    sa7 = [r.code for r in load_rules(entry_points=False) if r.code.startswith("SA7")]
    rc, out, _ = _check(capsys, FIX / "vllm_clean.prom", "--output-format", "json")
    assert rc == 0 and json.loads(out)["summary"]["rules"] == len(sa7)
    rc, out, _ = _check(capsys, FIX / "vllm_clean.prom", "--select", "SA70", "--output-format", "json")
    assert json.loads(out)["summary"]["rules"] == sum(c.startswith("SA70") for c in sa7)
    rc, out, _ = _check(capsys, FIX / "vllm_clean.prom", "--output-format", "junit")
    names = [c.get("name").split()[0] for c in ET.fromstring(out).iter("testcase")]
    assert sorted(names) == sorted(sa7) and not any(n.startswith("SA59") for n in names)


def test_a_vllm_log_of_start_up_lines_only_is_recognised_and_judged(tmp_path, capsys):
    """A real vLLM 0.32.0 server log (here, ngram k = 3) that ends before its first stats line:
    it was 'not a recognised engine log' (exit 2). It is vLLM's by its engine's start-up line:
    exit 0, its version and draft shape from that line, and why it holds no figures."""
    f = FIX / "no_figures" / "vllm_startup_only.log"   # real: this machine's vLLM 0.32.0, no request served
    rc, out, err = _check(capsys, f)
    assert rc == 0 and not err
    assert "vLLM 0.32.0 server log (start-up lines only) [--source vllm-log], engine vllm, " \
           "version 0.32.0 (its start-up line)" in out
    assert "read 0 windows" in out and "draft shape: num_spec_tokens 3" in out
    assert "nothing to judge (speculative decoding configured (ngram, k = 3), but no stats line" in out
    # with one stats line (speculative decoding's figures still absent) it is the plain vLLM log
    lines = f.read_text().splitlines(keepends=True)
    stats = ("(APIServer pid=27089) INFO 12-03 07:37:59 [loggers.py:259] Engine 000: Avg prompt throughput: "
             "0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, "
             "GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%\n")
    g = tmp_path / "with_stats.log"
    g.write_text("".join(lines + [stats]))
    rc, out, _ = _check(capsys, g)
    assert rc == 0 and "start-up lines only" not in out and "no stats line" not in out
    # without the engine's start-up line nothing says it is vLLM's: one line, exit 2
    h = tmp_path / "no_engine_line.log"
    h.write_text("".join(ln for ln in lines if "Initializing a V1 LLM engine" not in ln))
    rc, out, err = _check(capsys, h)
    assert rc == 2 and "not a recognised engine log" in err


def test_a_llama_server_log_of_start_up_lines_only_is_recognised_and_judged(tmp_path, capsys):
    """A real llama-server log (this machine's build, with a drafter) stopped before any
    request: recognised by the line saying it listens, exit 0, and why it holds no figures.
    The 2025 builds' wording of that line is recognised too; a request's timing line makes
    it the plain llama.cpp log; without the listening line nothing says it is llama.cpp's."""
    f = FIX / "no_figures" / "llamacpp_startup_only.log"
    rc, out, err = _check(capsys, f)
    assert rc == 0 and not err
    assert "llama.cpp server log (start-up lines only) [--source llamacpp-log]" in out
    assert "nothing to judge (a draft model loaded (" in out and "tiny-llama-drafter-" in out
    assert "no request finished while it logged" in out
    old = tmp_path / "old.log"
    old.write_text("srv    load_model: loading model '/m/t.gguf'\nmain: model loaded\n"
                   "main: server is listening on http://127.0.0.1:8080 - starting the main loop\n"
                   "srv  update_slots: all slots are idle\n")
    rc, out, _ = _check(capsys, old)
    assert rc == 0 and "start-up lines only" in out and "no draft model loaded" in out
    lines = f.read_text().splitlines(keepends=True)
    timed = tmp_path / "timed.log"
    timed.write_text("".join(lines[:-1]) + "0.01.000.000 I slot print_timing: id  0 | task 0 | prompt eval time = "
                     "10.00 ms /  5 tokens\n" + lines[-1])
    rc, out, _ = _check(capsys, timed)
    assert rc == 0 and "start-up lines only" not in out
    bare = tmp_path / "bare.log"
    bare.write_text("".join(ln for ln in lines if "listening on" not in ln))
    rc, out, err = _check(capsys, bare)
    assert rc == 2 and "not a recognised engine log" in err


def test_an_sglang_log_that_stops_at_start_up_is_recognised_and_judged(tmp_path, capsys):
    """SGLang's start-up line `server_args=ServerArgs(...)` with no 'Decode batch' line after it
    (a server that failed to launch, or a log cut before the first decode_log_interval steps):
    it was 'not a recognised engine log' (exit 2); now exit 0 with why it holds no figures.
    The line's facts are those of sgl-project/sglang#12726 (0.5.4.post3, NGRAM, a launch that
    failed; the excerpt's keys, in its order), the speculative shape added as SGLang prints it."""
    args = ("model_path='/shared/public/elr-models/Qwen/Qwen3-4B/1cfa9a7208912126459214e8b04321603b3df60c/', "
            "tokenizer_mode='auto', host='127.0.0.1', port=30000, mem_fraction_static=0.835, "
            "max_running_requests=48, chunked_prefill_size=8192, max_prefill_tokens=16384, "
            "speculative_algorithm='NGRAM', speculative_num_draft_tokens=8, decode_log_interval=40")
    f = tmp_path / "sglang_launch.log"
    f.write_text(f"[2025-11-06 01:22:00] server_args=ServerArgs({args})\n"
                 "[2025-11-06 01:22:05] Load weight begin. avail mem=70.12 GB\n")
    rc, out, err = _check(capsys, f)
    assert rc == 0 and not err
    assert "SGLang server log (start-up lines only) [--source sglang-log]" in out
    assert "draft shape: num_draft_tokens 8" in out
    assert ("nothing to judge (speculative decoding configured (NGRAM, 8 draft tokens), but no 'Decode batch' "
            "line: SGLang logs one every 40 decode steps") in out
    # a decode line after it: the plain SGLang log (judged on its figures, never 'start-up lines only')
    f.write_text(f.read_text() + SGL.format(s=5, L="2.64", r="0.66", t="242.08") + "\n")
    rc, out, _ = _check(capsys, f)
    assert "start-up lines only" not in out and "read 1 window" in out


def test_start_up_only_logs_read_in_parallel_give_the_sequential_verdict(tmp_path, monkeypatch):
    """A large log audited in byte ranges: a log of start-up lines only gets the sequential
    account (it was NoFigures without a name there: exit 2 where the sequential read said
    exit 0); a spec-off log with stats lines is still 'recognised as the vLLM log'."""
    import specaudit.audit.sources as sources
    from specaudit.audit.sources import parallel
    text = (FIX / "no_figures" / "vllm_startup_only.log").read_text()
    f = tmp_path / "startup.log"
    f.write_text(text + "".join(f"(APIServer pid=1) INFO 12-03 07:38:{i % 60:02d} [x.py:1] idle {i}\n"
                                for i in range(2000)))
    stats = ("(APIServer pid=27089) INFO 12-03 07:37:59 [loggers.py:259] Engine 000: Avg prompt throughput: "
             "0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, "
             "GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%\n")
    g = tmp_path / "stats.log"
    g.write_text(f.read_text() + stats)
    seq = {p: sources.audit_file_account(p)[1] for p in (f, g)}
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 1)
    monkeypatch.setenv("SPECAUDIT_WORKERS", "3")
    assert parallel.parallel_workers(f, "vllm-log") == 3
    for p in (f, g):
        par = sources.audit_file_account(p)[1]
        for key in ("what", "engine", "verdict", "versions", "windows"):
            assert par[key] == seq[p][key], (p.name, key, par[key], seq[p][key])
    assert "start-up lines only" in seq[f]["what"] and "start-up lines only" not in seq[g]["what"]


def test_an_idle_servers_zero_counters_are_not_called_checked(tmp_path, capsys):
    """A real vLLM 0.32.0 /metrics scraped before any request: every spec-decoding counter is
    0, so 'accepted 0 <= drafted 0' holds by arithmetic alone; the verdict says there is
    nothing to judge yet instead of 'nothing contradicts the 2 identities checked'."""
    rc, out, err = _check(capsys, FIX / "no_figures" / "vllm_idle.prom")
    assert rc == 0 and not err
    assert "verdict: every speculative counter is 0 in what was read" in out and "nothing contradicts" not in out
    # one drafted step changes it: the usual verdict
    text = (FIX / "no_figures" / "vllm_idle.prom").read_text()
    f = tmp_path / "one.prom"
    f.write_text(text.replace('vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 0.0',
                              'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 1.0')
                 .replace('vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 0.0',
                          'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 3.0'))
    rc, out, _ = _check(capsys, f)
    assert rc == 0 and "every speculative counter is 0" not in out and "nothing contradicts the" in out


def test_a_vllm_log_without_speculative_decoding_says_so(tmp_path, capsys, monkeypatch):
    """A real vLLM 0.32.0 log with speculative decoding off (one request served): the verdict
    says it is off, from the engine's start-up line (speculative_config=None), where it said
    'speculative decoding off, or not exported'; read in byte ranges, the same."""
    import specaudit.audit.sources as sources
    from specaudit.audit.sources import parallel
    f = FIX / "no_figures" / "vllm_spec_off.log"
    rc, out, err = _check(capsys, f)
    assert rc == 0 and not err
    assert "nothing to judge (speculative decoding off: the engine's start-up line has speculative_config=None)" in out
    seq = sources.audit_file_account(f)[1]
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 1)
    monkeypatch.setenv("SPECAUDIT_WORKERS", "2")
    assert sources.audit_file_account(f)[1]["verdict"] == seq["verdict"]
    # a log whose engine line names a speculative config keeps the other reasons
    rc, out, _ = _check(capsys, FIX / "no_figures" / "vllm_startup_only.log")
    assert "speculative decoding off" not in out


def test_llama_server_with_a_drafter_that_never_drafts_is_named(tmp_path, capsys):
    """Real llama-server output from this machine: -md without --spec-type loads the drafter
    and never drafts. Its log (a request finished, no acceptance line) and its /metrics after
    the request (spec counters 0, 40 tokens predicted) both say it generated without drafting
    and why; the idle scrape before the request stays 'nothing to judge yet'."""
    nf = FIX / "no_figures"
    rc, out, _ = _check(capsys, nf / "llamacpp_md_without_spec_type.log")
    assert rc == 0
    assert "1 request finished, but no draft acceptance line: nothing was drafted" in out
    assert "--spec-type" in out
    rc, out, _ = _check(capsys, nf / "llamacpp_md_without_spec_type.prom")
    assert rc == 0
    assert "every speculative counter is 0 while the server generated 40 tokens since start-up" in out
    assert "--spec-type" in out
    rc, out, _ = _check(capsys, nf / "llamacpp_idle.prom")
    assert rc == 0 and "nothing to judge yet" in out and "generated" not in out.split("verdict:")[1]
    # a log of requests without a drafter loaded says nothing of --spec-type
    lines = (nf / "llamacpp_md_without_spec_type.log").read_text().splitlines(keepends=True)
    plain = tmp_path / "plain.log"
    plain.write_text("".join(ln for ln in lines if "loading draft model" not in ln))
    assert plain.read_text() != "".join(lines)
    rc, out, _ = _check(capsys, plain)
    assert rc == 0 and "--spec-type" not in out and "nothing to judge" in out


def test_ab_names_why_a_side_holds_no_figures(capsys):
    """`specaudit ab` with a side that holds no figures stops in one line (exit 2) that says
    why, where the reader knows it: the vLLM log without speculative decoding says it is off."""
    nf = FIX / "no_figures"
    rc = main(["ab", str(FIX / "vllm_clean.log"), str(nf / "vllm_spec_off.log")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "vllm_spec_off.log: read as vllm-log, but no usable spec-decoding figures in it (speculative " \
           "decoding off: the engine's start-up line has speculative_config=None)" in err
