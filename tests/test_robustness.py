"""Issue 19: nothing lost, nothing hung, no traceback.

Each test reproduces one defect of the adversarial run (hostile manifests, special
files, giant rows, overwritten evidence, full disks, control characters) and checks
the promise: one clear line or finding, the right exit code, the other runs still
checked, nothing overwritten.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from specaudit.audit.check import check_paths
from specaudit.cli import main as cli_main
from specaudit.trace.safe_io import InputError
from specaudit.trace.schema import discover, read_manifest
from specaudit.trace.synth import synth_run_rows, write_run


def _dataset(root, n=2, **kw):
    for i in range(n):
        s, r, m = synth_run_rows(3, run_id=f"r{i}", seed=i, **kw)
        write_run(root, s, r, m)
    return root


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return _dataset(tmp_path_factory.mktemp("clean"))


def _copy(clean, tmp_path):
    d = tmp_path / "ds"
    shutil.copytree(clean, d)
    return d


def _edit_manifest(d, run="r0", fn=None, raw=None):
    p = d / f"run_id={run}" / "run.json"
    if raw is not None:
        p.write_bytes(raw)
        return p
    m = json.loads(p.read_text())
    fn(m)
    p.write_text(json.dumps(m))
    return p


HOSTILE = {
    "eos_id abc": lambda m: m["config"].__setitem__("eos_id", "abc"),
    "conventions a string": lambda m: m.__setitem__("conventions", "pooled"),
    "config a list": lambda m: m.__setitem__("config", [1]),
    "reported a list": lambda m: m.__setitem__("reported", [1]),
    "reported 10**400": lambda m: m["reported"].__setitem__("verify_steps", 10**400),
    "budget 10**30": lambda m: m["config"].__setitem__("budget", 10**30),
    "max_new_tokens a string": lambda m: m["config"].__setitem__("max_new_tokens", "x"),
}
RAW = {
    "eos_id 1e400": lambda t: t.replace(b'"eos_id": 0', b'"eos_id": 1e400'),
    "NaN": lambda t: t.replace(b'"eos_id": 0', b'"eos_id": NaN'),
    "not UTF-8": lambda t: t.replace(b'synthetic', b'\xff\xfe', 1),
    "deeply nested": lambda t: t[:-2] + b', "x": ' + b"[" * 100000 + b"]" * 100000 + b"}",
    "5000-digit number": lambda t: t.replace(b'"eos_id": 0', b'"eos_id": ' + b"9" * 5000),
}


@pytest.mark.parametrize("case", list(HOSTILE) + list(RAW))
def test_hostile_manifest_is_one_finding_and_other_runs_still_checked(clean, tmp_path, case, capsys):
    d = _copy(clean, tmp_path)
    if case in HOSTILE:
        p = _edit_manifest(d, fn=HOSTILE[case])
    else:
        p = d / "run_id=r0" / "run.json"
        p.write_bytes(RAW[case](json.dumps(json.loads(p.read_text())).encode()))
    with pytest.raises(InputError) as e:
        read_manifest(p)
    assert str(p) in str(e.value)
    # the other run is still checked
    res = check_paths([d])
    sa000 = [f for f in res.findings if f.code == "SA000"]
    assert len(sa000) == 1 and str(p) in (sa000[0].file or "")
    assert "r1" in res.runs
    for argv in (["check", str(d)], ["query", "--no-check", str(d), "SELECT count(*) FROM runs"]):
        code = cli_main(argv)
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert code in (0, 1, 2)
    assert cli_main(["check", str(d)]) == 1  # SA000 is an error finding


# ------------------------------------------------------------- special files


def test_symlink_to_dev_zero_and_fifo_are_refused_not_read(clean, tmp_path):
    d = _copy(clean, tmp_path)
    m = d / "run_id=r0" / "run.json"
    m.unlink()
    m.symlink_to("/dev/zero")
    s = d / "run_id=r1" / "steps-000001.parquet"
    os.mkfifo(s)                       # opening it for reading would block forever
    runs = {rf.run_id: rf for rf in discover([d])}
    probs = [str(p) for rf in runs.values() for p in rf.problems]
    assert any("run.json" in p and "device" in p for p in probs), probs
    assert any("steps-000001" in p and "FIFO" in p for p in probs), probs
    res = check_paths([d])
    assert res.counts["SA000"] == 2 and "r1" in res.runs


def test_fifo_given_as_the_path_is_one_line_exit_2(tmp_path, capsys):
    f = tmp_path / "steps-000000.parquet"
    os.mkfifo(f)
    assert cli_main(["check", str(f)]) == 2
    err = capsys.readouterr()
    assert "FIFO" in err.out + err.err and "Traceback" not in err.err


def test_symlinked_run_is_followed_and_a_loop_is_visited_once(clean, tmp_path):
    d = tmp_path / "ds"
    d.mkdir()
    os.symlink(clean / "run_id=r0", d / "run_id=r0")
    os.symlink(d, d / "loop")                      # a symlink loop
    res = check_paths([d])
    assert res.runs == ["r0"] and res.exit_code == 0


def test_a_run_reached_through_two_symlinked_folders_is_one_run(clean, tmp_path):
    """discover's real path of a folder is its parent's plus its name unless the folder is
    a symlink: a run reached through a symlinked parent and a symlinked run folder is
    still one run, and every run's real path is what realpath gives."""
    outside = tmp_path / "outside"
    shutil.copytree(clean / "run_id=r0", outside / "group" / "run_id=r0")
    d = tmp_path / "ds"
    (d / "a").mkdir(parents=True)
    os.symlink(outside / "group", d / "a" / "g")                        # a symlinked parent folder
    os.symlink(outside / "group" / "run_id=r0", d / "run_id=r0")       # the same run, directly
    runs = discover([d])
    assert [str(rf.run_dir) for rf in runs] == [str(d / "a" / "g" / "run_id=r0")]
    assert all(rf.real_dir == os.path.realpath(rf.run_dir) for rf in runs)
    res = check_paths([d])
    assert res.runs == ["r0"] and "SA002" not in res.counts


def test_duplicate_run_warned_once(clean, tmp_path):
    d = _copy(clean, tmp_path)
    shutil.copytree(d / "run_id=r0", d / "backup" / "run_id=r0")
    res = check_paths([d])
    assert res.counts["SA002"] == 1 and res.severities["SA002"] == "warning"
    assert res.exit_code == 0


def test_lone_run_json_of_a_killed_run_is_sa001_not_nothing(clean, tmp_path, capsys):
    d = tmp_path / "ds" / "run_id=r0"
    d.mkdir(parents=True)
    m = json.loads((clean / "run_id=r0" / "run.json").read_text())
    m.pop("finished_at")
    (d / "run.json").write_text(json.dumps(m))
    res = check_paths([d.parent])
    assert res.counts["SA001"] == 1 and res.exit_code == 0 and res.runs == ["r0"]


# ------------------------------------------------------------- wrong verdicts


def test_one_corrupt_row_does_not_blame_the_engine_counters():
    """A row refused by SA1xx (here N > MAX_NODES) is reported once; SA502 and the
    other aggregate rules do not blame run.json's counters for it."""
    import pyarrow as pa

    from specaudit.audit.check import check_tables
    s, r, m = synth_run_rows(3, run_id="c", seed=1)
    rows = s.to_pylist()
    n = 5000
    rows[0].update(node_tokens=[1] * n, parents=list(range(-1, n - 1)), positions=list(range(n)),
                   target_argmax=[1] * n, draft_logprob=None, target_margin=None)
    res = check_tables(pa.Table.from_pylist(rows, schema=s.schema), r, m)
    assert res.counts["SA102"] == 1
    assert not [c for c in res.counts if c.startswith("SA5")], dict(res.counts)


@pytest.mark.parametrize("case", ["giant", "empty", "null_seq_len"])
def test_a_refused_first_step_does_not_feed_sa405(case):
    """SA405 compares a request's first step with its requests row; when that step is
    refused by an SA1xx shape rule its seq_len and root are not evidence: the SA1xx
    finding is the report, SA405 stays silent (it fired on all three before)."""
    import pyarrow as pa

    from specaudit.audit.check import check_tables
    from specaudit.audit.reference import check_rows
    s, r, m = synth_run_rows(3, run_id="c", seed=1)
    rows = s.to_pylist()
    assert rows[0]["step"] == 0
    n = 5000
    if case == "giant":     # N > MAX_NODES, root token changed
        rows[0].update(node_tokens=[7] * n, parents=list(range(-1, n - 1)), positions=list(range(n)),
                       target_argmax=[7] * n, draft_logprob=None, target_margin=None)
    elif case == "empty":   # no nodes: no root at all
        rows[0].update(node_tokens=[], parents=[], positions=[], target_argmax=[], draft_logprob=None,
                       target_margin=None)
    else:                   # a required value missing
        rows[0].update(seq_len=None)
    res = check_tables(pa.Table.from_pylist(rows, schema=s.schema), r, m)
    assert any(c.startswith("SA1") for c in res.counts), dict(res.counts)
    assert "SA405" not in res.counts, dict(res.counts)
    assert ("SA405", str(rows[0]["request_id"]), -1) not in check_rows(rows, r.to_pylist(), m)
    # a first step that is sound but disagrees is still SA405
    rows = s.to_pylist()
    rows[0]["seq_len"] += 1
    res = check_tables(pa.Table.from_pylist(rows, schema=s.schema), r, m)
    assert res.counts["SA405"] == 1, dict(res.counts)


def test_finished_run_with_zero_steps_is_flagged():
    from specaudit.audit.check import check_tables
    s, r, m = synth_run_rows(3, run_id="z", seed=1)
    res = check_tables(s.slice(0, 0), r, m)
    assert res.counts["SA501"] == 1, dict(res.counts)


def test_sa510_does_not_cite_a_rule_that_is_not_reported():
    from specaudit.audit.check import check_tables
    s, r, m = synth_run_rows(3, run_id="t", seed=1)
    m["reported"]["gen_throughput_tps"] *= 2
    res = check_tables(s, r, m, select=("SA510",))
    msg = next(f.message for f in res.findings if f.code == "SA510")
    assert "SA505" not in msg


# ------------------------------------------------------------- bounded


@pytest.mark.parametrize("kind,n", [("chain", 100_000), ("tree", 20_000), ("tokens", 1_000_000)])
def test_giant_rows_are_refused_before_any_n_squared_work(tmp_path, kind, n):
    """Each case used to allocate N x N (931 GiB for 1M nodes) or take 29 s; run in a
    subprocess under a 2 GB address-space limit."""
    import subprocess
    import sys
    code = f"""
import resource, random
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import pyarrow as pa
from specaudit.trace.synth import synth_run_rows, write_run
from specaudit.audit.check import check_paths
s, r, m = synth_run_rows(2, run_id="g", seed=0)
rows = s.to_pylist(); row = rows[0]; N = {n}
row["node_tokens"] = [1] * N
if "{kind}" != "tokens":
    random.seed(0)
    row["parents"] = (list(range(-1, N - 1)) if "{kind}" == "chain"
                      else [-1] + [random.randrange(i) for i in range(1, N)])
    row["positions"] = list(range(N)); row["target_argmax"] = [1] * N
row["draft_logprob"] = None; row["target_margin"] = None
write_run({str(tmp_path)!r}, pa.Table.from_pylist(rows, schema=s.schema), r, m)
res = check_paths([{str(tmp_path)!r}])
# refused as a row (SA102), or, when the row group's declared values already exceed rows x
# MAX_NODES, from the Parquet footer before any value is read (SA000)
print(res.counts["SA102"] or res.counts["SA000"], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    refused, rss_mb = map(int, out.stdout.split())
    assert refused == 1 and rss_mb < 2048


# ------------------------------------------------------------- exit codes


def test_internal_error_is_one_line_naming_the_input_and_exit_3(clean, monkeypatch, capsys):
    """A bug in specaudit (here: a step rule that raises) never exits 1, the code
    for findings, and never prints a traceback."""
    from specaudit.invariants import load_rules
    rule = next(r for r in load_rules() if r.code == "SA301")

    def boom(f):
        raise ZeroDivisionError("division by zero")
    monkeypatch.setattr(type(rule), "check", lambda self, f: boom(f))
    code = cli_main(["check", str(clean)])
    err = capsys.readouterr().err
    assert code == 3
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "a bug in specaudit" in err and "ZeroDivisionError" in err and "steps-000000.parquet" in err


# ------------------------------------------------------------- writes never touch evidence


@pytest.mark.parametrize("target", ["run_id=r0/steps-000000.parquet", "run_id=r0/run.json",
                                    "run_id=r0/report.txt"])
def test_check_output_refuses_every_file_of_the_dataset(clean, tmp_path, target, capsys):
    d = _copy(clean, tmp_path)
    t = d / target
    before = t.read_bytes() if t.exists() else None
    assert cli_main(["check", str(d), "-o", str(t)]) == 2
    err = capsys.readouterr().err
    assert "refusing" in err or "run folder" in err
    assert (t.read_bytes() if t.exists() else None) == before


def test_check_output_elsewhere_is_written_atomically(clean, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert cli_main(["check", str(clean), "-o", str(out), "--output-format", "json"]) == 0
    assert json.loads(out.read_text())["summary"]["runs"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_report_and_calibrate_refuse_a_run_folder(clean, tmp_path, capsys):
    d = _copy(clean, tmp_path)
    assert cli_main(["report", str(d), "--out", str(d / "run_id=r0"), "--no-check"]) == 2
    assert cli_main(["calibrate", "--from-traces", str(d), "--out", str(d / "run_id=r0" / "run.json")]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_query_output_refuses_a_trace_file(clean, tmp_path, capsys):
    d = _copy(clean, tmp_path)
    t = d / "run_id=r1" / "requests.parquet"
    before = t.read_bytes()
    assert cli_main(["query", "--no-check", str(d), "SELECT 1", "-o", str(t)]) == 2
    assert t.read_bytes() == before


# ------------------------------------------------------------- output formats

EVIL = "r\x1b[2J\x1b]0;pwned\x07\x00\x9b31m\u202e\ud800x"


@pytest.fixture(scope="module")
def evil(tmp_path_factory):
    """A run whose run.json names a run id full of terminal escapes and XML-illegal
    characters; its rows carry another id, so SA108 quotes both."""
    d = tmp_path_factory.mktemp("evil")
    s, r, m = synth_run_rows(2, run_id="r0", seed=3)
    run_dir = write_run(d, s, r, m)
    m["run_id"] = EVIL
    (run_dir / "run.json").write_text(json.dumps(m))
    return d


@pytest.mark.parametrize("fmt", ["text", "github", "junit", "json", "sarif"])
def test_formats_escape_control_characters(evil, fmt, capsys):
    import xml.etree.ElementTree as ET
    assert cli_main(["check", str(evil), "--output-format", fmt]) == 1
    out = capsys.readouterr().out
    for ch in ("\x1b", "\x00", "\x07", "\x9b", "\u202e"):
        assert ch not in out
    out.encode("utf-8")                                  # no lone surrogate
    if fmt == "junit":
        root = ET.fromstring(out.encode())               # valid XML
        assert root.tag == "testsuites"
    if fmt in ("json", "sarif"):
        json.loads(out)                                  # valid JSON (escapes are JSON's own)
    if fmt in ("text", "github", "junit"):
        assert "\\x1b[2J" in out                          # shown, not executed


@pytest.mark.parametrize("threads", ["100000", "-1", "0"])
def test_query_threads_bounded(clean, threads, capsys):
    assert cli_main(["query", "--no-check", "--threads", threads, str(clean), "SELECT 1"]) == 2
    err = capsys.readouterr().err
    # bounded up front (specaudit/bounds.py) or by the command's own check: one line either way
    assert ("--threads must be between 1 and" in err or "--threads must be at least 1" in err
            or "--threads must be at most" in err) and "Traceback" not in err


def test_query_counts_a_copied_run_once(clean, tmp_path):
    from specaudit.postmortem.views import connect
    d = _copy(clean, tmp_path)
    shutil.copytree(d / "run_id=r0", d / "backup" / "run_id=r0")
    con = connect([d], None)
    try:
        n_runs = con.execute("SELECT count(*) FROM runs").fetchone()[0]
        n_steps = con.execute("SELECT count(*) FROM steps").fetchone()[0]
    finally:
        con.close()
    import pyarrow.parquet as pq
    want = sum(pq.ParquetFile(f).metadata.num_rows for f in clean.rglob("steps-*.parquet"))
    assert n_runs == 2 and n_steps == want


# ------------------------------------------------------------- other readers on nulls


def _nulled(root, col=None, dup=None, rows=None, run_id="n0"):
    import pyarrow as pa
    s, r, m = synth_run_rows(3, run_id=run_id, seed=0)
    if col:
        i = s.schema.get_field_index(col)
        s = s.set_column(i, col, pa.nulls(s.num_rows, s.schema.field(col).type))
    if dup:
        s = s.append_column(dup, s.column(dup))
    if rows is not None:
        s = s.slice(0, rows)
    write_run(root, s, r, m)
    return root


@pytest.mark.parametrize("argv,mk,codes", [
    (["diff", "{base}", "{x}"], dict(col="mask_hash"), (0, 1)),
    (["diff", "{base}", "{x}"], dict(dup="commit_len"), (2,)),
    (["diff", "{base}", "{x}"], dict(rows=0), (2,)),       # was "identical", exit 0
    (["estimate", "{x}", "--cost-factor", "0.3", "--baseline-tps", "100"], dict(col="step_s"), (2,)),
    (["estimate", "{x}", "--cost-factor", "0.3", "--baseline-tps", "100"], dict(col="t_start"), (2,)),
    (["report", "{x}", "--out", "{out}"], dict(col="commit_len"), (0, 1)),   # 1: the checker found SA107
    (["query", "{x}", "SELECT count(*) FROM steps"], dict(dup="commit_len"), (0,)),
])
def test_readers_on_nulls_and_duplicate_columns(tmp_path, argv, mk, codes, capsys):
    base = _nulled(tmp_path / "base", run_id="n0")
    x = _nulled(tmp_path / "x", **mk)
    argv = [a.format(base=base, x=x, out=tmp_path / "out") for a in argv]
    code = cli_main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    assert code in codes, (code, err)


# ------------------------------------------------------------- sinks degrade loudly


def _tracer(tmp_path, monkeypatch, retry_s=0.05):
    import errno

    from prometheus_client import CollectorRegistry

    from specaudit.trace import parquet as P
    from specaudit.trace.prom_sink import PromSink
    from specaudit.trace.tracer import Tracer
    full = {"on": False}
    real = P.write_parquet_atomic

    def write(path, table, *a, **k):
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, table, *a, **k)
    monkeypatch.setattr(P, "write_parquet_atomic", write)
    reg = CollectorRegistry()
    sink = P.ParquetSink(tmp_path / "ds", "s1", flush_s=0.0, retry_s=retry_s)
    prom = PromSink(reg, max_depth=8)
    tr = Tracer([sink, prom], {"schema_version": 1, "engine": {}, "models": {}, "config": {"budget": 7},
                               "host": {}}, "s1")
    return tr, sink, reg, full


def _finish(tr, i):
    tr.begin_request(f"q{i}", prompt_tokens=[1, 2], first_token=3)
    tr.end_request(f"q{i}", output_tokens=[3, 4], finish_reason="eos", ttft_s=0.1, e2e_s=0.2)
    tr.flush(5)


def test_full_disk_turns_health_red_counts_logs_once_and_recovers(tmp_path, monkeypatch, caplog):
    import logging
    import time
    tr, sink, reg, full = _tracer(tmp_path, monkeypatch)
    _finish(tr, 0)
    assert tr.health()["ok"]
    full["on"] = True
    with caplog.at_level(logging.WARNING, logger="specaudit.tracer"):
        for i in range(1, 4):
            _finish(tr, i)
            time.sleep(0.06)                               # past the backoff: retried
        h = tr.health()
        assert not h["ok"] and h["errors"] >= 2 and "No space left" in h["last_error"]
        assert not h["sinks"]["parquet"]["ok"]
        assert reg.get_sample_value("specaudit_sink_errors_total", {"sink": "parquet"}) >= 2
        assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1   # one line
        full["on"] = False
        time.sleep(0.2)                                    # backoff doubled: wait it out
        _finish(tr, 4)
        assert tr.health()["ok"]
        assert any("recovered" in r.getMessage() for r in caplog.records)
    tr.close()
    import pyarrow.parquet as pq
    rq = pq.read_table(sink.run_dir / "requests.parquet")
    assert sorted(rq.column("request_id").to_pylist()) == [f"q{i}" for i in range(5)]   # nothing lost
    assert not [p for p in sink.run_dir.iterdir() if p.name.startswith(".")]


def test_disk_still_full_at_close_is_one_line_and_files_stay_readable(tmp_path, monkeypatch):
    from specaudit.trace.parquet import SinkError
    tr, sink, reg, full = _tracer(tmp_path, monkeypatch)
    _finish(tr, 0)
    full["on"] = True
    _finish(tr, 1)
    with pytest.raises(SinkError) as e:
        tr.close()
    assert "\n" not in str(e.value) and "could not finish" in str(e.value)
    assert isinstance(e.value, InputError)                 # the CLI: one line, exit 2
    res = check_paths([sink.run_dir])
    assert res.counts["SA001"] == 1 and not res.bad_files   # readable, reported incomplete


def test_requests_are_on_disk_before_the_run_ends(tmp_path, monkeypatch):
    """A killed server used to lose every finished request (written only at close)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    tr, sink, reg, full = _tracer(tmp_path, monkeypatch)
    for i in range(3):
        _finish(tr, i)
    # no close(): as after SIGKILL, the finished requests are in appended parts
    rq = pa.concat_tables([pq.read_table(p) for p in sorted(sink.run_dir.glob("requests-*.parquet"))])
    assert rq.num_rows == 3 and rq.column("output_tokens").to_pylist()[0] == [3, 4]
    tr.close()


def test_atomic_write_leaves_no_temporary_on_a_real_write_error(tmp_path):
    """RLIMIT_FSIZE makes the kernel refuse the write (EFBIG), as a full disk does."""
    import subprocess
    import sys
    code = f"""
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
from specaudit.trace.safe_io import atomic_write_bytes
try:
    atomic_write_bytes({str(tmp_path / 'f.bin')!r}, b"x" * 100000)
except OSError as e:
    print("refused", e.errno)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("refused"), out.stderr[-1000:]
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------- run on a full disk


def test_run_refuses_to_start_without_free_space(tmp_path, monkeypatch):
    import shutil as sh
    from collections import namedtuple

    from specaudit.traced_run import run_traced
    du = namedtuple("du", "total used free")
    monkeypatch.setattr(sh, "disk_usage", lambda p: du(10 << 20, 9 << 20, 1 << 20))
    with pytest.raises(InputError, match="MiB free"):
        run_traced(num_prompts=2, max_new_tokens=8, out=tmp_path / "ds", oracle=False)
    assert not list((tmp_path / "ds").glob("run_id=*"))       # nothing half-written


def test_run_stops_early_when_the_disk_fills_and_keeps_files_readable(tmp_path, monkeypatch):
    import errno

    from specaudit.trace import parquet as P
    from specaudit.traced_run import run_traced
    real, calls = P.write_parquet_atomic, {"n": 0}

    def write(path, table, *a, **k):
        calls["n"] += 1
        if calls["n"] > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, table, *a, **k)
    monkeypatch.setattr(P, "write_parquet_atomic", write)
    with pytest.raises(P.SinkError) as e:
        run_traced(num_prompts=8, max_new_tokens=24, concurrency=1, out=tmp_path / "ds", oracle=False,
                   flush_steps=1, flush_s=0.0)
    assert "\n" not in str(e.value)
    res = check_paths([tmp_path / "ds"])
    assert not res.bad_files and res.counts["SA001"] == 1    # readable, incomplete
    assert res.steps > 0 and res.steps < 8 * 24


@pytest.mark.parametrize("cols", [("node_tokens",), ("node_tokens", "parents", "positions", "target_argmax",
                                                     "accepted_path", "committed_tokens")])
def test_every_node_list_empty_is_findings_not_a_traceback(cols):
    import pyarrow as pa

    from specaudit.audit.check import check_tables
    s, r, m = synth_run_rows(3, run_id="e", seed=0)
    rows = s.to_pylist()
    for row in rows:
        for c in cols:
            row[c] = []
    res = check_tables(pa.Table.from_pylist(rows, schema=s.schema), r, m)
    assert res.counts["SA102"] == len(rows) and res.exit_code == 1


def test_unknown_convention_value_is_sa601_not_a_crash(clean, tmp_path, capsys):
    d = _copy(clean, tmp_path)
    _edit_manifest(d, fn=lambda m: m.__setitem__("conventions", {"mean": 5}))
    res = check_paths([d])
    assert res.counts["SA601"] == 1 and "SA000" not in res.counts
    assert cli_main(["query", "--no-check", str(d), "SELECT count(*) FROM runs"]) in (0, 2)
    assert "Traceback" not in capsys.readouterr().err


def _null_inside(root, col: str, typ, row: int | None):
    """A run whose steps' `col` list values are of `typ`, one value of step row `row` null
    (None: no null, the passing twin)."""
    import pyarrow as pa
    s, r, m = synth_run_rows(3, run_id="v0", seed=0)
    i = s.schema.get_field_index(col)
    arr = s.column(i).combine_chunks()
    vals = arr.values.to_pylist()
    off = arr.offsets.to_pylist()
    if row is not None:
        assert off[row + 1] > off[row], "the chosen row's list is empty"
        vals[off[row] + (off[row + 1] - off[row]) // 2] = None
    new = pa.ListArray.from_arrays(arr.offsets, pa.array(vals, typ))
    s = s.set_column(i, pa.field(col, pa.list_(typ)), new)
    write_run(root, s, r, m)
    return root, s


@pytest.mark.parametrize("compiled_on", [False, True])
@pytest.mark.parametrize("col,typ", [(c, t) for c in ("node_tokens", "parents", "positions", "target_argmax",
                                                      "accepted_path", "committed_tokens")
                                     for t in ("int32", "uint32") if (c, t) != ("parents", "uint32")])  # root: -1
def test_a_null_inside_a_required_list_is_sa107_not_a_minus_one(tmp_path, col, typ, compiled_on, monkeypatch):
    """A null value inside a required list was read as -1 and nothing said so (uint32 values
    raised OverflowError: an internal error); now the row is SA107, named by its column."""
    import pyarrow as pa
    from specaudit.invariants import compiled
    if compiled_on:
        monkeypatch.setattr(compiled, "MIN_ROWS", 0)
        monkeypatch.delenv(compiled.ENV, raising=False)
    else:
        monkeypatch.setenv(compiled.ENV, "0")
    t = getattr(pa, typ)()
    ok, _ = _null_inside(tmp_path / "ok", col, t, None)
    assert [f.code for f in check_paths([ok]).findings] == []     # the passing twin
    root, s = _null_inside(tmp_path / "bad", col, t, 4)
    res = check_paths([root])
    sa107 = [f for f in res.findings if f.code == "SA107"]
    want = (s.column("request_id")[4].as_py(), s.column("step")[4].as_py())
    assert [(f.request_id, f.step) for f in sa107] == [want], [f.message for f in res.findings]
    assert f"{col} holds a null value" in sa107[0].message
