"""`specaudit check --engine spark`: the same findings as the local checker.

The corpus holds a run per injected runtime fault, a clean run, one run per held-in
corruption (every rule's failing fixture), and bad input (an unreadable step file, a
run.json missing, a run killed mid-way, an unknown schema version, a requests table
that is not Parquet). It is checked locally and then (a) through the Spark driver's
own task functions in-process: whole runs per task, request buckets (1, 3, by bytes)
and both mixed, and (b) on Spark local[2], mixed over the whole corpus (the largest run
over the task budget) and by request buckets alone over its runs that are not a rule's
fixture (the runtime's runs and the bad input: every fixture already goes through the
bucket task functions in (a), and on Spark each bucketed run costs a read task per file
and a group per bucket): the findings must be equal (code, run, request, step, file,
message).
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
from specaudit.audit import spark_plan as spp
from specaudit.audit import spark_session as sps
from specaudit.audit import spark_tasks as spt
from specaudit.audit.check import CheckResult, check_paths
from specaudit.audit.findings import Finding
from specaudit.audit.spark_runs import runs_from_json, runs_to_json
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


def emulate(paths, buckets: int | None, batch_rows: int = BATCH_ROWS, min_groups: int = 0,
            task_bytes: int = -1) -> CheckResult:
    """The Spark dataflow with Python loops in place of Spark: whole-run tasks, read
    tasks, groups, combine. buckets None: check_spark's default, each run's share of
    min_groups (spread_buckets); task_bytes -1: every run by request buckets."""
    rules = [r for r in load_rules() if r.scope != "source"]
    result = CheckResult(max_per_code=0, rules=[r.code for r in rules])
    runs = spp.plan(paths, None, result)
    whole, big = spp.split_runs(runs, task_bytes)
    packs = spp.run_tasks(whole, spp.task_target(whole, 2, task_bytes))
    info = {k: {"run_key": k, "run_id": rf.run_id, "manifest": rf.manifest} for k, rf in big}
    # a task's runs as the Spark job sends them: JSON text, rebuilt in the task
    out = [r for p in packs for r in spt.check_whole(runs_from_json(runs_to_json(p)), rules, batch_rows, p[0][0])]
    groups = defaultdict(list)
    tasks = spp.file_tasks(big, buckets=buckets)
    spp.spread_buckets(tasks, 0 if buckets else min_groups)
    for t in sorted(tasks, key=lambda t: -t["size"]):      # check_spark's order: largest file first
        for row in spt.read_file_rows(t["run_key"], t["kind"], t["file_idx"], spp.Path(t["path"]), t["buckets"],
                                      batch_rows):
            groups[(row["run_key"], row["bucket"])].append(row)
    out += [r for (rk, _), rows in groups.items() for r in spt.check_bucket(rows, info[rk], rules)]
    complete, _ = spt.combine_rows(runs, packs, tasks, [r for r in out if r["row_kind"] != "finding"], rules,
                                   result)
    for r in out:
        if r["row_kind"] == "finding" and r["when_complete"] in (None, complete.get(r["run_key"])):
            vals = json.loads(r.pop("values"))
            result.add(Finding(values=vals, **{k: r[k] for k in spt.FINDINGS_COLUMNS if k != "values"}))
    return result


def _largest_run_bytes(corpus) -> tuple[int, int]:
    """(bytes of the corpus's largest run, of its second largest): a task budget between
    them sends exactly one run to the request buckets."""
    sizes = sorted(spp.run_bytes(rf) for _, rf in spp.plan([corpus]))
    return sizes[-1], sizes[-2]


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


@pytest.mark.parametrize("buckets,min_groups,task_bytes", [(1, 0, -1), (3, 0, -1), (None, 64, -1),
                                                            (None, 64, spp.RUN_TASK_BYTES), (3, 0, "mixed")])
def test_dataflow_in_process_equals_local(corpus, local, buckets, min_groups, task_bytes):
    """Any grouping of whole requests, and whole runs per task, give the local findings:
    the core, not Spark (buckets None: check_spark's default, a different bucket count
    per run, by its bytes; task_bytes -1: buckets alone, RUN_TASK_BYTES: every run of the
    corpus whole, mixed: the largest run by buckets, the others whole)."""
    if task_bytes == "mixed":
        task_bytes = _largest_run_bytes(corpus)[1]
    got, want = _summary(emulate([corpus], buckets, min_groups=min_groups, task_bytes=task_bytes)), _summary(local)
    assert got == want, _diff(got, want)


def test_small_runs_are_checked_whole_and_a_run_over_the_budget_by_buckets(corpus):
    """The plan: under the default budget every run of the corpus is whole (no shuffle of
    its steps); a budget below the largest run sends that one run, and only it, to the
    request buckets; whole-run tasks are contiguous ranges of the listing, at least one
    per run when the target is one byte, and -1 buckets every run."""
    runs = spp.plan([corpus])
    whole, big = spp.split_runs(runs)
    assert len(whole) == len(runs) > 50 and not big
    packs = spp.run_tasks(whole, spp.task_target(whole, 2))
    assert [k for p in packs for k, _ in p] == [k for k, _ in whole]
    assert all([k for k, _ in p] == list(range(p[0][0], p[0][0] + len(p))) for p in packs)
    assert 8 <= len(packs) < len(whole) / 4              # several runs per task, a few tasks per core
    largest, second = _largest_run_bytes(corpus)
    assert largest > second
    whole, big = spp.split_runs(runs, second)
    assert len(big) == 1 and spp.run_bytes(big[0][1]) == largest and len(whole) == len(runs) - 1
    packs = spp.run_tasks(whole, 1 << 30)
    assert big[0][0] not in {p[0][0] for p in packs} and len(packs) == (2 if 0 < big[0][0] < len(runs) - 1 else 1)
    assert len(spp.run_tasks(whole, 1)) == len(whole)
    assert spp.split_runs(runs, -1) == ([], runs)


def test_spread_buckets_gives_every_core_groups_in_proportion_to_bytes(tmp_path):
    """Few big runs on many cores: each run gets its share of the groups by step bytes
    (a single bucket per run left cores idle in the group stage), never fewer buckets
    than the 64 MB cap asks for, and explicit buckets are kept."""
    from specaudit.trace.synth import write_synthetic_dataset
    for i, n in enumerate((3000, 1000)):
        write_synthetic_dataset(tmp_path, n, seed=i, run_id=f"r{i}", chunk_steps=1000)
    runs = spp.plan([tmp_path])
    tasks = spp.file_tasks(runs)
    assert {t["buckets"] for t in tasks} == {1}                  # a few MB: one bucket each by bytes
    n = spp.spread_buckets(tasks, 16)
    per = {t["run_key"]: t["buckets"] for t in tasks}
    big, small = (per[k] for k, rf in runs if rf.run_id == "r0"), (per[k] for k, rf in runs if rf.run_id == "r1")
    big, small = next(big), next(small)
    assert n == big + small and 14 <= n <= 18 and big >= 2.5 * small >= 2.5
    assert all(t["size"] > 0 for t in tasks)
    tasks = spp.file_tasks(runs, buckets=3)
    assert spp.spread_buckets(tasks, 0) == 6 and {t["buckets"] for t in tasks} == {3}


# ------------------------------------------------------------------- on Spark


@pytest.fixture(scope="session")
def spark():
    # The JVM's quick-start options for a session of seconds (the tests', not the product's
    # defaults: a long job on a cluster wants the optimising JIT): the C1 compiler alone and the
    # serial collector. In local mode the executors run in the driver's JVM.
    s = sps.session("local[2]", shuffle_partitions=4,
                    **{"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"})
    yield s
    s.stop()


def _not_fixtures(corpus, to):
    """A copy of the corpus without the rules' fixture runs (folders run_id=fx-*)."""
    to.mkdir()
    for d in corpus.iterdir():
        if not d.name.split("=")[-1].startswith("fx-"):   # run_id=fx-sa301
            shutil.copytree(d, to / d.name)
    return to


@pytest.mark.parametrize("path", ["buckets", "mixed"])
def test_spark_local2_equals_local(spark, corpus, local, tmp_path, path):
    """On Spark: every run by request buckets (3 each; the corpus less the rules' fixtures,
    which `test_dataflow_in_process_equals_local` sends through the same bucket tasks),
    and mixed: the many small runs checked whole by run tasks, the one run larger than
    the task budget by buckets."""
    out = tmp_path / "findings"
    stats: dict = {}
    if path == "buckets":
        kw = dict(buckets=3, task_bytes=-1)
        corpus = _not_fixtures(corpus, tmp_path / "traces")
        local = check_paths([corpus], max_per_code=0, batch_rows=BATCH_ROWS)
    else:
        kw = dict(task_bytes=_largest_run_bytes(corpus)[1])
    res = sp.check_spark(spark, [corpus], out=str(out), max_per_code=0, batch_rows=BATCH_ROWS, stats=stats, **kw)
    assert _summary(res) == _summary(local), _diff(_summary(res), _summary(local))
    n_runs = len(spp.plan([corpus]))
    if path == "buckets":     # the slice still holds findings from every reader and a refused input
        assert {"SA000", "SA001"} <= set(local.counts) and len(local.counts) >= 4 and n_runs >= 10, local.counts
        assert stats["runs_whole"] == stats["whole_tasks"] == 0 and stats["runs_grouped"] == n_runs
    else:
        assert stats["runs_grouped"] == 1 and stats["runs_whole"] == n_runs - 1 and stats["whole_tasks"] >= 4
        (big,) = [rf for _, rf in spp.split_runs(spp.plan([corpus]), kw["task_bytes"])[1]]
        assert any(f.run_id == big.run_id for f in local.findings)   # the bucketed run has findings to agree on
    assert stats["python_cpu_s"] > 0
    assert res.exit_code == local.exit_code == 1
    # the findings dataset holds every finding, with the documented columns
    t = pq.read_table(out)
    assert set(spt.FINDINGS_COLUMNS) <= set(t.schema.names)
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
    assert sps._cores(master) == (cores or os.cpu_count() or 1)
