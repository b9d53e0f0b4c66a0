"""`specaudit check --engine spark`: the same findings as the local checker.

The corpus holds a run per injected runtime fault, a clean run, one run per held-in
corruption (every rule's failing fixture), and bad input (an unreadable step file, a
run.json missing, a run killed mid-way, an unknown schema version, a requests table
that is not Parquet). It is checked locally and then (a) through the Spark driver's
own task functions in-process, with 1 and 3 request buckets, and (b) on Spark
local[2]: the findings must be equal (code, run, request, step, file, message).
"""
from __future__ import annotations

import json
import shutil
from collections import defaultdict

import pyarrow.parquet as pq
import pytest
from specaudit.invariants import all_rules, load_rules
from specaudit.invariants.fixtures import FixtureRun

from specaudit.audit import spark as sp
from specaudit.audit.check import CheckResult, check_paths
from specaudit.runtime.faults import FAULTS

# PySpark 4.x warns about pandas 3 on Arrow functions, which use no pandas
# slow: a Spark session and a corpus of real runs (tests/conftest.py starts slow modules first under xdist)
pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")]

BATCH_ROWS = 37          # small batches: requests cross batch and file boundaries
CHECK_FAULTS = [(n, a) for n, f in FAULTS.items() if f.revealed_by == "check" for a in f.algos]


def _rename(run: FixtureRun, run_id: str) -> FixtureRun:
    """Give a fixture its own run id (rows that carried the old id follow it)."""
    old = run.manifest.get("run_id")
    run.manifest["run_id"] = run_id
    for r in run.steps + (run.requests or []):
        if r.get("run_id") == old:
            r["run_id"] = run_id
    return run


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, fault_run, clean_dataset, make_run):
    out = tmp_path_factory.mktemp("spark-corpus") / "traces"
    out.mkdir()
    # every injected fault, and clean runs, from the real runtime
    for name, algo in CHECK_FAULTS:
        try:
            src, _ = fault_run(name, algo)
        except ValueError as e:  # a fault of speculative sampling: it needs a temperature
            if "temperature" not in str(e):
                raise
            src = tmp_path_factory.mktemp(f"sampled-{name}-{algo}")
            make_run(out=src, oracle=False, inject=name, algo=algo, budget=7 if algo == "chain" else 12,
                     topk=1 if algo == "chain" else 3, temperature=0.8, seed=3)
        for d in src.iterdir():
            shutil.copytree(d, out / d.name)
    clean, _ = clean_dataset
    for d in clean.iterdir():
        shutil.copytree(d, out / d.name)
    # every held-in corruption: each rule's failing fixture, in 3 step files
    for rule in all_rules():
        if rule.scope == "source":
            continue
        run = _rename(FixtureRun.make(rule.fixture_algo), f"fx-{rule.code.lower()}")
        rule.fail(run)
        if run.manifest.get("run_id") is None or not isinstance(run.manifest.get("run_id"), str):
            continue
        run.write(out, n_files=3)
    # bad input
    ok = lambda rid: _rename(FixtureRun.make("tree"), rid).write(out, n_files=2)
    (ok("bad-step-file") / "steps-000001.parquet").write_bytes(b"PAR1 not really")
    (ok("no-manifest") / "run.json").unlink()
    killed = ok("killed")
    (killed / "requests.parquet").unlink()
    m = json.loads((killed / "run.json").read_text())
    m.pop("finished_at", None)
    (killed / "run.json").write_text(json.dumps(m))
    v = ok("future-version")
    m = json.loads((v / "run.json").read_text())
    m["schema_version"] = 99
    (v / "run.json").write_text(json.dumps(m))
    (ok("bad-requests") / "requests.parquet").write_bytes(b"\x00" * 64)
    return out


def _key(f):
    return (f.code, f.run_id, f.request_id, f.step, f.file, f.message)


def _summary(res: CheckResult):
    return (sorted(_key(f) for f in res.findings), dict(res.counts), sorted(res.runs), res.steps, res.requests,
            sorted(res.incomplete_runs), sorted(res.bad_files), sorted(res.files_checked))


def _diff(a, b) -> str:
    """What differs between two _summary()s, readably."""
    out = []
    for name, x, y in zip(("findings", "counts", "runs", "steps", "requests", "incomplete", "bad", "files"), a, b):
        if x == y:
            continue
        if isinstance(x, list):
            out += [f"{name}: first only {e}" for e in sorted(set(x) - set(y))[:5]]
            out += [f"{name}: second only {e}" for e in sorted(set(y) - set(x))[:5]]
            out.append(f"{name}: {len(x)} vs {len(y)}")
        else:
            out.append(f"{name}: {x} vs {y}")
    return "\n".join(out)


def emulate(paths, buckets: int | None, batch_rows: int = BATCH_ROWS, min_groups: int = 0) -> CheckResult:
    """The Spark dataflow with Python loops in place of Spark: read tasks, groups, combine.
    buckets None: check_spark's default, each run's share of min_groups (spread_buckets)."""
    rules = [r for r in load_rules() if r.scope != "source"]
    result = CheckResult(max_per_code=0, rules=[r.code for r in rules])
    runs = sp.plan(paths, None, result)
    info = {k: {"run_key": k, "run_id": rf.run_id, "manifest": rf.manifest} for k, rf in runs}
    groups = defaultdict(list)
    tasks = sp.file_tasks(runs, buckets=buckets)
    sp.spread_buckets(tasks, 0 if buckets else min_groups)
    for t in sorted(tasks, key=lambda t: -t["size"]):      # check_spark's order: largest file first
        for row in sp.read_file_rows(t["run_key"], t["kind"], t["file_idx"], sp.Path(t["path"]), t["buckets"],
                                     batch_rows):
            groups[(row["run_key"], row["bucket"])].append(row)
    out = [r for (rk, _), rows in groups.items() for r in sp.check_bucket(rows, info[rk], rules)]
    statuses, partials = defaultdict(list), defaultdict(list)
    for r in out:
        if r["row_kind"] == "status":
            statuses[r["run_key"]].append({**json.loads(r["payload"]), "file": r["file"]})
        elif r["row_kind"] == "partial":
            partials[r["run_key"]].append(json.loads(r["payload"]))
    complete = {k: sp.combine_run(rf, k, statuses[k], partials[k], rules, result) for k, rf in runs}
    for r in out:
        if r["row_kind"] == "finding" and r["when_complete"] in (None, complete[r["run_key"]]):
            vals = json.loads(r.pop("values"))
            result.add(sp.Finding(values=vals, **{k: r[k] for k in sp.FINDINGS_COLUMNS if k != "values"}))
    return result


@pytest.fixture(scope="module")
def local(corpus):
    return check_paths([corpus], max_per_code=0, batch_rows=BATCH_ROWS)


def test_corpus_covers_faults_corruptions_and_bad_input(local):
    codes = set(local.counts)
    refused = {r for r, _ in local.incomplete_runs} | {f.run_id for f in local.findings if f.code == "SA000"}
    for rule in all_rules():
        if rule.scope != "source":
            # its corruption fires its code, or (a manifest the reader refuses) SA000
            assert rule.code in codes or f"fx-{rule.code.lower()}" in refused, rule.code
    assert {"SA000", "SA001"} <= codes
    reasons = " ".join(r for _, r in local.bad_files)
    assert "missing run.json" in reasons and "not a Parquet file" in reasons and "schema_version" in reasons


@pytest.mark.parametrize("buckets,min_groups", [(1, 0), (3, 0), (None, 64)])
def test_dataflow_in_process_equals_local(corpus, local, buckets, min_groups):
    """Any grouping of whole requests gives the local findings: the core, not Spark
    (None: check_spark's default, a different bucket count per run, by its bytes)."""
    got, want = _summary(emulate([corpus], buckets, min_groups=min_groups)), _summary(local)
    assert got == want, _diff(got, want)


def test_spread_buckets_gives_every_core_groups_in_proportion_to_bytes(tmp_path):
    """Few big runs on many cores: each run gets its share of the groups by step bytes
    (a single bucket per run left cores idle in the group stage), never fewer buckets
    than the 64 MB cap asks for, and explicit buckets are kept."""
    from specaudit.trace.synth import write_synthetic_dataset
    for i, n in enumerate((3000, 1000)):
        write_synthetic_dataset(tmp_path, n, seed=i, run_id=f"r{i}", chunk_steps=1000)
    runs = sp.plan([tmp_path])
    tasks = sp.file_tasks(runs)
    assert {t["buckets"] for t in tasks} == {1}                  # a few MB: one bucket each by bytes
    n = sp.spread_buckets(tasks, 16)
    per = {t["run_key"]: t["buckets"] for t in tasks}
    big, small = (per[k] for k, rf in runs if rf.run_id == "r0"), (per[k] for k, rf in runs if rf.run_id == "r1")
    big, small = next(big), next(small)
    assert n == big + small and 14 <= n <= 18 and big >= 2.5 * small >= 2.5
    assert all(t["size"] > 0 for t in tasks)
    tasks = sp.file_tasks(runs, buckets=3)
    assert sp.spread_buckets(tasks, 0) == 6 and {t["buckets"] for t in tasks} == {3}


# ------------------------------------------------------------------- on Spark


@pytest.fixture(scope="session")
def spark():
    s = sp.session("local[2]", shuffle_partitions=4)
    yield s
    s.stop()


def test_spark_local2_equals_local(spark, corpus, local, tmp_path):
    out = tmp_path / "findings"
    res = sp.check_spark(spark, [corpus], out=str(out), max_per_code=0, batch_rows=BATCH_ROWS, buckets=3)
    assert _summary(res) == _summary(local), _diff(_summary(res), _summary(local))
    assert res.exit_code == local.exit_code == 1
    # the findings dataset holds every finding, with the documented columns
    t = pq.read_table(out)
    assert set(sp.FINDINGS_COLUMNS) <= set(t.schema.names)
    assert sorted((r["code"], r["run_id"], r["request_id"], r["step"], r["file"], r["message"])
                  for r in t.to_pylist()) == sorted(_key(f) for f in local.findings)


def _small(tmp_path):
    """One run with the seed bug (SA301) in two step files."""
    from specaudit.invariants import get_rule
    run = _rename(FixtureRun.make("chain"), "cli-run")
    get_rule("SA301").fail(run)
    d = tmp_path / "traces"
    run.write(d, n_files=2)
    return d


def test_cli_engine_spark_reports_and_writes_findings(spark, tmp_path, capsys):
    from specaudit.cli import main as cli
    d = _small(tmp_path)
    out = tmp_path / "findings"
    code = cli(["check", "--engine", "spark", str(d), str(tmp_path / "missing"), "--spark-master", "local[2]",
                "--out", str(out), "--output-format", "json"])
    o, e = capsys.readouterr()
    assert "Traceback" not in o + e
    assert code == 1
    rep = json.loads(o)
    codes = {f["code"] for f in rep["findings"]}
    assert {"SA301", "SA000"} <= codes                      # the bug, and the path that is not there
    local = check_paths([d, tmp_path / "missing"])
    assert sorted(_key(f) for f in local.findings) == sorted(
        (f["code"], f.get("run_id"), f.get("request_id"), f.get("step"), f.get("file"), f["message"])
        for f in rep["findings"])
    assert pq.read_table(out).num_rows == sum(local.counts.values())


def test_cli_engine_spark_nothing_readable_is_one_line_exit_2(spark, tmp_path, capsys):
    from specaudit.cli import main as cli
    code = cli(["check", "--engine", "spark", str(tmp_path / "nowhere"), "--spark-master", "local[2]"])
    o, e = capsys.readouterr()
    assert code == 2 and "Traceback" not in o + e
    assert e.strip().splitlines() == [f"specaudit check: error: {tmp_path / 'nowhere'}: no such file or folder"]


def test_out_inside_the_dataset_is_refused_before_any_job(spark, tmp_path):
    d = _small(tmp_path)
    with pytest.raises(sp.InputError, match="overwrite the dataset"):
        sp.check_spark(spark, [d], out=str(d / "run_id=cli-run"))
    assert (d / "run_id=cli-run" / "run.json").exists()


def test_uri_listed_by_spark_gives_the_same_findings(spark, tmp_path):
    """A URI (here file://; s3a:// and gs:// go the same way) is listed and its run.json
    read with Spark's binaryFile source, each file opened by URI in the tasks."""
    d = _small(tmp_path)
    (d / "run_id=cli-run" / "steps-000001.parquet").write_bytes(b"not parquet")
    local = check_paths([d], max_per_code=0)
    res = sp.check_spark(spark, [d.as_uri()], max_per_code=0)
    strip = lambda f: (f.code, f.run_id, f.request_id, f.step, f.message.split(": ", 1)[-1])
    assert sorted(map(strip, res.findings)) == sorted(map(strip, local.findings))
    assert (res.steps, res.requests, res.runs) == (local.steps, local.requests, local.runs)
    assert any(f.code == "SA000" and f.file.endswith("steps-000001.parquet") for f in res.findings)


def test_no_java_is_one_line_exit_2(tmp_path):
    """Spark that cannot start (here: JAVA_HOME names no Java) is one line and exit 2,
    never a Python or Java traceback."""
    import os
    import subprocess
    import sys
    d = _small(tmp_path)
    p = subprocess.run([sys.executable, "-m", "specaudit", "check", "--engine", "spark", str(d)], capture_output=True,
                       text=True, env=dict(os.environ, JAVA_HOME=str(tmp_path / "no-java")), timeout=300)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stdout + p.stderr and "at org.apache" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("specaudit check: error: cannot start Spark") and "Java 17 or 21" in last


@pytest.mark.parametrize("master,cores", [("local[3]", 3), ("local[4,2]", 4), ("local", None), ("local[*]", None),
                                          ("yarn", 8), (None, 8)])
def test_shuffle_partitions_follow_the_local_cores(master, cores):
    """session(): spark.sql.shuffle.partitions = the cores of a local master (the group
    stage partitions itself; more shuffle partitions only add tasks), else 8."""
    import os
    assert sp._cores(master) == (cores or os.cpu_count() or 1)
