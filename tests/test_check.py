"""`specaudit check`: real runtime traces (clean and every injected fault), bad input,
the CLI's options and exit codes, every output format parsed, many runs and batches."""
from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from specaudit.invariants.fixtures import FixtureRun

from specaudit.audit.check import check_paths
from specaudit.cli import main as cli
from specaudit.runtime.faults import FAULTS
from specaudit.trace.schema import STEPS_SCHEMA
from specaudit.trace.synth import synth_run_rows, write_run

# the code each runtime fault must raise (other codes may fire too: a lying counter
# usually breaks an aggregate as well)
EXPECTED = {
    "commit-counter": "SA301",
    "position-off-by-one": "SA201",
    "causal-mask-on-tree": "SA202",
    "bonus-double-count": "SA302",
    "eos-overcount": "SA308",
    "kv-compaction": "SA407",
}
# sampling faults (need --temperature) are caught in tests/test_sampling.py
CHECK_FAULTS = [(n, a) for n, f in FAULTS.items() if f.revealed_by == "check" and not f.sampled for a in f.algos]


def test_every_check_fault_has_an_expected_code():
    assert {n for n, _ in CHECK_FAULTS} == set(EXPECTED)


# ------------------------------------------------------------- real traces

def test_clean_runs_report_nothing(clean_dataset):
    out, results = clean_dataset
    res = check_paths([out])
    assert len(res.runs) == len(results) and res.steps > 0 and res.requests > 0
    assert dict(res.counts) == {}, [f"{f.code} {f.message}" for f in res.findings[:10]]
    assert res.exit_code == 0 and not res.incomplete_runs and not res.bad_files


@pytest.mark.parametrize("name,algo", CHECK_FAULTS, ids=lambda x: x)
def test_injected_fault_is_caught(fault_run, name, algo):
    out, _ = fault_run(name, algo)
    res = check_paths([out])
    code = EXPECTED[name]
    assert res.counts.get(code, 0) > 0, (name, algo, dict(res.counts))
    assert res.exit_code == 1
    f = next(f for f in res.findings if f.code == code)
    assert any(ch.isdigit() for ch in f.message), f.message  # it shows the numbers


def test_seed_fault_reads_like_the_seed(fault_run):
    out, _ = fault_run("commit-counter", "chain")
    res = check_paths([out], select=("SA301", "SA506", "SA507"))
    msg = next(f.message for f in res.findings if f.code == "SA301")
    assert "chain committed" in msg and "but accepted depth is 7 (an unfinished step commits depth + 1 = 8)" in msg
    agg = {f.code: f.message for f in res.findings if f.code in ("SA506", "SA507")}
    assert "drafted nodes per step" in agg["SA506"]
    assert "reads a boolean" in agg["SA507"]


def test_bonus_double_count_names_the_bonus(fault_run):
    out, _ = fault_run("bonus-double-count", "chain")
    res = check_paths([out], select=("SA302", "SA503"))
    msgs = {f.code: f.message for f in res.findings}
    assert "bonus token counted as an accepted draft" in msgs["SA302"]
    assert "bonus counted as accepted" in msgs["SA503"]


def test_stale_draft_records_are_true(fault_run):
    """revealed_by diff: every record is true, so the checker finds nothing."""
    for algo in FAULTS["stale-draft"].algos:
        out, _ = fault_run("stale-draft", algo)
        res = check_paths([out])
        assert dict(res.counts) == {}, [f.message for f in res.findings[:5]]


def test_tiny_batches_give_the_same_answer(clean_dataset, fault_run):
    """The per-request carry makes the answer independent of where batches split."""
    out, _ = clean_dataset
    assert dict(check_paths([out], batch_rows=3).counts) == {}
    fout, _ = fault_run("commit-counter", "chain")
    big = check_paths([fout], max_per_code=0)
    small = check_paths([fout], batch_rows=5, max_per_code=0)
    assert big.counts == small.counts
    key = lambda f: (f.code, f.request_id, f.step)
    assert sorted(map(key, big.findings), key=str) == sorted(map(key, small.findings), key=str)


def test_many_datasets_and_run_folders(clean_dataset, fault_run, tmp_path):
    out, results = clean_dataset
    fout, _ = fault_run("position-off-by-one", "chain")
    run_dir = next(fout.iterdir())
    res = check_paths([out, run_dir, results[0].run_dir / "run.json"])  # the last is a duplicate
    assert len(res.runs) == len(results) + 1
    assert set(f.run_id for f in res.findings) == {run_dir.name.split("=", 1)[1]}


# -------------------------------------------------------------- bad input

def _write(tmp_path, **kw):
    st, rq, m = synth_run_rows(4, seed=2, **kw)
    return write_run(tmp_path, st, rq, m), st, rq, m


def _cli(capsys, *argv):
    code = cli(["check", *map(str, argv)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_empty_folder(tmp_path, capsys):
    code, out, err = _cli(capsys, tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "empty folder" in err


def test_missing_path(tmp_path, capsys):
    code, _, err = _cli(capsys, tmp_path / "nope")
    assert code == 2 and "no such file" in err


def test_not_parquet_and_truncated_and_fine_ones_still_checked(tmp_path, capsys):
    run_dir, st, _, _ = _write(tmp_path / "ds")
    good = FixtureRun.make("tree").write(tmp_path / "ds")
    (run_dir / "steps-000001.parquet").write_text("this is not parquet\n")
    data = (run_dir / "steps-000000.parquet").read_bytes()
    (run_dir / "steps-000000.parquet").write_bytes(data[: len(data) // 2])
    code, out, err = _cli(capsys, tmp_path / "ds", "--output-format", "json")
    doc = json.loads(out)
    bad = {f["file"].rsplit("/", 1)[-1]: f["message"] for f in doc["findings"] if f["code"] == "SA000"}
    assert "not a Parquet file" in bad["steps-000001.parquet"] or "Parquet" in bad["steps-000001.parquet"]
    assert "steps-000000.parquet" in bad
    assert code == 1
    res = check_paths([tmp_path / "ds"])
    assert str(good / "steps-000000.parquet") in res.files_checked and "fx-tree" in res.runs
    assert {p.rsplit("/", 1)[-1] for p, _ in res.bad_files} == {"steps-000000.parquet", "steps-000001.parquet"}


def test_only_bad_files_exit_2_with_one_line_each(tmp_path, capsys):
    run_dir, *_ = _write(tmp_path)
    (run_dir / "steps-000000.parquet").write_text("garbage")
    (run_dir / "requests.parquet").write_bytes(b"PAR1" + b"\0" * 20)
    code, out, err = _cli(capsys, tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 2 and all(": " in ln for ln in lines)


@pytest.mark.parametrize("column", ["commit_len", "parents"])
def test_missing_required_column(tmp_path, capsys, column):
    run_dir, st, *_ = _write(tmp_path)
    pq.write_table(st.drop_columns([column]), run_dir / "steps-000000.parquet")
    code, out, err = _cli(capsys, tmp_path, "--output-format", "json")
    assert code == 1  # the requests table was still read and checked
    msg = next(f["message"] for f in json.loads(out)["findings"] if f["code"] == "SA000")
    assert f"missing required column '{column}'" in msg


def test_wrong_type(tmp_path, capsys):
    run_dir, st, *_ = _write(tmp_path)
    as_text = pa.array([str(x) for x in st["seq_len"].to_pylist()])
    t = st.set_column(st.schema.get_field_index("seq_len"), "seq_len", as_text)
    pq.write_table(t, run_dir / "steps-000000.parquet")
    code, out, _ = _cli(capsys, tmp_path, "--select", "SA0")
    assert code == 1 and "column 'seq_len' has type string" in out


def test_unknown_schema_version_and_bad_json(tmp_path, capsys):
    run_dir, *_ = _write(tmp_path / "a")
    m = json.loads((run_dir / "run.json").read_text())
    m["schema_version"] = 99
    (run_dir / "run.json").write_text(json.dumps(m))
    code, out, _ = _cli(capsys, tmp_path / "a")
    assert "unknown schema_version 99" in out
    run_dir2, *_ = _write(tmp_path / "b")
    (run_dir2 / "run.json").write_text("{not json")
    code, out, _ = _cli(capsys, tmp_path / "b")
    assert "not JSON" in out and code == 1


def _mutate_rows(tmp_path, fn):
    run = FixtureRun.make("tree")
    fn(run.steps)
    return run.write(tmp_path)


def test_cycle_and_forward_parents(tmp_path):
    def fn(steps):
        p = steps[0]["parents"]
        p[2], p[3] = 3, 2
        steps[1]["parents"][1] = 1
    res = check_paths([_mutate_rows(tmp_path, fn)])
    msgs = [f.message for f in res.findings if f.code == "SA104"]
    assert len(msgs) == 2 and any("forward: a cycle" in m for m in msgs) and any("self-loop" in m for m in msgs)
    # the rows are hidden from deeper rules: one line each, no cascade on them
    bad_keys = {(f.request_id, f.step) for f in res.findings if f.code == "SA104"}
    assert not [f for f in res.findings if f.code[:3] in ("SA2", "SA3") and (f.request_id, f.step) in bad_keys]


def test_unequal_lists_and_too_many_nodes(tmp_path):
    def fn(steps):
        steps[0]["target_argmax"] = steps[0]["target_argmax"][:-1]
        s = steps[1]
        n = 5000
        s["node_tokens"] = [1] * n
        s["parents"] = list(range(-1, n - 1))
        s["positions"] = list(range(n))
        s["target_argmax"] = [1] * n
        s["draft_logprob"] = s["target_margin"] = None
    res = check_paths([_mutate_rows(tmp_path, fn)])
    assert res.counts["SA101"] == 1
    assert "row refused" in next(f.message for f in res.findings if f.code == "SA102")


def test_killed_run_is_checked_and_reported_incomplete(tmp_path, capsys):
    st, rq, m = synth_run_rows(6, seed=4, concurrency=2)
    m.pop("finished_at")
    m.pop("reported")
    write_run(tmp_path, st.slice(0, st.num_rows // 2), None, m)
    code, out, err = _cli(capsys, tmp_path)
    assert code == 0, out
    assert "incomplete" in out and "SA001" in out
    res = check_paths([tmp_path])
    assert res.incomplete_runs and res.exit_code == 0 and res.steps == st.num_rows // 2
    # a lie in the rows it holds is still found
    rows = st.slice(0, st.num_rows // 2).to_pylist()
    rows[0]["commit_len"] += 3
    shutil.rmtree(tmp_path / f"run_id={m['run_id']}")
    write_run(tmp_path, pa.Table.from_pylist(rows, schema=STEPS_SCHEMA), None, m)
    assert check_paths([tmp_path]).counts["SA306"] == 1


# ------------------------------------------------------------ CLI options

@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    d = tmp_path_factory.mktemp("faulty")
    run = FixtureRun.make("chain")
    for s in run.steps_where(lambda s: not s["finished"] and s["accepted_depth"] >= 1)[:5]:
        s["accepted_depth"], s["commit_len"] = 7, 2
    run.write(d)
    FixtureRun.make("tree", seed=3).write(d)
    return d


def test_select_ignore_statistics_exit_zero(faulty, capsys):
    code, out, _ = _cli(capsys, faulty, "--select", "SA3", "--statistics")
    assert code == 1
    lines = [ln for ln in out.splitlines() if ln.strip() and ln.split()[0][0].isdigit()]
    assert any("SA301" in ln and ln.split()[0] == "5" for ln in lines)
    assert all(ln.split()[1].startswith("SA3") for ln in lines)
    code, out, _ = _cli(capsys, faulty, "--ignore", "SA3,SA5,SA6")
    assert code == 0 and "No violations" in out
    code, out, _ = _cli(capsys, faulty, "--exit-zero")
    assert code == 0 and "SA301" in out


def test_text_groups_by_code_with_examples(faulty, capsys):
    code, out, _ = _cli(capsys, faulty, "--examples", "2")
    assert "SA301 commit-len-vs-depth (error): 5 findings" in out
    block = out.split("SA301 commit-len-vs-depth")[1].split("\n\n")[0].splitlines()
    assert sum(ln.startswith("  SA301 run fx-chain request") for ln in block) == 2
    assert "... and 3 more" in out
    assert out.strip().splitlines()[-1].startswith("Found ")


def test_output_file(faulty, capsys, tmp_path):
    target = tmp_path / "report.json"
    code, out, _ = _cli(capsys, faulty, "--output-format", "json", "-o", target)
    assert code == 1 and out == ""
    assert json.loads(target.read_text())["counts"]["SA301"] == 5


def test_json_format(faulty, capsys):
    _, out, _ = _cli(capsys, faulty, "--output-format", "json")
    doc = json.loads(out)
    assert doc["summary"]["runs"] == 2 and doc["summary"]["violations"] == sum(
        n for c, n in doc["counts"].items() if doc["rules"][c]["severity"] == "error")
    f = next(f for f in doc["findings"] if f["code"] == "SA301")
    assert {"code", "name", "severity", "message", "run_id", "request_id", "step", "values"} <= set(f)


def test_junit_format(faulty, capsys):
    _, out, _ = _cli(capsys, faulty, "--output-format", "junit")
    root = ET.fromstring(out.split("\n", 1)[1])
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == int(suite.get("tests")) > 40          # one test per rule run
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == int(suite.get("failures")) >= 1
    assert any(c.get("name").startswith("SA301") for c in failed)
    seed = next(c for c in failed if c.get("name").startswith("SA301"))
    assert "chain committed 2 tokens" in seed.find("failure").text


def test_github_format(faulty, capsys):
    _, out, _ = _cli(capsys, faulty, "--output-format", "github")
    ann = [ln for ln in out.splitlines() if ln.startswith("::")]
    assert ann and all(ln.startswith(("::error ", "::warning ", "::notice ")) for ln in ann)
    assert any("title=SA301 commit-len-vs-depth::run fx-chain request" in ln for ln in ann)


def test_sarif_format(faulty, capsys):
    _, out, _ = _cli(capsys, faulty, "--output-format", "sarif")
    doc = json.loads(out)
    assert doc["version"] == "2.1.0" and doc["$schema"].endswith("sarif-2.1.0.json")
    [run] = doc["runs"]
    rules = run["tool"]["driver"]["rules"]
    ids = [r["id"] for r in rules]
    assert len(ids) == len(set(ids)) and run["tool"]["driver"]["name"] == "specaudit"
    for r in rules:
        assert r["shortDescription"]["text"] and r["defaultConfiguration"]["level"] in ("error", "warning", "note")
    assert run["results"]
    for res in run["results"]:
        assert res["level"] in ("error", "warning", "note", "none")
        assert rules[res["ruleIndex"]]["id"] == res["ruleId"]
        assert res["message"]["text"]
        for loc in res.get("locations", []):
            if "physicalLocation" in loc:
                assert loc["physicalLocation"]["artifactLocation"]["uri"]
            for ll in loc.get("logicalLocations", []):
                assert ll["name"].startswith("run ")


def test_multi_partition_reported_from_one_rank(tmp_path):
    run = FixtureRun.make("chain")
    run_dir = run.write(tmp_path, n_files=3)
    first = pq.read_metadata(run_dir / "steps-000000.parquet").num_rows
    m = json.loads((run_dir / "run.json").read_text())
    m["reported"]["verify_steps"] = first
    (run_dir / "run.json").write_text(json.dumps(m))
    res = check_paths([tmp_path])
    msg = next(f.message for f in res.findings if f.code == "SA501")
    assert "steps-000000.parquet alone (one of 3 partitions read as the whole)" in msg


def test_conventions_honoured_and_named(tmp_path):
    st, rq, m = synth_run_rows(6, seed=5, conventions={"mean": "per_request", "accept_length": "excludes_bonus"})
    write_run(tmp_path / "ok", st, rq, m)
    assert check_paths([tmp_path / "ok"]).counts == {}
    m2 = json.loads(json.dumps(m))
    m2["conventions"] = {"mean": "pooled", "accept_length": "includes_bonus"}
    write_run(tmp_path / "bad", st, rq, m2)
    res = check_paths([tmp_path / "bad"])
    msgs = {f.code: f.message for f in res.findings}
    assert "is the per_request mean, but run.json declares conventions.mean = pooled" in msgs["SA602"]
    assert "matches excludes_bonus, per_request" in msgs["SA603"]
    assert "SA506" not in msgs and "SA507" not in msgs  # a convention mix-up, not a wrong count


def test_rules_command(capsys):
    assert cli(["rules"]) == 0
    out = capsys.readouterr().out
    assert "SA301  commit-len-vs-depth" in out and "SA6xx" in out
    assert cli(["rules", "SA301"]) == 0
    out = capsys.readouterr().out
    assert "What:" in out and "Why:" in out and "Message:" in out
    assert cli(["rules", "SA999"]) == 2
    assert "no rule" in capsys.readouterr().err
    assert cli(["rules", "--output-format", "json"]) == 0
    assert any(r["code"] == "SA202" for r in json.loads(capsys.readouterr().out))


def test_text_file_goes_to_the_source_readers(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("hello, this is not an engine log\n")
    code, out, err = _cli(capsys, f)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "notes.txt" in err


def test_diagnostic_lists_shapes(tmp_path):
    """draft_logprob / target_margin: skipped only when the metadata settles them."""
    run = FixtureRun.make("chain")
    run.steps[4]["draft_logprob"] = run.steps[4]["draft_logprob"][:-2]
    res = check_paths([run.write(tmp_path / "short")])
    assert "but draft_logprob has 6" in next(f.message for f in res.findings if f.code == "SA101")
    run = FixtureRun.make("tree")
    for s in run.steps:
        s["draft_logprob"] = None
    run.steps[2]["target_margin"] = None
    assert check_paths([run.write(tmp_path / "nulls")]).counts == {}
