"""Fuzz harness (hypothesis) over every reader: run.json, trace Parquet (bytes and
values), each engine-log / Prometheus / JSON-records reader, and the output formats.

The promise under test: hostile input gives findings or one InputError/ValueError line
(exit 2), never another exception (a traceback), never a hang (a deadline per example),
and memory stays bounded (peak RSS checked at the end of the module).

In the suite: a short, fixed-seed run (derandomized, FUZZ_EXAMPLES examples per target).
A longer run, with fresh random seeds:

    SPECAUDIT_FUZZ_EXAMPLES=2000 SPECAUDIT_FUZZ_RANDOM=1 python3 -m pytest -q -p no:cacheprovider tests/test_fuzz.py

A failing example is printed by hypothesis with the bytes that broke the reader.
"""
from __future__ import annotations

import io
import json
import os
import random
import resource
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specaudit.audit.check import check_paths, check_tables
from specaudit.audit.findings import Finding
from specaudit.audit.formats import FORMATS, format_findings
from specaudit.trace.safe_io import InputError
from specaudit.trace.schema import STEPS_SCHEMA, read_manifest
from specaudit.trace.synth import synth_run_rows, write_run

FUZZ_EXAMPLES = int(os.environ.get("SPECAUDIT_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=20_000,
                derandomize=not os.environ.get("SPECAUDIT_FUZZ_RANDOM"), database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
EXPECTED = (InputError, ValueError)     # what the CLI turns into one line, exit 2
FIX = Path(__file__).parent / "fixtures" / "engines"
RSS_START_MB = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _mutate(data: bytes, ops) -> bytes:
    """Apply hypothesis-drawn edits: flip, insert, delete, truncate, duplicate a slice."""
    b = bytearray(data)
    for kind, pos, val in ops:
        if not b:
            b = bytearray(b"\0")
        i = pos % len(b)
        if kind == 0:
            b[i] = val
        elif kind == 1:
            b[i:i] = bytes([val]) * (1 + val % 7)
        elif kind == 2:
            del b[i: i + 1 + val % 16]
        elif kind == 3:
            del b[i:]
        else:
            b[i:i] = b[max(0, i - 64): i]
    return bytes(b)


OPS = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1 << 30), st.integers(0, 255)), max_size=12)


# ------------------------------------------------------------------- run.json

_, _, MANIFEST = synth_run_rows(2, run_id="fz", seed=0)
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=False),
                      st.text(max_size=12))
JSON_ANY = st.recursive(JSON_LEAF, lambda c: st.one_of(st.lists(c, max_size=4),
                                                        st.dictionaries(st.text(max_size=8), c, max_size=4)),
                        max_leaves=20)


@FUZZ
@given(ops=OPS, key=st.sampled_from(sorted(MANIFEST) + ["config", "reported", "conventions"]),
       sub=st.one_of(st.none(), st.sampled_from(["eos_id", "budget", "max_new_tokens", "verify_steps", "mean"])),
       value=JSON_ANY)
def test_fuzz_run_json(tmp_path_factory, ops, key, sub, value):
    m = json.loads(json.dumps(MANIFEST))
    if sub and isinstance(m.get(key), dict):
        m[key][sub] = value
    else:
        m[key] = value
    p = tmp_path_factory.mktemp("m") / "run.json"
    p.write_bytes(_mutate(json.dumps(m).encode(), ops))
    try:
        got = read_manifest(p)
    except InputError:
        return
    # what was accepted is safe for every reader's use of it
    from specaudit.audit.check.core import run_config
    run_config(got)


# -------------------------------------------------------------- trace Parquet


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("good")
    s, r, m = synth_run_rows(3, run_id="fz", seed=2, algo="tree", topk=2, budget=7)
    return write_run(d, s, r, m), s, r, m


@FUZZ
@given(ops=OPS, which=st.sampled_from(["steps-000000.parquet", "requests.parquet", "run.json"]))
def test_fuzz_trace_bytes(good_run, tmp_path_factory, ops, which):
    run_dir = good_run[0]
    d = tmp_path_factory.mktemp("t") / run_dir.name
    d.mkdir()
    for f in run_dir.iterdir():
        data = f.read_bytes()
        (d / f.name).write_bytes(_mutate(data, ops) if f.name == which else data)
    res = check_paths([d])                              # never raises
    assert res.exit_code in (0, 1, 2)


ROW_INT = st.one_of(st.integers(-3, 12), st.integers(-(2**31), 2**31 - 1))
ROW_LIST = st.one_of(st.none(), st.lists(ROW_INT, max_size=20))


@FUZZ
@given(data=st.data())
def test_fuzz_trace_values(good_run, data):
    """Rows of the right types but any values (nulls, negatives, int32 extremes,
    ragged lists) through the whole catalog."""
    _, s, r, m = good_run
    rows = s.to_pylist()[:12]
    if data.draw(st.booleans()):          # one edit on every row (a whole batch of empty lists)
        col = data.draw(st.sampled_from(["node_tokens", "parents", "accepted_path", "committed_tokens"]))
        val = data.draw(ROW_LIST)
        for row in rows:
            row[col] = val
    for row in rows:
        for c in data.draw(st.lists(st.sampled_from(["node_tokens", "parents", "positions", "target_argmax",
                                                     "accepted_path", "committed_tokens"]), max_size=3)):
            row[c] = data.draw(ROW_LIST)
        for c in data.draw(st.lists(st.sampled_from(["step", "seq_len", "accepted_depth", "commit_len",
                                                     "budget", "topk"]), max_size=3)):
            row[c] = data.draw(st.one_of(st.none(), ROW_INT))
        if data.draw(st.booleans()):
            row["request_id"] = data.draw(st.one_of(st.none(), st.text(max_size=6)))
        if data.draw(st.booleans()):
            row["target_margin"] = data.draw(st.one_of(
                st.none(), st.lists(st.floats(width=32, allow_nan=True), max_size=10)))
    res = check_tables(pa.Table.from_pylist(rows, schema=STEPS_SCHEMA), r, m)
    assert res.exit_code in (0, 1)


# ---------------------------------------------------------------- engine sources


def _corpus() -> list[str]:
    lines = []
    for p in sorted(FIX.glob("*")):
        if p.is_file() and p.suffix in (".log", ".prom", ".json", ".jsonl", ".txt"):
            lines += p.read_text(errors="replace").splitlines()[:60]
    return lines or ["Decode batch, #running-req: 1, accept len: 2.0, gen throughput (token/s): 1.0"]


CORPUS = _corpus()


def _source_names() -> list:
    """Every source the readers know, whatever their number (read from the public API)."""
    import specaudit.audit.sources as S
    names = list(getattr(S, "SOURCES", {}) or {})
    return names or [ln.split()[0] for ln in S.list_sources().splitlines() if ln and not ln[0].isspace()]


@FUZZ
@given(picks=st.lists(st.integers(0, 1 << 30), min_size=1, max_size=30), ops=OPS,
       source=st.sampled_from([None] + _source_names()))
def test_fuzz_engine_sources(tmp_path_factory, picks, ops, source):
    from specaudit.audit.sources import audit_file
    text = "\n".join(CORPUS[i % len(CORPUS)] for i in picks)
    p = tmp_path_factory.mktemp("s") / "engine.log"
    p.write_bytes(_mutate(text.encode(), ops))
    try:
        findings = audit_file(p, source)
    except EXPECTED:
        return
    for f in findings:
        assert isinstance(f, Finding)


# ------------------------------------------------------------------ output formats


@FUZZ
@given(msgs=st.lists(st.text(max_size=40), min_size=1, max_size=5),
       file=st.one_of(st.none(), st.text(max_size=20)), fmt=st.sampled_from(list(FORMATS)))
def test_fuzz_output_formats(msgs, file, fmt):
    fs = [Finding(code="SA301", name="commit-len-vs-depth", severity="error", message=m, run_id=m[:5],
                  request_id=None, step=None, file=file, line=3 if file else None, values={"m": m})
          for m in msgs]
    out = format_findings(fs, fmt, summary={"runs": 1, "note": msgs[0]}, checked=["SA301"])
    out.encode("utf-8")                                   # no lone surrogate
    if fmt in ("text", "github", "junit"):
        assert not any(ord(c) < 32 and c not in "\n" or 0x7f <= ord(c) <= 0x9f for c in out)
    if fmt == "junit":
        ET.fromstring(out.encode())
    if fmt in ("json", "sarif"):
        json.loads(out)


# ------------------------------------------------------------------ issue 30: one generator per kind
# special files at every input flag, every writer onto a FIFO / device / socket, hostile HTTP
# peers, absurd numbers for every numeric flag of every command. A blocking open or read is
# cut by SIGALRM (the handler raises, so the system call is not retried): a hang fails the
# example in ALARM_S instead of stopping the suite. Fewer examples than the readers' fuzz:
# each one runs a command.

ALARM_S = 15
FEW = settings(FUZZ, max_examples=min(FUZZ_EXAMPLES, 16), deadline=None)


class Hung(Exception):
    pass


def _bounded(fn):
    """fn() under an alarm: Hung when it runs ALARM_S seconds (a blocked read included)."""
    import signal

    def on_alarm(signum, frame):
        raise Hung(f"no answer in {ALARM_S}s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(ALARM_S)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _special(path: Path, kind: str) -> Path:
    """A special file of `kind` at path: fifo, devzero (a link to /dev/zero), devnull, socket,
    folder, or a link to a FIFO."""
    import socket
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        path.symlink_to("/dev/zero")
    elif kind == "devnull":
        path.symlink_to("/dev/null")
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    elif kind == "folder":
        path.mkdir()
    else:   # link-to-fifo
        os.mkfifo(str(path) + ".real")
        path.symlink_to(str(path) + ".real")
    return path


SPECIAL = st.sampled_from(["fifo", "devzero", "devnull", "socket", "folder", "link-to-fifo"])


def _input_argv(flag: str, p: Path, ds: Path, log: Path) -> list:
    """A command line reading `p` at `flag` (every flag that names a file read)."""
    return {
        "check PATH": ["check", p],
        "estimate INPUT": ["estimate", p, "--baseline-tps", "98", "--cost-factor", "1.5"],
        "estimate --profile": ["estimate", "--observed-tps", "109", "--baseline-tps", "98", "--profile", p,
                               "--n-nodes", "8"],
        "estimate --load": ["estimate", "--load", p, "--baseline-tps", "98", "--cost-factor", "1.5"],
        "estimate --baseline": ["estimate", "--observed-tps", "109", "--baseline", p, "--cost-factor", "1.5"],
        "ab A": ["ab", p, log],
        "query -f": ["query", "--no-check", ds, "-f", p],
        "run --prompts": ["run", "--out", p.parent / "runs", "--prompts", p, "--num-prompts", "1"],
        "check --ca-file": ["check", "--prometheus", "https://127.0.0.1:9", "--ca-file", p, "--timeout", "2s"],
        "check --invariants": ["check", ds, "--invariants", p.parent],
        "diff run.json": ["diff", ds, p.parent],
    }[flag]


INPUT_FLAGS = ["check PATH", "estimate INPUT", "estimate --profile", "estimate --load", "estimate --baseline",
               "ab A", "query -f", "run --prompts", "check --ca-file", "check --invariants", "diff run.json"]


@FEW
@given(flag=st.sampled_from(INPUT_FLAGS), kind=SPECIAL)
def test_fuzz_special_file_at_every_input(good_run, tmp_path_factory, flag, kind, capsys):
    from specaudit.cli import main
    d = tmp_path_factory.mktemp("sp")
    name = {"check --invariants": "rule.py", "diff run.json": "run.json"}.get(flag, "input.log")
    if flag == "diff run.json":   # a run folder whose run.json is the special file
        for f in good_run[0].iterdir():
            if f.name != "run.json":
                (d / f.name).write_bytes(f.read_bytes())
    p = _special(d / name, kind)
    log = next((FIX).glob("*.log"))
    argv = [str(a) for a in _input_argv(flag, p, good_run[0].parent, log)]
    try:
        rc = _bounded(lambda: main(argv))
    except Hung:
        pytest.fail(f"specaudit {' '.join(argv)} hung on a {kind}")
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    if flag == "diff run.json":
        assert rc in (1, 2)     # a run without a readable manifest: a finding or one line
    else:
        assert rc == 2, (flag, kind, rc, err)


WRITERS = {
    "check -o": ["check", "{ds}", "-o", "{t}"],
    "ab -o": ["ab", "{log}", "{log2}", "-o", "{t}"],
    "query -o": ["query", "--no-check", "{ds}", "SELECT 1 AS x", "-o", "{t}", "--output-format", "csv"],
    "calibrate --out": ["calibrate", "--cost-factor", "1.5", "--out", "{t}"],
}


@FEW
@given(writer=st.sampled_from(sorted(WRITERS)), kind=st.sampled_from(["fifo", "devnull", "socket",
                                                                       "link-to-fifo"]))
def test_fuzz_every_writer_refuses_a_special_target(good_run, tmp_path_factory, writer, kind, capsys):
    import stat

    from specaudit.cli import main
    d = tmp_path_factory.mktemp("w")
    t = _special(d / "out.txt", kind)
    before = os.stat(t).st_mode
    logs = sorted(FIX.glob("sglang_*.log"))
    argv = [a.format(ds=good_run[0].parent, t=t, log=logs[0], log2=logs[1]) for a in WRITERS[writer]]
    try:
        rc = _bounded(lambda: main(argv))
    except Hung:
        pytest.fail(f"specaudit {' '.join(argv)} hung on a {kind} target")
    err = capsys.readouterr().err
    assert rc == 2 and "not a regular file" in err and "Traceback" not in err, (writer, kind, rc, err)
    assert stat.S_IFMT(os.stat(t).st_mode) == stat.S_IFMT(before)   # still the FIFO / device / socket
    assert not [f for f in d.iterdir() if f.name.startswith(".")]  # no temporary left


PEER = st.one_of(
    st.tuples(st.just("drip"), st.just(b"")), st.tuples(st.just("huge"), st.just(b"")),
    st.tuples(st.just("endless"), st.just(b"")), st.tuples(st.just("redirect"), st.just(b"")),
    st.tuples(st.just("body"), JSON_ANY.map(lambda v: json.dumps({"status": "success", "data": v}).encode())),
    st.tuples(st.just("body"), JSON_ANY.map(lambda v: json.dumps(v).encode())),
    st.tuples(st.just("body"), st.integers(65, 200_000).map(lambda n: b"[" * n)),
    st.tuples(st.just("body"), st.binary(max_size=200)),
)


@FEW
@given(peer=PEER, status=st.sampled_from([200, 200, 301, 400, 401, 500, 503]))
def test_fuzz_hostile_http_peer(peer, status, monkeypatch):
    """A peer that is slow, huge, endless, redirecting or answers any JSON shape: one
    InputError line within the deadline, never a hang, a traceback or a credential sent on."""
    import sys
    import time
    sys.path.insert(0, str(Path(__file__).parent))
    from hostile_peer import HostilePeer

    from specaudit.audit.sources import prom_http
    monkeypatch.setattr(prom_http, "MAX_ANSWER_BYTES", 4 << 20)
    mode, body = peer
    with HostilePeer("body", body=b'{"status": "success", "data": []}') as other, \
            HostilePeer(mode, body=body or b'{"status":"success","data":[]}', status=status, delay=0.05,
                        location=other.url + "/x") as p:
        t = time.monotonic()
        try:
            _bounded(lambda: prom_http.read_prometheus(p.url, range_s=60, step_s=0, timeout=1.5,
                                                       headers=["Authorization: Bearer FUZZ-SECRET"]))
        except InputError as e:
            assert "\n" not in e.reason and "\x1b" not in e.reason
        except Hung:
            pytest.fail(f"{mode} peer: no answer in {ALARM_S}s")
        assert time.monotonic() - t < 6
        assert not any(b"FUZZ-SECRET" in h for h in other.seen)


def _numeric_flags():
    """(command, flag, dest, type) of every int/float option of every command, and of ab's arms."""
    from specaudit.cli import build_parser
    ap = build_parser()
    out = []
    for cmd, sp in sorted(ap.subparsers.items()):
        for a in sp._actions:
            if a.type in (int, float) and a.option_strings:
                out.append((cmd, sp, a))
    return out


NUMERIC = _numeric_flags()
ABSURD = st.one_of(st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 1e-320, -1.0,
                                    2**63, -(2**63), 10**12]), st.integers(max_value=-(2**31)),
                   st.integers(min_value=2**31))


@settings(FUZZ, max_examples=max(FUZZ_EXAMPLES, 60))
@given(i=st.integers(0, len(NUMERIC) - 1), value=ABSURD)
def test_fuzz_absurd_number_for_every_numeric_flag(i, value):
    """Every numeric flag of every command is bounded: an absurd value is one ValueError line
    naming the flag and its bounds, before the command starts."""
    import argparse

    from specaudit.bounds import bound_of, check_args
    cmd, sp, a = NUMERIC[i]
    v = a.type(value) if not (a.type is int and isinstance(value, float)) else value
    if a.type is int and isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return   # argparse's int() refuses these itself (exit 2)
        v = int(value)
    lo, hi, mode = bound_of(cmd, a.dest, a.type)
    inside = ((v > lo if mode == "open_low" else v >= lo) and (v < hi if mode == "open_high" else v <= hi)
              and v == v and abs(v) != float("inf"))
    # defaults as argparse leaves them (a hidden alias's SUPPRESS default sets nothing)
    ns = argparse.Namespace(**{x.dest: x.default for x in sp._actions
                               if x.dest != "help" and x.default is not argparse.SUPPRESS})
    setattr(ns, a.dest, v)
    if inside:
        check_args(cmd, sp, ns)
        return
    with pytest.raises(ValueError) as e:
        check_args(cmd, sp, ns)
    msg = str(e.value)
    # the message names the flag, or the canonical spelling a hidden alias (--topk) stands for
    assert msg.split()[0] in {o for x in sp._actions if x.dest == a.dest for o in x.option_strings}
    assert " must be " in msg and "\n" not in msg


def test_every_numeric_flag_has_a_finite_bound():
    from specaudit.bounds import bound_of
    assert len(NUMERIC) > 40
    for cmd, _sp, a in NUMERIC:
        lo, hi, _ = bound_of(cmd, a.dest, a.type)
        assert abs(lo) < 1e13 and abs(hi) < 1e13 and lo < hi, (cmd, a.dest)


# ---------------------------------------------------------------------- memory


def test_fuzz_memory_stayed_bounded():
    """Last in the module: the whole harness ran within a bounded peak RSS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    assert peak - RSS_START_MB < 2048, (RSS_START_MB, peak)


def test_mutate_is_deterministic():
    rnd = random.Random(0)
    data = bytes(rnd.randrange(256) for _ in range(100))
    ops = [(0, 5, 1), (2, 10, 3), (1, 0, 9)]
    assert _mutate(data, ops) == _mutate(data, ops) and _mutate(data, ops) != data
    assert io.BytesIO(_mutate(data, [(3, 50, 0)])).getbuffer().nbytes == 50
