"""specaudit.audit.sources.prom_http against a fake Prometheus HTTP API (no Prometheus needed).

The fake serves /api/v1/series and /api/v1/query the way Prometheus answers them (a
matrix of raw samples for `name{...}[range]`), so each test states the samples an engine
left in Prometheus and checks the windows, notes and findings read from them; and it can
be down, slow, erring, unauthorised or not Prometheus at all.
"""
from __future__ import annotations

import json
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from ci import need

from specaudit.audit.sources.prom_http import audit_prometheus, parse_duration, read_prometheus
from specaudit.trace.safe_io import InputError

T0 = 1_764_500_000.0
VLLM = {"job": "vllm", "instance": "gpu0:8000", "model_name": "Qwen/Qwen3-32B", "engine": "0"}


class FakeProm:
    """series: list of (labels with __name__, [(t, v), ...]). mode: None | 'slow' | 'error' |
    'html' | 'unauthorised'."""

    def __init__(self, series=(), mode=None, delay=3.0):
        self.series, self.mode, self.delay = list(series), mode, delay
        self.requests = []
        self.answered = 0                  # answers finished (sent, or the client had gone)
        self.closing = threading.Event()   # wakes a slow answer when the test is over
        fake = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                u = urlparse(self.path)
                q = {k: v for k, v in parse_qs(u.query).items()}
                fake.requests.append((u.path, q, self.headers))
                if fake.mode == "slow":
                    fake.closing.wait(fake.delay)
                if fake.mode == "html":
                    return self._send(200, b"<html>Grafana</html>", "text/html")
                if fake.mode == "unauthorised":
                    return self._send(401, b"Unauthorized\n", "text/plain")
                if fake.mode == "error":
                    return self._json(422, {"status": "error", "errorType": "execution",
                                            "error": "query processing would load too many samples"})
                if u.path == "/api/v1/series":
                    sel = q["match[]"][0]
                    if "job=~" in sel and "nope" in sel:
                        return self._json(400, {"status": "error", "errorType": "bad_data",
                                                "error": "1:30: parse error: unexpected character"})
                    data = [lab for lab, _ in fake.series if fake._matches(lab, sel)]
                    return self._json(200, {"status": "success", "data": data})
                if u.path == "/api/v1/query":
                    expr = q["query"][0]
                    name = expr.split("{", 1)[0]
                    res = [{"metric": lab, "values": [[t, str(v)] for t, v in vals]}
                           for lab, vals in fake.series if lab["__name__"] == name and fake._matches(lab, expr)]
                    return self._json(200, {"status": "success", "data": {"resultType": "matrix", "result": res}})
                self._send(404, b"404 page not found\n", "text/plain")

            def _json(self, code, doc):
                self._send(code, json.dumps(doc).encode(), "application/json")

            def _send(self, code, body, ctype):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                try:
                    self.end_headers()
                    self.wfile.write(body)
                except ConnectionError:
                    pass   # the client gave up first (a slow answer past its --timeout): expected
                fake.answered += 1

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        # answers still in flight are joined by close(), so none writes (or fails) during the next test
        self.server.daemon_threads = False
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def _matches(lab, sel):
        for k, v in re.findall(r'(\w+)="([^"]*)"', sel):
            if lab.get(k) != v:
                return False
        return True

    def close(self):
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()     # joins the answers in flight


@pytest.fixture
def fake():
    made = []

    def make(*a, **kw):
        f = FakeProm(*a, **kw)
        made.append(f)
        return f
    yield make
    for f in made:
        f.close()


def vllm_series(n=5, dt=15.0, steps=200, pos=(120, 60, 25), accepted=None, labels=VLLM, reset_at=None,
                times=None):
    """A vLLM engine's counters sampled n times: each interval adds `steps` verify steps."""
    times = times or [T0 + i * dt for i in range(n)]
    out = {}

    def cum(per):
        v, vals = 0.0, []
        for i, t in enumerate(times):
            if reset_at is not None and i == reset_at:
                v = 0.0
            elif i:
                v += per
            vals.append((t, v))
        return vals
    acc = sum(pos) if accepted is None else accepted
    for name, per in (("vllm:spec_decode_num_drafts_total", steps),
                      ("vllm:spec_decode_num_draft_tokens_total", steps * len(pos)),
                      ("vllm:spec_decode_num_accepted_tokens_total", acc),
                      ("vllm:generation_tokens_total", steps + acc)):
        out[(name, None)] = ({"__name__": name, **labels}, cum(per))
    for p, c in enumerate(pos):
        name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        out[(name, p)] = ({"__name__": name, **labels, "position": str(p)}, cum(c))
    return list(out.values())


def read(url, **kw):
    kw.setdefault("range_s", 3600.0)
    kw.setdefault("step_s", 0.0)
    kw.setdefault("end", T0 + 3000)
    kw.setdefault("timeout", 10.0)
    return read_prometheus(url, **kw)


def test_windows_are_counter_deltas_between_raw_samples(fake):
    f = fake(vllm_series(n=5))
    (r,) = read(f.url)
    assert r.engine == "vllm" and r.source == "prometheus"
    assert r.path == f"{f.url} vllm vllm/gpu0:8000 Qwen/Qwen3-32B"
    assert len(r.windows) == 4 and [w.line for w in r.windows] == [1, 2, 3, 4]
    w = r.windows[0]
    assert (w.drafts, w.draft_tokens, w.accepted_tokens) == (200, 600, 205)
    assert w.per_pos_counts == [120, 60, 25] and w.per_pos == pytest.approx([0.6, 0.3, 0.125])
    assert w.accept_len == pytest.approx(1 + 205 / 200) and w.k == 3 and w.per_pos_kind == "verify_steps"
    assert w.gen_tps == pytest.approx(405 / 15) and w.rank == "engine 0"
    assert w.time == "2025-11-30 10:53:35" and not w.extra.get("counter_reset")
    assert r.config["num_spec_tokens"] == 3
    findings, _ = audit_prometheus(f.url, range_s=3600, step_s=0, end=T0 + 3000)
    assert [x.code for x in findings if x.severity == "error"] == []
    # the raw samples, not rate(): one instant query of name{...}[range] per series
    queries = [q["query"][0] for p, q, _ in f.requests if p == "/api/v1/query"]
    assert all(re.fullmatch(r"[\w:]+\{\}\[3600s\]", x) for x in queries), queries


def test_step_merges_samples_into_longer_windows(fake):
    f = fake(vllm_series(n=9))     # samples every 15 s
    (r,) = read(f.url, step_s=30)
    assert len(r.windows) == 4 and all(w.drafts == 400 for w in r.windows)
    assert all(w.extra["seconds"] == 30 for w in r.windows)


def test_accepted_above_drafted_is_found(fake):
    f = fake(vllm_series(n=6, accepted=800))
    findings, readings = audit_prometheus(f.url, range_s=3600, step_s=0, end=T0 + 3000)
    codes = {x.code for x in findings if x.severity == "error"}
    assert "SA702" in codes
    hit = next(x for x in findings if x.code == "SA702")
    assert hit.file == readings[0].path and hit.line is not None


def test_counter_reset_inside_the_range_is_reported_not_differenced(fake):
    f = fake(vllm_series(n=8, reset_at=4))
    (r,) = read(f.url)
    resets = [w for w in r.windows if w.extra.get("counter_reset")]
    assert len(resets) == 1 and resets[0].line == 4
    findings, _ = audit_prometheus(f.url, range_s=3600, step_s=0, end=T0 + 3000)
    assert not [x for x in findings if x.severity == "error"], [x.message for x in findings]
    assert any("went down" in x.message or "reset" in x.message for x in findings)


def test_a_gap_in_the_samples_is_a_note_and_the_window_spans_it(fake):
    times = [T0, T0 + 15, T0 + 30, T0 + 630, T0 + 645]
    f = fake(vllm_series(times=times))
    (r,) = read(f.url)
    assert len(r.windows) == 4 and r.windows[2].extra["seconds"] == 600
    assert any("gap of 600s" in n["reason"] for n in r.notes)
    findings, _ = audit_prometheus(f.url, range_s=3600, step_s=0, end=T0 + 3000)
    assert any(x.code == "SA700" and "gap of 600s" in x.message for x in findings)
    assert not [x for x in findings if x.severity == "error"]


def test_colliding_labels_are_summed_with_a_note(fake):
    a = vllm_series(n=4, labels={**VLLM, "replica": "a"})
    b = vllm_series(n=4, labels={**VLLM, "replica": "b"})
    f = fake(a + b)
    (r,) = read(f.url)
    assert r.windows[0].drafts == 400 and r.windows[0].per_pos_counts == [240, 120, 50]
    assert any("differ only by replica" in n["reason"] for n in r.notes)


def test_ranks_and_instances_are_kept_apart(fake):
    s = vllm_series(n=4) + vllm_series(n=4, labels={**VLLM, "engine": "1"}, steps=100) + \
        vllm_series(n=4, labels={**VLLM, "instance": "gpu1:8000"})
    f = fake(s)
    rs = read(f.url)
    assert [x.path.split()[-2] for x in rs] == ["vllm/gpu0:8000", "vllm/gpu1:8000"]
    assert rs[0].ranks() == ["engine 0", "engine 1"]
    assert {w.rank: w.drafts for w in rs[0].windows} == {"engine 0": 200, "engine 1": 100}


def test_sglang_gauges_are_read_as_printed_never_differenced(fake):
    lab = {"job": "sglang", "instance": "h:30000", "model_name": "m", "tp_rank": "0", "pp_rank": "0"}
    ts = [T0 + i * 10 for i in range(6)]
    al = [3.2, 3.2, 3.1, 3.1, 3.3, 3.0]   # the gauge holds its value until the next log window
    tps = [800, 800, 790, 790, 820, 780]
    series = [({"__name__": "sglang:spec_accept_length", **lab}, list(zip(ts, al))),
              ({"__name__": "sglang:gen_throughput", **lab}, list(zip(ts, tps))),
              ({"__name__": "sglang:spec_accept_length", **lab, "tp_rank": "1"}, list(zip(ts, [9.0] * 6)))]
    f = fake(series)
    (r,) = read(f.url)
    assert [w.accept_len for w in r.windows] == [3.2, 3.1, 3.3, 3.0]
    assert all(w.kind == "gauge" and w.drafts is None for w in r.windows)


def test_match_selects_and_is_passed_to_prometheus(fake):
    f = fake(vllm_series(n=4) + vllm_series(n=4, labels={**VLLM, "job": "other"}))
    rs = read(f.url, match=['{job="other"}'])
    assert len(rs) == 1 and " vllm other/" in rs[0].path
    assert all('job="other"' in q.get("match[]", q.get("query", [""]))[0] for p, q, _ in f.requests)


def test_overlapping_matches_read_each_series_once(fake):
    f = fake(vllm_series(n=4))
    (r,) = read(f.url, match=['{job="vllm"}', '{instance="gpu0:8000"}'])
    assert r.windows[0].drafts == 200 and not r.notes


def test_header_is_sent(fake):
    f = fake(vllm_series(n=3))
    read(f.url, headers=["Authorization: Bearer s3cret", "X-Scope-OrgID: team-a"])
    assert all(h.get("Authorization") == "Bearer s3cret" and h.get("X-Scope-OrgID") == "team-a"
               for _, _, h in f.requests)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode,kw,want", [
    ("down", {}, "connection refused"),
    ("slow", {"timeout": 1.0}, "did not answer within --timeout 1s"),
    ("error", {}, "HTTP 422, execution: query processing would load too many samples"),
    ("html", {}, "not a Prometheus HTTP API answer"),
    ("unauthorised", {}, "--header 'Authorization: Bearer TOKEN'"),
    ("empty", {}, "no speculative-decoding series"),
    ("badmatch", {"match": ['{job=~"nope"}']}, "bad_data: 1:30: parse error"),
    ("badheader", {"headers": ["no colon"]}, "is not 'Name: value'"),
    ("notmatchers", {"match": ['vllm:x{job="a"}']}, "give label matchers only"),
])
def test_bad_prometheus_is_one_clear_error(fake, mode, kw, want):
    if mode == "down":
        url = f"http://127.0.0.1:{closed_port()}"
    else:
        f = fake([] if mode == "empty" else vllm_series(n=3), mode=mode if mode in (
            "slow", "error", "html", "unauthorised") else None)
        url = f.url
    t = time.monotonic()
    with pytest.raises(InputError) as e:
        read(url, **kw)
    assert want in e.value.reason and "\n" not in e.value.reason
    assert time.monotonic() - t < 2.5, "must not hang past the timeout"


def test_a_slow_answer_ends_with_its_fake_not_during_the_next_test(capfd):
    """The slow fake's answer outlives the client's timeout; close() wakes and joins it, so
    its write to the closed connection neither runs nor prints a traceback later, inside
    whichever test the worker runs next (it once failed test_report_over_engine_outputs)."""
    f = FakeProm(vllm_series(n=3), mode="slow", delay=30.0)
    with pytest.raises(InputError, match="did not answer within"):
        read(f.url, timeout=0.3)
    t = time.monotonic()
    f.close()
    assert time.monotonic() - t < 5.0, "close() waited out the slow answer instead of waking it"
    assert f.answered == len(f.requests) == 1, "an answer still in flight after close()"
    assert "Traceback" not in capfd.readouterr().err


def test_cli_exit_codes_and_formats(fake, tmp_path):
    bad = fake(vllm_series(n=6, accepted=800))
    clean = fake(vllm_series(n=6))

    def cli(*a):
        return subprocess.run([sys.executable, "-m", "specaudit", "check", *a], capture_output=True, text=True,
                              timeout=120)
    # the fakes' samples are in 2025; a range reaching back far enough covers them
    r = cli("--prometheus", bad.url, "--range", "1000d", "--step", "0", "--output-format", "json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert "SA702" in json.dumps(doc)
    # the broken series' account names the identity the finding breaks
    (acc,) = doc["summary"]["readings"]
    assert any(c["result"].startswith("broken: SA702") for c in acc["checked"]), acc["checked"]
    r = cli("--prometheus", clean.url, "--range", "1000d", "--step", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    # never a bare "No violations": what was read, each identity with its numbers, what could not be checked
    for want in ("No violations in what could be checked (each reading's account says what that was)",
                 "Prometheus range query (vllm series)", "  read 5 windows", "  checked: accepted <= drafted",
                 "  not checkable: ", "  verdict: nothing contradicts the 5 identities checked",
                 # a range has no lines: its windows are named by number and their end times shown
                 "  read 5 windows (ending 2025-", "window 1: accepted 205 <= drafted 600",
                 # vLLM exports no accept length: derived, it is marked so and its identity is not
                 # claimed as checked; the per-position counters are checked against it instead
                 "mean acceptance length (derived: 1 + accepted / verify steps) 2.025 (5)",
                 "  not checkable: no mean acceptance length exported",
                 "= 2.025 vs 1 + accepted / verify steps = 2.025; holds on all 5 windows",
                 "checked 1 Prometheus series group, 5 windows."):
        assert want in r.stdout, (want, r.stdout[:3000])
    for never in ("vs printed", "line 1:", "(lines ", "checked 1 file",
                  "mean acceptance length = 1 + accepted / verify steps [SA704"):
        assert never not in r.stdout, (never, r.stdout[:3000])
    r = cli("--prometheus", f"http://127.0.0.1:{closed_port()}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    r = cli("--prometheus", clean.url, "--range", "soon")
    assert r.returncode == 2 and "--range 'soon' is not a duration" in r.stderr
    r = cli()
    assert r.returncode == 2 and "--prometheus URL" in r.stderr


def test_durations():
    assert parse_duration("6h", "--range") == 21600 and parse_duration("1h30m", "x") == 5400
    assert parse_duration("30s", "x") == 30 and parse_duration("90", "x") == 90 and parse_duration("0", "x") == 0
    for bad in ("6x", "h", "-5", ""):
        with pytest.raises(ValueError):
            parse_duration(bad, "--range")


@need(shutil.which("openssl") is not None, "openssl is not installed")
def test_tls_verification_and_its_options(fake, tmp_path):
    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(crt), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    f = fake(vllm_series(n=3))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(crt), str(key))
    f.server.socket = ctx.wrap_socket(f.server.socket, server_side=True)
    url = f.url.replace("http://", "https://")
    with pytest.raises(InputError) as e:
        read(url, timeout=5)
    assert "TLS certificate not trusted" in e.value.reason and "--ca-file" in e.value.reason
    assert len(read(url, ca_file=str(crt))) == 1
    assert len(read(url, insecure=True)) == 1
    with pytest.raises(InputError) as e:
        read(url, ca_file=str(tmp_path / "missing.pem"))
    assert "cannot load --ca-file" in e.value.reason


def test_a_range_that_generated_without_drafting_is_named(fake):
    """Over a Prometheus range the spec counters did not move while generation did: the
    account says the server generated without drafting (not 'an idle server'); a range where
    nothing moved at all is an idle server: nothing to judge yet, never an error."""
    from specaudit.audit.check_inputs import run_check
    series = vllm_series(n=5, steps=0, pos=(0, 0, 0))
    for lab, vals in series:
        if lab["__name__"] == "vllm:generation_tokens_total":
            vals[:] = [(t, 300.0 * i) for i, (t, _v) in enumerate(vals)]   # 300 tokens per 15 s window
    live = dict(range="1000d", step="0", timeout="10s")
    res, text = run_check(prometheus=fake(series).url, live=live)
    assert res.errors == 0
    assert "every speculative counter is 0 while the server generated tokens (up to 20/s)" in text, text[-1500:]
    # nothing moved at all (an idle server): one window over the range, judged 'nothing to judge
    # yet' (it was 'none has two samples in the range', an SA000 error: a false alarm)
    idle = vllm_series(n=5, steps=0, pos=(0, 0, 0))
    res, text = run_check(prometheus=fake(idle).url, live=live)
    assert res.errors == 0 and not res.bad_files, text[-1500:]
    assert "read 1 window (ending 2025-11-30 10:54:20)" in text
    assert "nothing to judge yet" in text and "generated tokens" not in text, text[-1500:]
