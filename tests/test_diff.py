"""`specaudit diff` on hand-built contract datasets: alignment, classes, conventions, bad input."""
from __future__ import annotations

import copy
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specaudit.audit.diff import CLASSES, EXPLAIN, diff_runs
from specaudit.cli import main
from specaudit.trace.safe_io import InputError
from specaudit.trace.schema import REQUESTS_SCHEMA, STEPS_SCHEMA, mask_hash_from_parents

EOS = 0


def chain_step(rid, step, seq_len, nodes, argmax, *, finished=False, limit=None):
    """One contract-correct chain step: greedy path, commit = accepted drafts + bonus."""
    n = len(nodes)
    parents = [-1] + list(range(n - 1))
    path = [0]
    while path[-1] + 1 < n and argmax[path[-1]] == nodes[path[-1] + 1]:
        path.append(path[-1] + 1)
    commit = [nodes[i] for i in path[1:]] + [argmax[path[-1]]]
    if limit is not None:
        commit = commit[:limit]
    return {
        "run_id": "x", "request_id": rid, "step": step, "algo": "chain", "budget": n - 1, "topk": 1,
        "batch_size": 1, "seq_len": seq_len, "node_tokens": list(nodes), "parents": parents,
        "positions": [seq_len + i for i in range(n)], "mask_hash": mask_hash_from_parents(parents),
        "draft_logprob": [0.0] + [-0.5] * (n - 1), "target_argmax": list(argmax),
        "target_margin": [2.0] * n, "accepted_path": path, "accepted_depth": len(path) - 1,
        "commit_len": len(commit), "committed_tokens": commit, "finished": finished,
        "t_start": 1.0 + step, "draft_s": 0.01, "verify_s": 0.02, "step_s": 0.04,
    }


def base_requests():
    """Two requests of three chain steps each (budget 3), plus their request rows."""
    steps, reqs = [], []
    for rid, prompt, first in (("0", [72, 105, 33], 50), ("1", [65, 66], 60)):
        seq, root, out = len(prompt), first, [first]
        plan = [([11, 12, 99], [11, 12, 13, 14]),   # accepts 2 drafts, bonus 13
                ([21, 22, 23], [21, 22, 23, 24]),   # accepts all 3, bonus 24
                ([31, 32, 33], [77, 1, 1, 1])]      # accepts none, bonus 77
        for s, (drafts, argmax) in enumerate(plan):
            row = chain_step(rid, s, seq, [root] + drafts, argmax, finished=s == len(plan) - 1)
            steps.append(row)
            out += row["committed_tokens"]
            seq += len(row["accepted_path"])
            root = row["committed_tokens"][-1]
        reqs.append({"run_id": "x", "request_id": rid, "prompt_tokens": prompt, "first_token": first,
                     "output_tokens": out, "finish_reason": "length", "reference_tokens": None,
                     "ttft_s": 0.1, "e2e_s": 1.0})
    return steps, reqs


def write_run(root, run_id, steps, reqs, *, manifest=None, step_schema=STEPS_SCHEMA, drop=()):
    d = root / f"run_id={run_id}"
    d.mkdir(parents=True)
    m = {"schema_version": 1, "run_id": run_id, "engine": {"name": "hand-built", "version": "0"},
         "models": {}, "config": {"algo": "chain", "budget": 3, "topk": 1, "concurrency": 1},
         "host": {}, "started_at": 1.0, "finished_at": 2.0,
         "reported": {"mean_accepted_depth": 1.67, "mean_commit_len": 2.67}}
    m.update(manifest or {})
    (d / "run.json").write_text(json.dumps(m))
    schema = pa.schema([f for f in step_schema if f.name not in drop])
    rows = [{k: v for k, v in r.items() if k not in drop} for r in steps]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), d / "steps-000000.parquet")
    if reqs is not None:
        pq.write_table(pa.Table.from_pylist(reqs, schema=REQUESTS_SCHEMA), d / "requests.parquet")
    return d


@pytest.fixture
def pair(tmp_path):
    """(A folder, writer for B): B starts as a copy of A; tests edit B's rows."""
    steps, reqs = base_requests()
    a = write_run(tmp_path / "a", "A", steps, reqs)

    def make_b(edit=None, reqs_edit=None, **kw):
        s2, r2 = copy.deepcopy(steps), copy.deepcopy(reqs)
        if edit:
            edit(s2)
        if reqs_edit:
            reqs_edit(r2)
        return write_run(tmp_path / f"b{len(list(tmp_path.iterdir()))}", "B", s2, r2, **kw)
    return a, make_b, steps


def row(steps, rid, step):
    return next(s for s in steps if s["request_id"] == rid and s["step"] == step)


def only(res, rid="0"):
    return next(r for r in res.requests if r.request_id == rid)


def test_identical_runs_are_clean(pair):
    a, make_b, _ = pair
    res = diff_runs(a, make_b())
    assert res.clean and res.counts == {"draft": 0, "verify": 0, "metric": 0, "none": 2}
    assert res.matched_by == "request_id" and "prompts agree" in res.match_note
    assert all(r.steps_compared == 3 and r.step is None for r in res.requests)


def test_draft_divergence(pair):
    a, make_b, _ = pair

    def edit(s):  # request 0, step 1: the drafter proposed another token at node 2
        row(s, "0", 1)["node_tokens"][2] = 5
    res = diff_runs(a, make_b(edit))
    r = only(res)
    assert (r.cls, r.step, r.fields) == ("draft", 1, ["node_tokens"])
    assert "node 2" in r.what
    assert only(res, "1").cls == "none"


def test_draft_tree_shape(pair):
    a, make_b, _ = pair
    res = diff_runs(a, make_b(lambda s: row(s, "1", 0).update(parents=[-1, 0, 0, 2])))
    r = only(res, "1")
    assert (r.cls, r.step, r.fields) == ("draft", 0, ["parents"]) and "tree shape" in r.what


@pytest.mark.parametrize("what,kind", [("positions", "positions"), ("mask", "mask"),
                                       ("both", "positions+mask"), ("argmax", "same-input")])
def test_verify_divergence_kinds(pair, what, kind):
    a, make_b, _ = pair

    def edit(s):
        r = row(s, "0", 2)
        if what in ("positions", "both"):
            r["positions"] = [p + 1 for p in r["positions"]]
        if what in ("mask", "both"):
            r["mask_hash"] = mask_hash_from_parents([-1, 0, 0, 0])  # a star instead of a chain
        r["target_argmax"] = [78, 1, 1, 1]
    res = diff_runs(a, make_b(edit))
    r = only(res)
    assert (r.cls, r.step, r.verify_kind) == ("verify", 2, kind)
    assert ("target_argmax" in r.fields) and ("positions" in r.fields) == (what in ("positions", "both"))
    assert ("mask_hash" in r.fields) == (what in ("mask", "both"))
    if what in ("positions", "both"):
        assert "+1 on every node" in r.what
    if kind == "same-input":
        assert "positions and mask hash agree" in r.what


def test_verify_by_margin_only(pair):
    a, make_b, _ = pair

    def edit(s):  # same argmax, but the logits moved: e.g. a corrupted KV cache
        row(s, "1", 1)["target_margin"] = [2.0, 1.2, 2.0, 2.0]
    b = make_b(edit)
    r = only(diff_runs(a, b), "1")
    assert (r.cls, r.step, r.verify_kind, r.fields) == ("verify", 1, "same-input", ["target_margin"])
    assert diff_runs(a, b, margin_tol=float("inf")).clean
    assert diff_runs(a, b, margin_tol=1.0).clean  # 0.8 below the tolerance


def test_seq_len_is_a_position_divergence(pair):
    a, make_b, _ = pair

    def edit(s):
        r = row(s, "0", 1)
        r["seq_len"] += 1
        r["positions"] = [p + 1 for p in r["positions"]]
    r = only(diff_runs(a, make_b(edit)))
    assert (r.cls, r.step, r.verify_kind) == ("verify", 1, "positions")
    assert r.fields[:2] == ["seq_len", "positions"]


@pytest.mark.parametrize("field,value,expect", [
    ("accepted_depth", 3, ["accepted_depth"]),
    ("commit_len", 1, ["commit_len"]),
    ("accepted_path", [0, 1, 2, 3], ["accepted_path"]),
    ("finished", True, ["finished"]),
])
def test_metric_divergence(pair, field, value, expect):
    a, make_b, _ = pair
    res = diff_runs(a, make_b(lambda s: row(s, "0", 0).update({field: value})))
    r = only(res)
    assert (r.cls, r.step, r.fields) == ("metric", 0, expect)
    assert res.counts == {"draft": 0, "verify": 0, "metric": 1, "none": 1}


def test_metric_commit_not_cut(pair):
    """Same tensors, a longer commit (e.g. not cut at EOS): metric, and the outputs diverge."""
    a, make_b, _ = pair

    def edit(s):
        r = row(s, "0", 0)
        r["committed_tokens"] = r["committed_tokens"] + [12]
        r["commit_len"] += 1
    r = only(diff_runs(a, make_b(edit)))
    assert r.cls == "metric" and r.step == 0
    assert r.fields == ["commit_len", "committed_tokens"] and "outputs diverge" in r.what


def test_conventions_govern_reported_figures(tmp_path):
    """As in the checker: step rows always mean what the contract says; `conventions` say how
    a run's reported means are computed. diff reads each run's reported figures in its own
    conventions and compares the rows in the contract's."""
    steps, reqs = base_requests()
    steps.remove(row(steps, "1", 2))   # request 1 ends a step early: pooled != per-request means
    row(steps, "1", 1)["finished"] = True
    # pooled: depth 10/5 = 2.0, commit 15/5 = 3.0; per request: depth (5/3 + 5/2) / 2, commit (8/3 + 7/2) / 2
    pooled = {"mean_accepted_depth": 2.0, "mean_commit_len": 3.0, "mean_accept_length": 3.0}
    per_req_depth = (5 / 3 + 5 / 2) / 2
    other = {"mean_accepted_depth": per_req_depth, "mean_commit_len": (8 / 3 + 7 / 2) / 2,
             "mean_accept_length": per_req_depth}  # excludes_bonus: the accept length is the depth
    a = write_run(tmp_path / "a", "A", steps, reqs, manifest={"reported": pooled})
    conv = {"accept_length": "excludes_bonus", "mean": "per_request"}
    b = write_run(tmp_path / "b", "B", steps, reqs, manifest={"reported": other, "conventions": conv})
    res = diff_runs(a, b)
    assert res.clean
    acc = res.acceptance
    assert acc["A"]["matched_rows"] == acc["B"]["matched_rows"] == pooled
    assert acc["B"]["rows_in_declared_conventions"] == pytest.approx(other)
    assert all(acc["A"]["reported_matches_rows"].values()) and all(acc["B"]["reported_matches_rows"].values())
    assert not any("suspect" in n for n in res.notes)
    assert any("conventions differ" in n for n in res.notes)
    # the same figures, undeclared: B's reported means are not what its rows give
    b2 = write_run(tmp_path / "b2", "B", steps, reqs, manifest={"reported": other})
    res = diff_runs(a, b2)
    assert res.clean  # the rows are identical: the bug is in the figures, not the steps
    bad = [n for n in res.notes if "suspect" in n]
    assert len(bad) == 3 and all(n.startswith("B's reported mean_") for n in bad)
    assert not res.acceptance["B"]["reported_matches_rows"]["mean_accept_length"]


def test_row_counters_keep_contract_meaning_under_any_convention(pair):
    """A commit_len without the bonus in the step rows is a metric divergence even when the
    manifest declares excludes_bonus (the convention covers reported figures, not rows)."""
    a, make_b, _ = pair

    def edit(s):
        for r in s:
            r["commit_len"] -= 1
    conv = {"conventions": {"accept_length": "excludes_bonus", "mean": "pooled"}}
    for b in (make_b(edit, manifest=conv), make_b(edit)):
        r = only(diff_runs(a, b))
        assert (r.cls, r.step, r.fields) == ("metric", 0, ["commit_len"])
        assert r.what == "commit_len 3 vs 2"


def test_prefill_divergence(pair):
    a, make_b, _ = pair

    def edit_req(rq):
        rq[1]["first_token"] = 61
    r = only(diff_runs(a, make_b(reqs_edit=edit_req)), "1")
    assert (r.cls, r.step, r.fields) == ("verify", -1, ["first_token"])


def test_requests_table_disagrees(pair):
    a, make_b, _ = pair

    def edit_req(rq):
        rq[0]["output_tokens"] = rq[0]["output_tokens"][:-1]
    r = only(diff_runs(a, make_b(reqs_edit=edit_req)))
    assert (r.cls, r.fields) == ("metric", ["output_tokens"])


def test_first_divergence_wins(pair):
    """A draft divergence at step 2 does not hide a metric divergence at step 1."""
    a, make_b, _ = pair

    def edit(s):
        row(s, "0", 1)["accepted_depth"] = 2
        row(s, "0", 2)["node_tokens"][1] = 7
    r = only(diff_runs(a, make_b(edit)))
    assert (r.cls, r.step) == ("metric", 1)


def test_truncated_and_extra_steps(pair):
    a, make_b, steps = pair
    # B's trace of request 1 stops after step 1 (killed run): compared on the common steps
    r = only(diff_runs(a, make_b(lambda s: s.remove(row(s, "1", 2)))), "1")
    assert r.cls == "none" and r.truncated and r.steps_compared == 2
    # B has a step after the finished one: metric
    extra = copy.deepcopy(row(steps, "1", 2))
    extra["step"] = 3
    r = only(diff_runs(a, make_b(lambda s: s.append(extra))), "1")
    assert (r.cls, r.step) == ("metric", 3) and "after the request finished" in r.what


def test_match_by_prompt_when_ids_differ(tmp_path, pair):
    a, _, steps = pair
    _, reqs = base_requests()
    # B numbered the same two prompts the other way round, and changed request 1's draft
    s2, r2 = copy.deepcopy(steps), copy.deepcopy(reqs)
    swap = {"0": "1", "1": "0"}
    for x in s2 + r2:
        x["request_id"] = swap[x["request_id"]]
    row(s2, "0", 0)["node_tokens"][1] = 5  # A's request "1"
    b = write_run(tmp_path / "b", "B", s2, r2)
    res = diff_runs(a, b)
    assert res.matched_by == "prompt" and "ids differ" in res.match_note
    got = {r.request_id: (r.request_id_b, r.cls) for r in res.requests}
    assert got == {"0": ("1", "none"), "1": ("0", "draft")}


def test_partial_overlap(tmp_path, pair):
    a, _, steps = pair
    _, reqs = base_requests()
    keep = [s for s in steps if s["request_id"] == "1"]
    b = write_run(tmp_path / "b", "B", keep, [q for q in reqs if q["request_id"] == "1"])
    res = diff_runs(a, b)
    assert [r.request_id for r in res.requests] == ["1"] and res.clean
    assert res.unmatched_a == ["0"] and res.unmatched_b == []
    assert any("partial overlap" in n for n in res.notes)
    assert res.to_dict()["overlap"]["partial"] is True


def test_no_requests_table_matches_by_id(tmp_path, pair):
    a, _, steps = pair
    b = write_run(tmp_path / "b", "B", steps, None)
    res = diff_runs(a, b)
    assert res.clean and res.matched_by == "request_id"
    assert any("no requests table" in n for n in res.notes)


def test_foreign_trace_without_optional_columns(tmp_path, pair):
    """A producer that writes only the columns diff needs (no margins, timings, logprobs)."""
    a, _, steps = pair
    _, reqs = base_requests()
    drop = ("target_margin", "draft_logprob", "t_start", "draft_s", "verify_s", "step_s", "algo",
            "budget", "topk", "batch_size", "run_id")
    b = write_run(tmp_path / "b", "B", steps, reqs, drop=drop,
                  manifest={"engine": {"name": "other-engine", "version": "9"}})
    assert diff_runs(a, b).clean
    assert diff_runs(b, a).clean


# ------------------------------------------------------------------------- CLI


def cli(capsys, *argv):
    code = main(["diff", *map(str, argv)])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_cli_text_table_per_class(capsys, pair):
    a, make_b, _ = pair

    def edit(s):
        row(s, "0", 0)["positions"] = [p + 1 for p in row(s, "0", 0)["positions"]]
        row(s, "1", 1)["commit_len"] = 9
    code, out, err = cli(capsys, a, make_b(edit))
    assert code == 1 and not err
    assert "first divergence: draft 0, verify 1, metric 1, none 0" in out
    assert f"VERIFY (1 request): {EXPLAIN['verify']}" in out
    assert f"METRIC (1 request): {EXPLAIN['metric']}" in out
    assert "DRAFT" not in out and "NONE" not in out
    lines = out.splitlines()
    i = lines.index(f"VERIFY (1 request): {EXPLAIN['verify']}")
    assert lines[i + 1].split() == ["request", "step", "what", "differs"]
    assert lines[i + 2].split()[:2] == ["0", "0"] and "positions differ" in lines[i + 2]


def test_cli_json(capsys, pair):
    a, make_b, _ = pair
    code, out, _ = cli(capsys, a, make_b(lambda s: row(s, "1", 2).update(accepted_depth=2)),
                       "--output-format", "json")
    assert code == 1
    d = json.loads(out)
    assert d["counts"] == {"draft": 0, "verify": 0, "metric": 1, "none": 1}
    reqs = {r["request_id"]: r for r in d["requests"]}
    assert reqs["1"]["class"] == "metric" and reqs["1"]["step"] == 2
    assert reqs["0"]["class"] == "none" and reqs["0"]["step"] is None
    assert set(d["explanations"]) == set(CLASSES)
    code, out, _ = cli(capsys, a, a, "--output-format", "json")
    assert code == 0 and json.loads(out)["counts"]["none"] == 2


def _one_line_exit_2(capsys, *argv, needle):
    code, out, err = cli(capsys, *argv)
    assert code == 2, (out, err)
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    return err


def test_bad_input_prompts_differ(capsys, pair):
    a, make_b, _ = pair

    def edit_req(rq):
        for q in rq:
            q["prompt_tokens"] = [1] + q["prompt_tokens"]
    _one_line_exit_2(capsys, a, make_b(reqs_edit=edit_req), needle="prompts differ")


def test_bad_input_share_no_request(capsys, tmp_path, pair):
    a, _, steps = pair
    _, reqs = base_requests()
    s2, r2 = copy.deepcopy(steps), copy.deepcopy(reqs)
    for x in s2 + r2:
        x["request_id"] = "z" + x["request_id"]
    for q in r2:
        q["prompt_tokens"] = [9, 9, 9]
    b = write_run(tmp_path / "b", "B", s2, r2)
    _one_line_exit_2(capsys, a, b, needle="share no request")
    # without requests tables (ids only) too
    b2 = write_run(tmp_path / "b2", "B", s2, None)
    _one_line_exit_2(capsys, a, b2, needle="share no request")


def test_bad_input_schema_versions(capsys, pair):
    a, make_b, _ = pair
    b = make_b(manifest={"schema_version": 2})
    err = _one_line_exit_2(capsys, a, b, needle="different contract versions")
    assert "version 1" in err and "version 2" in err
    # both of a version this specaudit does not read (it reads 1 and 2)
    b99 = make_b(manifest={"schema_version": 99})
    _one_line_exit_2(capsys, b99, b99, needle="unknown schema_version 99")


def test_bad_input_empty(capsys, tmp_path, pair):
    a, _, _ = pair
    (tmp_path / "empty").mkdir()
    _one_line_exit_2(capsys, a, tmp_path / "empty", needle="no trace runs found")
    e = write_run(tmp_path / "e", "E", [], [])
    _one_line_exit_2(capsys, e, a, needle="empty")
    _one_line_exit_2(capsys, a, tmp_path / "nope", needle="no such file")


def test_bad_input_several_runs_and_columns(capsys, tmp_path, pair):
    a, _, steps = pair
    _, reqs = base_requests()
    write_run(tmp_path / "two", "R1", steps, reqs)
    write_run(tmp_path / "two", "R2", steps, reqs)
    _one_line_exit_2(capsys, a, tmp_path / "two", needle="holds 2 runs (R1, R2)")
    bad = write_run(tmp_path / "bad", "B", steps, reqs, drop=("target_argmax",))
    _one_line_exit_2(capsys, a, bad, needle="missing required column 'target_argmax'")
    _one_line_exit_2(capsys, a, a, "--examples", "-1", needle="--examples")
    (bad / "steps-000000.parquet").write_bytes(b"not parquet")
    _one_line_exit_2(capsys, a, bad, needle="not a readable Parquet file")


def test_bad_convention_value(capsys, pair):
    a, make_b, _ = pair
    b = make_b(manifest={"conventions": {"accept_length": "sometimes"}})
    _one_line_exit_2(capsys, a, b, needle="conventions.accept_length")


def test_raises_input_error_in_library(pair):
    a, make_b, _ = pair
    with pytest.raises(InputError):
        diff_runs(a, make_b(reqs_edit=lambda rq: [q.update(prompt_tokens=[3]) for q in rq]))


def test_foreign_types_split_files_and_repeated_rows(tmp_path, pair):
    """Another producer: 64-bit ints, rows spread over two files out of order, one row
    written twice (the first copy counts), and a margin column only in one file."""
    a, _, steps = pair
    _, reqs = base_requests()
    d = tmp_path / "b" / "run_id=B"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"schema_version": 1, "run_id": "B", "engine": {"name": "x"},
                                            "models": {}, "config": {}, "host": {}, "started_at": 0}))
    wide = pa.schema([pa.field(f.name, pa.int64()) if f.type == pa.int32() else
                      pa.field(f.name, pa.list_(pa.int64())) if f.type == pa.list_(pa.int32()) else f
                      for f in STEPS_SCHEMA if f.name != "target_margin"])
    rows = [{k: v for k, v in r.items() if k != "target_margin"} for r in steps]
    second = copy.deepcopy(rows[4])
    second["accepted_depth"] = 99  # a repeated row that differs: ignored, the first copy wins
    pq.write_table(pa.Table.from_pylist(rows[3:] + [second], schema=wide), d / "steps-000000.parquet")
    pq.write_table(pa.Table.from_pylist(steps[:3], schema=STEPS_SCHEMA), d / "steps-000001.parquet")
    pq.write_table(pa.Table.from_pylist(reqs, schema=REQUESTS_SCHEMA), d / "requests.parquet")
    res = diff_runs(a, d)
    assert res.clean, [r.what for r in res.requests]
    assert any("repeats 1 (request, step) rows" in n for n in res.notes)
    assert [r.steps_compared for r in res.requests] == [3, 3]
    # a real difference inside the 64-bit file is still found, at the right step
    pq.write_table(pa.Table.from_pylist([dict(r, mask_hash=7) if (r["request_id"], r["step"]) == ("1", 1) else r
                                         for r in rows[3:]], schema=wide), d / "steps-000000.parquet")
    r = only(diff_runs(a, d), "1")
    assert (r.cls, r.step, r.verify_kind) == ("verify", 1, "mask")
