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
from specaudit.trace.schema import STEPS_SCHEMA, InputError, read_manifest
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
    from specaudit.audit.check import run_config
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
