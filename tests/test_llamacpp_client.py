"""SA592-SA596 (invariants/sa59_llamacpp.py) and their reader (specaudit/audit/llamacpp_client.py)
without a server: each rule's fixtures, the step count from a printed mean length, the CLI's
routing of a responses export. The live tests (tests/test_llama_live.py) run them on a real
llama-server."""
from __future__ import annotations

import json

import pytest
from specaudit.invariants import get_rule
from specaudit.invariants.sa59_llamacpp import ServerEvidence

from specaudit.audit.llamacpp_client import CODES, audit, is_responses, read_log, steps_from_len


@pytest.mark.parametrize("code", CODES)
def test_each_rule_has_a_fixture_that_breaks_it_and_one_that_passes(code):
    rule = get_rule(code)
    assert rule.scope == "source" and all(f"{p}:" in rule.doc() for p in ("What", "Why", "Example"))
    ok = ServerEvidence.example()
    rule.passing(ok)
    assert audit(ok) == []
    bad = ServerEvidence.example()
    rule.fail(bad)
    found = audit(bad)
    assert code in {f.code for f in found}, [f.message for f in found]
    assert all("{" not in f.message and f.file == "responses.jsonl" for f in found)
    assert rule.check(object()) is None


def test_the_bonus_counted_as_accepted_is_caught_by_the_token_count():
    ev = ServerEvidence.example()
    get_rule("SA596").fail(ev)
    f = [x for x in audit(ev) if x.code == "SA596"][0]
    assert "20 verify steps + 64 accepted draft tokens = 84 committed" in f.message


def test_steps_from_a_printed_mean_length_only_when_unique():
    assert steps_from_len(44, 3.20) == 20
    assert steps_from_len(500, round(1 + 500 / 170, 2)) == 170
    assert steps_from_len(3, 1.05) is None          # 54..66 steps all print 1.05
    assert steps_from_len(0, 1.00) is None


LOG = """\
0.01 I slot print_timing: id 0 | task 1 | draft acceptance = 0.45833 (44 accepted /    96 generated), mean len =  3.20
0.02 D slot   operator(): id  0 | task 2 | accepted 2/6 draft tokens, new n_tokens = 50
0.03 D slot   operator(): id  0 | task 2 | accepted 3/6 draft tokens, new n_tokens = 54
0.04 I slot print_timing: id 0 | task 2 | draft acceptance = 0.41667 (5 accepted /    12 generated), mean len =  3.50
"""


def test_read_log_pairs_rounds_with_their_request_by_task(tmp_path):
    p = tmp_path / "server.log"
    p.write_text(LOG)
    a, b = read_log(p)
    assert (a["task"], a["steps"], a["rounds"]) == (1, 20, None)
    assert (b["task"], b["steps"], b["steps_printed"], b["rounds"]) == (2, 2, 2, [(2, 6), (3, 6)])


def test_check_cli_routes_responses_beside_the_log(tmp_path, capsys):
    from specaudit.cli import main
    log = tmp_path / "server.log"
    log.write_text(LOG)
    resp = tmp_path / "responses.jsonl"
    rows = [{"id_slot": 0, "timings": {"predicted_n": 65, "draft_n": 96, "draft_n_accepted": 44}},
            {"id_slot": 0, "timings": {"predicted_n": 8, "draft_n": 12, "draft_n_accepted": 6}}]
    resp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert is_responses(resp) and not is_responses(log)
    code = main(["check", str(log), str(resp), "--select", "SA59"])
    out = capsys.readouterr().out
    assert code == 1 and "SA592" in out and "draft_n_accepted 6" in out, out
    resp.write_text(json.dumps(rows[0]) + "\n{broken\n")
    code = main(["check", str(log), str(resp)])
    out = capsys.readouterr()
    # a bad input is named in one line, as every reader of check does (SA000)
    assert code != 0 and "line 2 is not JSON" in out.out + out.err and "SA000" in out.out
    assert "Traceback" not in out.err
