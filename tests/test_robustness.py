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
from specaudit.trace.schema import InputError, discover, read_manifest
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
    "conventions unknown value": lambda m: m.__setitem__("conventions", {"mean": 5}),
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
    # r1 is broken too (a step row lies), and must still be reported
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
