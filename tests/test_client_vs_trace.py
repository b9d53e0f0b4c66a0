"""audit/client_vs_trace: a benchmark client's per-request figures against the trace.

The end-to-end run with the real AIPerf is tests/test_serve_aiperf.py; here the pieces,
on records written as AIPerf 0.13 writes profile_export.jsonl and on a real trace."""
from __future__ import annotations

import json

import pytest
from specaudit.invariants import get_rule
from specaudit.invariants.sa59_client import ClientComparison

from specaudit.audit.client_vs_trace import Figures, aiperf_records, compare, is_aiperf_export, trace_figures


def record(xid, steps, drafted, accepted, phase="profiling"):
    m = {"spec_decode_steps": steps, "spec_decode_draft_tokens": drafted,
         "spec_decode_accepted_draft_tokens": accepted,
         "spec_decode_acceptance_length": 1 + accepted / steps,
         "spec_decode_draft_acceptance_rate": 100 * accepted / drafted}
    return {"metadata": {"x_request_id": xid, "benchmark_phase": phase},
            "metrics": {k: {"value": v, "unit": "x"} for k, v in m.items()}}


def test_agreeing_figures_pass_and_a_bonus_counted_as_draft_is_named(tmp_path):
    f = tmp_path / "profile_export.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in (
        record("a", 4, 28, 12), record("b", 3, 21, 9 + 3), record("w", 1, 7, 1, phase="warmup"),
        record("ghost", 2, 14, 2))) + "\n")
    assert is_aiperf_export(f) and not is_aiperf_export(tmp_path / "none.jsonl")
    recs = aiperf_records(f)
    assert set(recs) == {"a", "b", "ghost"} and recs["a"]["accept_rate"] == pytest.approx(12 / 28)   # % -> fraction
    derived = {"cmpl-a": Figures.of(4, 28, 12), "chatcmpl-b": Figures.of(3, 21, 9)}
    found = compare(recs, derived, file=str(f))
    bad = {(x.request_id, x.values["figure"]) for x in found if x.code == "SA590"}
    assert bad == {("chatcmpl-b", "accepted"), ("chatcmpl-b", "accept_len"), ("chatcmpl-b", "accept_rate")}
    b = next(x for x in found if x.values.get("figure") == "accept_len")
    assert b.values["reported"] == 5.0 and b.values["derived"] == 4.0 and "5" in b.message and "4" in b.message
    [un] = [x for x in found if x.code == "SA591"]
    assert un.severity == "warning" and un.values == {"unmatched": 1, "records": 3, "first": "ghost"}
    assert un.message == "1 of 3 AIPerf records have no request in the trace (first: ghost); they are not compared"
    assert b.message == ("AIPerf accept_len 5 for request chatcmpl-b, the trace re-derives 4 (from the accepted "
                         "paths: 9 accepted of 21 drafted in 3 verify steps)")


@pytest.mark.parametrize("code", ["SA590", "SA591"])
def test_client_rules_are_catalog_units_with_their_fixtures(code):
    """SA59x live in the catalog (invariants/sa59_client.py): documented, and each proves
    itself: its passing fixture leaves both rules clean, its failing one raises its code."""
    rule = get_rule(code)
    assert rule.scope == "source" and all(f"{p}:" in rule.doc() for p in ("What", "Why", "Example"))
    ok = ClientComparison.example()
    rule.passing(ok)
    assert compare(ok.records, ok.derived, file=ok.file) == []
    bad = ClientComparison.example()
    rule.fail(bad)
    found = compare(bad.records, bad.derived, file=bad.file)
    assert code in {f.code for f in found}
    assert all(f.file == bad.file and "{" not in f.message for f in found)
    assert rule.check(object()) is None   # an engine log's Reading is not this rule's input


def test_trace_figures_come_from_the_accepted_paths(make_run):
    run = make_run(inject="bonus-double-count")
    figs = trace_figures([run.run_dir])
    assert figs and all(f.steps >= 1 and f.accepted <= f.drafted for f in figs.values())
    rep = run.manifest["reported"]
    assert sum(f.steps for f in figs.values()) == rep["verify_steps"]
    # the reported counter has one more per step than the paths hold
    assert sum(f.accepted for f in figs.values()) + rep["verify_steps"] == rep["accepted_tokens"]


def test_check_cli_names_an_unreadable_export_in_one_line(make_run, tmp_path, capsys):
    from specaudit.cli import main
    run = make_run()
    f = tmp_path / "profile_export.jsonl"
    f.write_text(json.dumps(record("a", 1, 7, 1)) + "\n{broken\n")
    code = main(["check", str(f), str(run.run_dir)])
    out = capsys.readouterr()
    assert "line 2 is not JSON" in out.out + out.err and "Traceback" not in out.err
    assert code in (1, 2)


def test_vllm_request_ids_and_its_step_count_are_matched_as_vllm_counts(make_run, tmp_path):
    """A vLLM trace: its engine ids (cmpl-X-0-<8 hex>, chatcmpl-X-<8 hex>) meet AIPerf's
    X-Request-IDs, and a step without drafts is no verify step (vLLM's per-request block
    counts only steps that had drafts); the finding says which count it used. The same ids
    in a trace of our own runtime are not taken apart, and every row there is a step."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    x1, x2 = "0b1c2d3e-aaaa-4bbb-8ccc-0123456789ab", "f00d-1"
    rows = {"request_id": [f"cmpl-{x1}-0-1a2b3c4d"] * 3 + [f"chatcmpl-{x2}-9f8e7d6c"] * 2,
            # [rows] node tokens (root first) and accepted path: one row of each request without drafts
            "node_tokens": [[5], [5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8], [5]],
            "accepted_path": [[0], [0, 1, 2], [0], [0, 1, 2, 3], [0]]}
    manifest = dict(make_run().manifest)   # a valid manifest; only its engine changes
    for engine in ("vllm", "specaudit"):
        run = tmp_path / engine / f"run_id={manifest['run_id']}"
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps(dict(manifest, engine=dict(manifest["engine"], name=engine))))
        pq.write_table(pa.table(rows), run / "steps-00000.parquet")
    figs = trace_figures([tmp_path / "vllm"])
    a, b = figs[f"cmpl-{x1}-0-1a2b3c4d"], figs[f"chatcmpl-{x2}-9f8e7d6c"]
    assert (a.steps, a.drafted, a.accepted, a.convention) == (2, 6, 2, "vllm")
    assert (b.steps, b.drafted, b.accepted) == (1, 3, 3)
    ok = lambda f: {k: getattr(f, k) for k in ("steps", "drafted", "accepted", "accept_len", "accept_rate")}
    recs = {x1: ok(a), x2: ok(b)}
    assert compare(recs, figs) == []
    recs[x1] = dict(recs[x1], steps=3, accept_len=1 + 2 / 3)   # every row counted: not vLLM's count
    found = compare(recs, figs, file="e.jsonl")
    assert {(f.code, f.values["figure"]) for f in found} == {("SA590", "steps"), ("SA590", "accept_len")}
    assert all("in 2 verify steps with drafts (vLLM's count)" in f.message for f in found)
    own = trace_figures([tmp_path / "specaudit"])
    assert own[f"cmpl-{x1}-0-1a2b3c4d"].steps == 3 and own[f"cmpl-{x1}-0-1a2b3c4d"].convention == "rows"
    [un] = compare({x1: ok(a), x2: ok(b)}, own)   # our runtime's ids are cmpl-<X-Request-ID>, whole
    assert un.code == "SA591" and un.values["unmatched"] == 2
