"""specaudit query: the views, the canned queries (checked against numpy), the read-only lock,
output formats and the command line's bad-input paths."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import duckdb  # noqa: F401  (a core dependency: a missing one is an error, never a skip)
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ci import need

from specaudit.audit.findings import Finding
from specaudit.cli import main as cli_main
from specaudit.postmortem.canned import canned, canned_queries
from specaudit.postmortem.dataset import find_dataset
from specaudit.postmortem.shell import shell_setup_sql
from specaudit.postmortem.sql_guard import fetch_arrow
from specaudit.postmortem.tables import config_label, findings_table
from specaudit.postmortem.udfs import depths_udf
from specaudit.postmortem.view_sql import parquet_view
from specaudit.postmortem.views import connect
from specaudit.trace.schema import STEPS_SCHEMA, tree_depths

# ----------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def synth_ds(tmp_path_factory):
    """Contract-valid runs: a chain, a branching tree, a ragged tree and a tree of 81 nodes
    (past the 64-node bit-set fast path of the nodes view and the calibration query)."""
    from specaudit.trace.synth import synth_run_rows, write_run
    out = tmp_path_factory.mktemp("qsynth")
    runs = {}
    for kw in (dict(algo="chain", budget=7, seed=1, run_id="chainA", concurrency=1),
               dict(algo="tree", budget=12, topk=3, seed=2, run_id="treeB", concurrency=4),
               dict(algo="tree", budget=9, topk=2, seed=3, run_id="raggedC", ragged=True, concurrency=2),
               dict(algo="tree", budget=80, topk=2, seed=4, run_id="bigD", concurrency=1, n_requests=3)):
        kw.setdefault("n_requests", 12)
        steps, reqs, man = synth_run_rows(max_new_tokens=40, **kw)
        write_run(out, steps, reqs, man, n_files=2)
        runs[kw["run_id"]] = (steps, reqs, man)
    return out, runs


@pytest.fixture(scope="module")
def con(synth_ds):
    c = connect([synth_ds[0]], threads=2)
    yield c
    c.close()


def all_steps(runs) -> pa.Table:
    return pa.concat_tables([s for s, _, _ in runs.values()])


def label(man) -> str:
    return config_label(man["config"])


def run_cli(argv, capsys):
    rc = cli_main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def tree_files(root: Path) -> dict:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


# -------------------------------------------------------------------------- views

def test_views_hold_every_row(con, synth_ds):
    _, runs = synth_ds
    steps = all_steps(runs)
    assert fetch_arrow(con, "SELECT count(*) FROM steps").column(0)[0].as_py() == steps.num_rows
    n_req = sum(r.num_rows for _, r, _ in runs.values())
    assert fetch_arrow(con, "SELECT count(*) FROM requests").column(0)[0].as_py() == n_req
    n_nodes = sum(len(x) for x in steps.column("node_tokens").to_pylist())
    assert fetch_arrow(con, "SELECT count(*) FROM nodes").column(0)[0].as_py() == n_nodes
    got = {r["run_id"]: r for r in fetch_arrow(con, "SELECT * FROM runs").to_pylist()}
    assert set(got) == set(runs)
    for rid, (_, _, man) in runs.items():
        assert got[rid]["config"] == label(man)
        assert got[rid]["reported_mean_commit_len"] == pytest.approx(man["reported"]["mean_commit_len"])
        assert json.loads(got[rid]["manifest"])["run_id"] == rid
        assert got[rid]["complete"] is True and got[rid]["step_files"] == 2
    assert fetch_arrow(con, "SELECT count(*) FROM violations").column(0)[0].as_py() == 0


def test_nodes_view_matches_numpy(con, synth_ds):
    """depth from parents, accepted = on the accepted path, parent_accepted = reached."""
    _, runs = synth_ds
    want = {}
    for steps, _, _ in runs.values():
        for r in steps.to_pylist():
            par = np.array(r["parents"])
            depth = tree_depths(par[None])[0]
            path = set(r["accepted_path"])
            for i, tok in enumerate(r["node_tokens"]):
                want[(r["run_id"], r["request_id"], r["step"], i)] = (
                    int(depth[i]), tok, int(par[i]), r["positions"][i], r["target_argmax"][i],
                    i in path, None if i == 0 else (int(par[i]) in path))
    got = fetch_arrow(con, "SELECT run_id, request_id, step, node, depth, token, parent, position, "
                             "target_argmax, accepted, parent_accepted FROM nodes").to_pylist()
    assert len(got) == len(want)
    for g in got:
        key = (g["run_id"], g["request_id"], g["step"], g["node"])
        assert want[key] == (g["depth"], g["token"], g["parent"], g["position"], g["target_argmax"],
                             g["accepted"], g["parent_accepted"]), key


def test_depths_udf_edge_cases():
    arr = pa.array([[-1, 0, 0, 1, 3], [-1, 0, 5, 1], None, [-1, -1, 0], [], [-1, 0, 1, 2]],
                   pa.list_(pa.int32()))
    assert depths_udf(arr).to_pylist() == [[0, 1, 1, 2, 3], [0, 1, None, 2], None,
                                             [0, None, 1], [], [0, 1, 2, 3]]
    # a sliced array (non-zero offset) keeps row boundaries
    assert depths_udf(arr.slice(3, 3)).to_pylist() == [[0, None, 1], [], [0, 1, 2, 3]]


def test_shell_setup_sql_gives_the_same_views_and_lock(synth_ds, con):
    """The duckdb CLI's setup (run here in Python duckdb) builds the same views, locked."""
    c = duckdb.connect()
    for stmt in c.extract_statements(shell_setup_sql([synth_ds[0]], [_finding("SA301", "x")])):
        c.execute(stmt.query)
    for v in ("steps", "requests", "nodes"):
        n = c.execute(f"SELECT count(*) FROM {v}").fetchone()[0]
        assert n == fetch_arrow(con, f"SELECT count(*) FROM {v}").column(0)[0].as_py()
    a = c.execute("SELECT sum(depth), count(*) FILTER (WHERE accepted) FROM nodes").fetchone()
    b = fetch_arrow(con, "SELECT sum(depth), count(*) FILTER (WHERE accepted) FROM nodes").to_pylist()[0]
    assert [int(x) for x in a] == [int(x) for x in b.values()]
    assert c.execute("SELECT code FROM violations").fetchall() == [("SA301",)]
    # the older-CLI depth expression (pointer doubling) agrees with the UDF
    c2 = duckdb.connect()
    for stmt in c2.extract_statements(shell_setup_sql([synth_ds[0]], duckdb_major=1)):
        c2.execute(stmt.query)
    d1 = c2.execute("SELECT list(depth ORDER BY run_id, request_id, step, node) FROM nodes").fetchone()[0]
    d2 = fetch_arrow(con, "SELECT list(depth ORDER BY run_id, request_id, step, node) FROM nodes")
    assert d1 == d2.column(0)[0].as_py()
    with pytest.raises(duckdb.Error, match="locked"):
        c.execute("SET enable_external_access = true")
    with pytest.raises(duckdb.Error, match="disabled"):
        c.execute("SELECT * FROM read_text('/etc/hostname')")


# ----------------------------------------------------------------- canned queries

def test_every_canned_query_is_documented_and_its_columns_are_what_it_says(con):
    qs = canned_queries()
    assert {"acceptance_by_depth", "commit_length_histogram", "acceptance_vs_draft_logprob",
            "request_acceptance_spread", "throughput_over_time", "violations_by_code",
            "a_vs_b", "latency_breakdown"} <= set(qs)
    for name, q in qs.items():
        for part in ("What:", "Why:", "Example:", "Columns:"):
            assert part in q.doc, (name, part)
        cols = re.search(r"Columns:(.*?)(?:\n\n|$)", q.doc, re.DOTALL).group(1)
        want = [c.strip() for c in cols.replace("\n", " ").split(",") if c.strip()]
        got = fetch_arrow(con, q.sql).column_names
        assert got == want, name


def test_acceptance_by_depth_matches_numpy(con, synth_ds):
    _, runs = synth_ds
    rows = fetch_arrow(con, canned("acceptance_by_depth").sql).to_pylist()
    for steps, _, man in runs.values():
        d = np.array([len(p) - 1 for p in steps.column("accepted_path").to_pylist()])
        mine = [r for r in rows if r["config"] == label(man)]
        assert [r["depth"] for r in mine] == list(range(1, d.max() + 1))
        for r in mine:
            assert r["steps"] == len(d)
            assert r["steps_reaching"] == int((d >= r["depth"]).sum())
            assert r["conditional_rate"] == pytest.approx((d >= r["depth"]).sum() / (d >= r["depth"] - 1).sum())
        # the identity the report leans on: sum of reach rates = mean accepted depth
        assert sum(r["reach_rate"] for r in mine) == pytest.approx(d.mean())
        assert mine[0]["mean_accepted_depth"] == pytest.approx(man["reported"]["mean_accepted_depth"])


def test_commit_length_histogram_matches_numpy(con, synth_ds):
    _, runs = synth_ds
    rows = fetch_arrow(con, canned("commit_length_histogram").sql).to_pylist()
    for steps, _, man in runs.values():
        cl = np.array([len(x) for x in steps.column("committed_tokens").to_pylist()])   # derived, not the counter
        mine = {r["commit_len"]: r for r in rows if r["config"] == label(man)}
        vals, counts = np.unique(cl, return_counts=True)
        assert {int(v): int(c) for v, c in zip(vals, counts)} == {k: r["steps"] for k, r in mine.items()}
        assert sum(r["share"] for r in mine.values()) == pytest.approx(1.0)
        assert sum(r["finished_steps"] for r in mine.values()) == int(np.sum(steps.column("finished").to_numpy()))
        assert all(r["counter_disagrees"] == 0 for r in mine.values())
        assert all(r["reported_mean_commit_len"] == r["commit_len"] for r in mine.values())


def _reached_accepted(steps: pa.Table, bins: int):
    """numpy reference for acceptance_vs_draft_logprob: per bin (reached, accepted)."""
    reached, acc = np.zeros(bins, int), np.zeros(bins, int)
    for r in steps.to_pylist():
        path = set(r["accepted_path"])
        for i in range(1, len(r["parents"])):
            if r["parents"][i] in path:
                # the float32 value widened to double, as DuckDB does before exp()
                b = min(int(np.floor(np.exp(float(r["draft_logprob"][i])) * bins)), bins - 1)
                reached[b] += 1
                acc[b] += i in path
    return reached, acc


@pytest.mark.parametrize("bins", [10, 7])
def test_calibration_matches_numpy_for_chains_and_trees(synth_ds, bins):
    ds, runs = synth_ds
    c = connect([ds], variables={"bins": bins})
    rows = fetch_arrow(c, canned("acceptance_vs_draft_logprob").sql).to_pylist()
    c.close()
    for steps, _, man in runs.values():
        reached, acc = _reached_accepted(steps, bins)
        mine = {r["bin"]: r for r in rows if r["config"] == label(man)}
        assert {b: (r["reached"], r["accepted"]) for b, r in mine.items()} == \
            {b: (int(reached[b]), int(acc[b])) for b in range(bins) if reached[b]}
        for r in mine.values():
            assert r["p_lo"] <= r["mean_draft_p"] <= r["p_hi"] + 1e-6


def test_request_spread_and_over_time_and_latency_match_numpy(con, synth_ds):
    _, runs = synth_ds
    spread = {r["config"]: r for r in fetch_arrow(con, canned("request_acceptance_spread").sql).to_pylist()}
    over = fetch_arrow(con, canned("throughput_over_time").sql).to_pylist()
    lat = {r["config"]: r for r in fetch_arrow(con, canned("latency_breakdown").sql).to_pylist()}
    for steps, _, man in runs.values():
        cl = np.array([len(x) for x in steps.column("committed_tokens").to_pylist()])   # derived, not the counter
        req = np.array(steps.column("request_id").to_pylist())
        per_req = [cl[req == q].mean() for q in np.unique(req)]
        s = spread[label(man)]
        assert s["requests"] == len(per_req)
        assert s["pooled_mean_commit_len"] == pytest.approx(cl.mean())
        assert s["per_request_mean_commit_len"] == pytest.approx(np.mean(per_req))
        assert s["min_commit_len"] == pytest.approx(min(per_req))
        assert s["median_commit_len"] == pytest.approx(np.median(per_req))
        mine = [r for r in over if r["run_id"] == man["run_id"]]
        assert len(mine) <= 60 and sum(r["steps"] for r in mine) == len(cl)
        assert sum(r["committed_tokens"] for r in mine) == int(cl.sum())
        t = lat[label(man)]
        assert t["mean_draft_s"] == pytest.approx(steps.column("draft_s").to_numpy().mean())
        assert t["draft_share"] + t["verify_share"] + t["other_share"] == pytest.approx(1.0)


def test_a_vs_b(synth_ds):
    ds, runs = synth_ds
    chain, tree = runs["chainA"], runs["treeB"]
    c = connect([ds], variables={"a": "chainA", "b": label(tree[2])})
    rows = {r["metric"]: r for r in fetch_arrow(c, canned("a_vs_b").sql).to_pylist()}
    c.close()
    for side, (steps, reqs, _) in (("a", chain), ("b", tree)):
        drafted = sum(len(x) - 1 for x in steps.column("node_tokens").to_pylist())
        accepted = sum(len(x) - 1 for x in steps.column("accepted_path").to_pylist())
        assert rows["steps"][side] == steps.num_rows
        assert rows["requests"][side] == reqs.num_rows
        assert rows["accept_rate"][side] == pytest.approx(accepted / drafted)
        assert rows["mean_commit_len"][side] == pytest.approx(
            np.mean([len(x) for x in steps.column("committed_tokens").to_pylist()]))
        assert rows["mean_commit_len"][f"{side}_verdict"] == "agrees"   # a clean synthetic run
    r = rows["mean_commit_len"]
    assert r["b_minus_a"] == pytest.approx(r["b"] - r["a"]) and r["b_over_a"] == pytest.approx(r["b"] / r["a"])
    assert r["a_runs"] == "chainA" and r["b_runs"] == "treeB"
    c = connect([ds], variables={"a": "nope"})
    with pytest.raises(ValueError, match="no run_id or config named nope"):
        fetch_arrow(c, canned("a_vs_b").sql)
    c.close()


def _finding(code, msg, sev="error", **kw):
    return Finding(code=code, name=f"rule-{code}", severity=sev, message=msg, **kw)


def test_violations_view_and_by_code(synth_ds):
    fs = [_finding("SA301", "a", run_id="chainA", request_id="0", step=3, values={"x": 1.5}),
          _finding("SA301", "b", run_id="chainA", request_id="1", step=4),
          _finding("SA506", "c", run_id="treeB"),
          _finding("SA001", "d", sev="info", run_id="treeB")]
    c = connect([synth_ds[0]], fs)
    rows = fetch_arrow(c, canned("violations_by_code").sql).to_pylist()
    v = fetch_arrow(c, "SELECT * FROM violations WHERE step = 3").to_pylist()
    c.close()
    assert [(r["code"], r["findings"], r["runs"], r["requests"]) for r in rows] == \
        [("SA301", 2, 1, 2), ("SA506", 1, 1, 0), ("SA001", 1, 1, 0)]
    assert json.loads(v[0]["values"]) == {"x": 1.5}
    # dicts and Arrow tables work as well as Finding objects
    t = findings_table([f.to_dict() for f in fs])
    assert findings_table(t).to_pylist() == t.to_pylist() and t.num_rows == 4


# -------------------------------------------------------------- read-only, offline

REFUSALS = [
    ("COPY steps TO '{out}/x.csv'", "COPY"),
    ("COPY (SELECT 1) TO '{trace}' (USE_TMP_FILE false)", "COPY"),
    ("SELECT 1; COPY (SELECT 1) TO '{out}/y.csv'", "COPY"),
    ("EXPORT DATABASE '{out}/exp'", "EXPORT"),
    ("ATTACH '{out}/db.duckdb' AS x", "ATTACH"),
    ("ATTACH '{trace}' AS z", "ATTACH"),
    ("INSTALL httpfs", "INSTALL/LOAD"),
    ("LOAD httpfs", "INSTALL/LOAD"),
    ("FORCE INSTALL spatial FROM 'http://127.0.0.1:9/x'", "INSTALL/LOAD"),
    ("UPDATE EXTENSIONS", "not allowed"),
    ("SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')", "read-only, offline"),
    ("SELECT * FROM read_parquet('https://example.com/x.parquet')", "read-only, offline"),
    ("SELECT * FROM read_text('/etc/hostname')", "read-only, offline"),
    ("SELECT * FROM read_json('{runjson}')", "read-only, offline"),
    ("SELECT * FROM glob('{out}/*')", "read-only, offline"),
    ("SET enable_external_access = true", "locked"),
    ("SET lock_configuration = false", "locked"),
    ("RESET enable_external_access", "locked"),
    ("SET allowed_directories = ['/']", "locked"),
    ("SET autoinstall_known_extensions = true", "locked"),
    ("SET temp_directory = '{out}/tmp'", "locked"),
    ("PRAGMA enable_profiling = 'json'", "locked"),
    ("CREATE PERSISTENT SECRET s (TYPE s3, KEY_ID 'k', SECRET 'v')", "no extensions"),
    ("SELECT * FROM read_xlsx('{out}/a.xlsx')", "refused"),
    ("SELECT ST_Point(1, 2)", "refused"),
    ("PREPARE p AS SELECT 1", "PREPARE"),
]


@pytest.fixture()
def own_copy(synth_ds, tmp_path):
    """A private copy of the dataset, so a refused write can be proven not to have happened."""
    ds = tmp_path / "ds"
    shutil.copytree(synth_ds[0], ds)
    out = tmp_path / "out"
    out.mkdir()
    return ds, out


@pytest.mark.parametrize("sql,why", REFUSALS, ids=[r[0][:40] for r in REFUSALS])
def test_writes_network_and_extensions_are_refused(own_copy, capsys, sql, why):
    ds, out = own_copy
    trace = sorted(ds.rglob("steps-*.parquet"))[0]
    sql = sql.format(out=out, trace=trace, runjson=sorted(ds.rglob("run.json"))[0])
    before = tree_files(ds.parent)
    rc, stdout, err = run_cli(["query", str(ds), sql, "--no-check"], capsys)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specaudit query: error: ") and why in lines[0], err
    assert "Traceback" not in err and stdout == ""
    assert tree_files(ds.parent) == before          # nothing written, the trace untouched


def test_in_memory_tables_are_allowed_and_stay_in_memory(own_copy, capsys):
    ds, out = own_copy
    before = tree_files(ds.parent)
    rc, stdout, _ = run_cli(["query", str(ds), "--no-check", "--output-format", "csv",
                             "CREATE TABLE t AS SELECT run_id, count(*) AS n FROM steps GROUP BY ALL; "
                             "SELECT sum(n) AS n FROM t"], capsys)
    assert rc == 0 and stdout.splitlines()[1] == str(fetch_arrow(
        connect([ds]), "SELECT count(*) FROM steps").column(0)[0].as_py())
    assert tree_files(ds.parent) == before


def test_unreadable_files_are_left_out_and_named(own_copy, capsys):
    """A truncated Parquet file and one with a wrongly typed column: the rest stays queryable."""
    ds, _ = own_copy
    files = sorted(ds.rglob("steps-*.parquet"))
    good = fetch_arrow(connect([ds]), "SELECT count(*) FROM steps").column(0)[0].as_py()
    lost = pq.read_metadata(files[0]).num_rows + pq.read_metadata(files[1]).num_rows
    files[0].write_bytes(files[0].read_bytes()[:300])
    t = pq.read_table(files[1])
    pq.write_table(t.set_column(t.schema.get_field_index("commit_len"), "commit_len",
                                t.column("commit_len").cast(pa.string())), files[1])
    rc, out, err = run_cli(["query", str(ds), "SELECT count(*) AS n FROM steps", "--output-format", "csv",
                            "--no-check"], capsys)
    assert rc == 0 and int(out.splitlines()[1]) == good - lost
    warn = [ln for ln in err.splitlines() if "warning: left out" in ln]
    assert len(warn) == 2 and files[0].name in warn[0] + warn[1] and "commit_len" in warn[0] + warn[1]
    rc, out, _ = run_cli(["query", str(ds), "SELECT problems FROM runs WHERE problems IS NOT NULL",
                          "--output-format", "json", "--no-check"], capsys)
    assert rc == 0 and "not readable Parquet" in out and "has type string" in out


# --------------------------------------------------------------------- command

def test_list_and_show(capsys):
    rc, out, _ = run_cli(["query", "--list"], capsys)
    assert rc == 0
    for name, q in canned_queries().items():
        assert re.search(rf"^{name}\s+{re.escape(q.title)}$", out, re.MULTILINE)
    assert "--param bins=" in out and "--param a=" in out
    rc, out, _ = run_cli(["query", "--show", "acceptance-by-depth"], capsys)
    assert rc == 0 and out.startswith("-- Acceptance rate by depth") and "FROM rollup_hist" in out


def test_bad_input_is_one_line_exit_2(synth_ds, capsys, tmp_path):
    ds = str(synth_ds[0])
    cases = [
        (["query", ds, "no_such_query"], "unknown canned query 'no_such_query'; known: a_vs_b, "),
        (["query", ds, "SELECT * FRM steps"], "SQL error: Parser Error: syntax error"),
        (["query", ds, "SELECT nope FROM steps"], "SQL error: Binder Error"),
        (["query", ds, "SELECT * FROM no_table"], "SQL error: Catalog Error"),
        (["query", ds, "a_vs_b", "--param", "zz=1"], "has no parameter 'zz' (its parameters: a, b)"),
        (["query", ds, "a_vs_b", "--param", "a"], "expected KEY=VALUE"),
        (["query", ds, "a_vs_b", "--param", "a=nope"], "no run_id or config named nope"),
        (["query", ds, "SELECT 1", "--output-format", "parquet"], "needs -o FILE"),
        (["query", str(tmp_path / "missing"), "SELECT 1"], "no such file or folder"),
        (["query", str(tmp_path), "SELECT 1"], "no trace runs found"),
        (["query", "SELECT 1 FROM steps"], "give the dataset path first"),
        (["query"], "give a dataset path"),
        (["query", ds, "SELECT 1", "-o", str(tmp_path / "nodir" / "x.csv")], "does not exist"),
    ]
    for argv, msg in cases:
        rc, out, err = run_cli(argv, capsys)
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and msg in lines[0], (argv, err)
        assert "Traceback" not in err


def test_multi_line_duckdb_error_becomes_one_line(synth_ds, capsys):
    rc, _, err = run_cli(["query", str(synth_ds[0]), "SELECT *\nFROM steps\nWHERE nope = 1"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert 'Referenced column "nope" not found' in err and " | Candidate bindings" in err
    rc, _, err = run_cli(["query", str(synth_ds[0]), "SELECT *\nFRM steps"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "syntax error" in err and " | LINE 2: FRM steps" in err


def test_output_formats_agree(synth_ds, capsys, tmp_path):
    ds = str(synth_ds[0])
    sql = ("SELECT run_id, request_id, step, commit_len, draft_s, node_tokens, finished FROM steps "
           "ORDER BY run_id, request_id, step")
    ref = fetch_arrow(connect([ds]), sql).to_pylist()
    rc, out, _ = run_cli(["query", ds, sql, "--output-format", "csv"], capsys)
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == len(ref)
    assert [(r["run_id"], int(r["step"]), float(r["draft_s"]), json.loads(r["node_tokens"]), r["finished"])
            for r in rows] == [(r["run_id"], r["step"], r["draft_s"], r["node_tokens"], str(r["finished"]))
                               for r in ref]
    rc, out, _ = run_cli(["query", ds, sql, "--output-format", "json"], capsys)
    assert rc == 0 and json.loads(out) == ref
    pqf = tmp_path / "r.parquet"
    rc, out, err = run_cli(["query", ds, sql, "--output-format", "parquet", "-o", str(pqf)], capsys)
    assert rc == 0 and out == "" and f"wrote {pqf}" in err
    assert pq.read_table(pqf).to_pylist() == ref
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temp file left
    rc, out, _ = run_cli(["query", ds, sql, "--max-rows", "5"], capsys)
    lines = out.splitlines()
    assert rc == 0 and lines[0].split() == ["run_id", "request_id", "step", "commit_len", "draft_s",
                                            "node_tokens", "finished"]
    assert len(lines) == 2 + 5 + 1 and f"({len(ref)} rows; {len(ref) - 5} not shown" in lines[-1]
    # JSON keeps NULL/NaN as null, CSV leaves NULL empty
    rc, out, _ = run_cli(["query", ds, "SELECT NULL::INTEGER AS a, 'nan'::DOUBLE AS b, [1, 2] AS c",
                          "--output-format", "json"], capsys)
    assert json.loads(out) == [{"a": None, "b": None, "c": [1, 2]}]


def test_output_refuses_the_traces_own_files(own_copy, capsys):
    ds, _ = own_copy
    trace = sorted(ds.rglob("steps-*.parquet"))[0]
    before = tree_files(ds)
    for target in (trace, trace.parent / "new.csv"):
        rc, _, err = run_cli(["query", str(ds), "SELECT 1 AS x", "-o", str(target), "--output-format", "csv"],
                             capsys)
        assert rc == 2 and "-o" in err and len(err.strip().splitlines()) == 1
    assert tree_files(ds) == before


def test_violations_view_runs_the_checker_only_when_named(synth_ds, capsys, monkeypatch):
    import specaudit.commands.query as cq
    calls = []

    def fake_checker(paths):
        calls.append(paths)
        return [_finding("SA999", "boom", run_id="chainA")], {}
    monkeypatch.setattr(cq, "run_checker", fake_checker)
    rc, out, _ = run_cli(["query", str(synth_ds[0]), "SELECT count(*) AS n FROM steps"], capsys)
    assert rc == 0 and not calls
    rc, out, _ = run_cli(["query", str(synth_ds[0]), "violations_by_code", "--output-format", "json"], capsys)
    assert rc == 0 and len(calls) == 1 and json.loads(out)[0]["code"] == "SA999"
    rc, out, _ = run_cli(["query", str(synth_ds[0]), "violations_by_code", "--no-check",
                          "--output-format", "json"], capsys)
    assert rc == 0 and len(calls) == 1 and json.loads(out) == []


def test_real_checker_feeds_the_violations_view(tmp_path, capsys):
    """A run whose reported counter lies: the checker's error shows up in violations_by_code."""
    from specaudit.trace.synth import synth_run_rows, write_run
    steps, reqs, man = synth_run_rows(6, algo="chain", budget=7, seed=5, run_id="liar")
    man["reported"]["mean_accepted_depth"] = 7.0
    write_run(tmp_path, steps, reqs, man)
    rc, out, err = run_cli(["query", str(tmp_path), "violations_by_code", "--output-format", "json"], capsys)
    assert rc == 0, err
    rows = json.loads(out)
    assert rows and rows[0]["severity"] == "error" and "7" in rows[0]["example"]


# -------------------------------------------------------------- interactive shell

def test_shell_without_duckdb_cli_is_a_clear_error(synth_ds, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    rc, _, err = run_cli(["query", str(synth_ds[0])], capsys)
    assert rc == 2 and "duckdb CLI is not installed" in err and len(err.strip().splitlines()) == 1


def test_shell_launches_the_cli_locked(synth_ds, capsys, monkeypatch, tmp_path):
    """A stand-in `duckdb` records how it is started: an init file with the views, then safe mode."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "argv.json"
    fake = bindir / "duckdb"
    fake.write_text(f"""#!{sys.executable}
import json, sys
argv = sys.argv[1:]
if "-c" in argv:                      # the safe-mode probe
    print("false,true")
    sys.exit(0)
if "-init" in argv:
    setup = open(argv[argv.index("-init") + 1]).read()
else:
    setup = argv[argv.index("-cmd") + 1]
json.dump({{"argv": argv, "setup": setup}}, open({str(log)!r}, "w"))
sys.exit(7)
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    rc, _, err = run_cli(["query", str(synth_ds[0]), "--no-check"], capsys)
    assert rc == 7                                   # the shell's own exit status
    got = json.loads(log.read_text())
    assert got["argv"][:2] == ["-no-init", "-cmd"] and got["argv"][-2:] == ["-cmd", ".safe_mode"]
    assert "CREATE VIEW steps" in got["setup"] and "CREATE VIEW nodes" in got["setup"]
    assert "SET allowed_paths" in got["setup"] and "autoinstall_known_extensions = false" in got["setup"]
    # a setup too large for one argument goes through a private init file, removed afterwards
    import specaudit.postmortem.shell as shell
    monkeypatch.setattr(shell, "SETUP_ARG_MAX", 100)
    rc, _, _ = run_cli(["query", str(synth_ds[0]), "--no-check"], capsys)
    got2 = json.loads(log.read_text())
    assert rc == 7 and got2["setup"] == got["setup"] and got2["argv"][-2:] == ["-cmd", ".safe_mode"]
    assert not Path(got2["argv"][got2["argv"].index("-init") + 1]).exists()


def test_shell_refuses_a_cli_that_cannot_lock(synth_ds, capsys, monkeypatch, tmp_path):
    fake = tmp_path / "duckdb"
    fake.write_text(f"#!{sys.executable}\nprint('true,false')\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    rc, _, err = run_cli(["query", str(synth_ds[0]), "--no-check"], capsys)
    assert rc == 2 and "cannot lock itself" in err


def _real_cli():
    cli = shutil.which("duckdb")
    if not cli:
        return None
    r = subprocess.run([cli, "-version"], capture_output=True, text=True)
    return cli if r.returncode == 0 and r.stdout.startswith("v") else None


@need(_real_cli() is not None, "the duckdb CLI is not installed (pip install duckdb-cli, in the test extra)")
def test_real_duckdb_shell(own_copy, tmp_path):
    """Statements piped into the real shell: views answer, files and settings stay locked."""
    ds, out = own_copy
    before = tree_files(ds)
    script = (f"SELECT 'n=' || count(*) FROM steps;\n"
              f"SELECT 'lock=' || current_setting('lock_configuration') || ',auto=' || "
              f"current_setting('autoinstall_known_extensions');\n"
              f"SELECT 'd=' || sum(depth) FROM nodes;\n"
              f"SELECT * FROM read_text('/etc/hostname');\n"
              f"COPY (SELECT 1) TO '{out}/x.csv';\n"
              f"SET enable_external_access = true;\n"
              f".shell touch {out}/shell\n")
    r = subprocess.run([sys.executable, "-m", "specaudit", "query", str(ds), "--no-check"], input=script,
                       capture_output=True, text=True, timeout=120)
    con = connect([ds])
    n = fetch_arrow(con, "SELECT count(*) FROM steps").column(0)[0].as_py()
    d = int(fetch_arrow(con, "SELECT sum(depth) FROM nodes").column(0)[0].as_py())
    assert f"n={n}" in r.stdout and f"d={d}" in r.stdout, r.stdout + r.stderr
    assert "lock=true,auto=false" in r.stdout
    assert "disabled" in r.stderr or "Permission" in r.stderr
    assert list(out.iterdir()) == [] and tree_files(ds) == before


# -------------------------------------------------------------- real traces

def test_views_on_real_runs(clean_dataset):
    """The embedded models' runs (chain, topk-1 tree, branching trees, EOS, concurrency 4):
    on clean traces a node's depth from parents equals its position minus seq_len (rule 3),
    and the accepted nodes add up to the accepted depths."""
    ds, results = clean_dataset
    con = connect([ds])
    bad = fetch_arrow(con, "SELECT count(*) FROM nodes WHERE depth IS DISTINCT FROM position - seq_len")
    assert bad.column(0)[0].as_py() == 0
    a = fetch_arrow(con, "SELECT run_id, count(*) FILTER (WHERE accepted AND node > 0) AS n "
                           "FROM nodes GROUP BY run_id ORDER BY run_id").to_pylist()
    b = fetch_arrow(con, "SELECT run_id, sum(accepted_depth) AS n FROM steps GROUP BY run_id "
                           "ORDER BY run_id").to_pylist()
    assert [(r["run_id"], r["n"]) for r in a] == [(r["run_id"], int(r["n"])) for r in b]
    runs = {r["run_id"]: r for r in fetch_arrow(con, "SELECT * FROM runs").to_pylist()}
    for res in results:
        assert runs[res.run_id]["config"] == config_label(res.manifest["config"])
        assert runs[res.run_id]["reported_verify_steps"] == res.manifest["reported"]["verify_steps"]
    # every canned query answers on real traces
    for q in canned_queries().values():
        fetch_arrow(con, q.sql)
    con.close()


def test_steps_view_binds_one_footer_when_columns_agree_and_unions_by_name_otherwise(tmp_path):
    """Files with the same columns: read_parquet without union_by_name (DuckDB binds the
    view from one footer); a file with extra (contract v2) columns: union_by_name, the
    other files' rows padded with NULL."""
    from specaudit.trace.schema import SAMPLING_FIELDS
    from specaudit.trace.synth import synth_run_rows, write_run
    s, r, m = synth_run_rows(6, algo="chain", seed=1, run_id="same")
    write_run(tmp_path, s, r, m, n_files=2)
    ds = find_dataset([tmp_path])
    assert ds.same_columns(ds.step_files) and "union_by_name = false" in parquet_view(
        "steps", ds.step_files, STEPS_SCHEMA, ds)
    s2, r2, m2 = synth_run_rows(4, algo="chain", seed=2, run_id="v2")
    f = SAMPLING_FIELDS[0]
    s2 = s2.append_column(f, pa.nulls(s2.num_rows, f.type))
    write_run(tmp_path, s2, r2, m2)
    ds = find_dataset([tmp_path])
    assert not ds.same_columns(ds.step_files)
    con = connect([tmp_path])
    try:
        got = fetch_arrow(con, f"SELECT run_id, count(*) AS n, count({f.name}) AS k FROM steps GROUP BY ALL "
                                 "ORDER BY run_id").to_pylist()
    finally:
        con.close()
    assert got == [{"run_id": "same", "n": s.num_rows, "k": 0}, {"run_id": "v2", "n": s2.num_rows, "k": 0}]
