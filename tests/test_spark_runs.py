"""A whole-run Spark task's runs travel as JSON text (specaudit.audit.spark_runs), never pickled.

Every RunFiles field comes back as the driver had it (local Paths, listed URIs with their
sizes, a plain-string duplicate_of, problems with their class and attributes); a problem
class outside the allow-list is refused both ways; the Spark modules import no pickle.
"""
from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from specaudit.audit.spark_plan import UriPath
from specaudit.audit.spark_runs import PROBLEM_CLASSES, runs_from_json, runs_to_json
from specaudit.trace.parquet import SinkError
from specaudit.trace.safe_io import InputError
from specaudit.trace.schema import RunFiles

REPO = Path(__file__).resolve().parents[1]


def _local_run() -> RunFiles:
    d = Path("/data/traces/run_id=r1")
    sink = SinkError(d / "steps-000002.parquet", "disk full")
    sink.rows_kept = 37                 # a subclass's own attribute
    sink.add_note("while flushing")     # __notes__ travels as an attribute too
    return RunFiles(
        run_dir=d, run_id="r1",
        manifest={"run_id": "r1", "schema_version": 3, "config": {"budget": 7, "temperature": 0.8},
                  "finished_at": None, "reported": [1.5, None]},
        step_files=[d / "steps-000000.parquet", d / "steps-000001.parquet"],
        requests_file=d / "requests.parquet",
        problems=[InputError(d / "run.json", "bad manifest: x"), InputError(None, "no path"), sink],
        duplicate_of=Path("/data/other/run_id=r1"),
        request_parts=[d / "requests-000000.parquet", d / "requests-000001.parquet"],
        real_dir="/mnt/disk1/traces/run_id=r1",
        sizes={str(d / "steps-000000.parquet"): 1024, str(d / "requests.parquet"): 0})


def _uri_run() -> RunFiles:
    d = "s3a://bucket/traces/run_id=r2"
    return RunFiles(
        run_dir=UriPath(d), run_id="r2", manifest={"run_id": "r2"},
        step_files=[UriPath(d + "/steps-000000.parquet", 4096)],
        requests_file=UriPath(d + "/requests.parquet", 512),
        problems=[InputError(d + "/steps-000001.parquet", "not a regular file")],
        duplicate_of="s3a://bucket/old/run_id=r2",      # as discover_uri sets it: the folder's URI string
        request_parts=[UriPath(d + "/requests-000000.parquet", 100)],
        real_dir=d, sizes={d + "/steps-000000.parquet": 4096})


def _shape(v):
    """A value with its exact types, comparable with ==: Path, UriPath (uri, size), str,
    an InputError (class, args, attributes)."""
    if isinstance(v, UriPath):
        return ("UriPath", v.uri, v.size)
    if isinstance(v, BaseException):
        return (type(v), v.args, vars(v))
    if isinstance(v, list):
        return [_shape(x) for x in v]
    return (type(v), v)


def test_every_field_of_every_run_comes_back_as_it_was():
    runs = [(0, _local_run()), (7, _uri_run())]
    for _, rf in runs:   # every field filled: a field added to RunFiles is tested here too
        empty = [f.name for f in dataclasses.fields(RunFiles) if getattr(rf, f.name) in (None, [], {})]
        assert not empty
    text = runs_to_json(runs)
    assert isinstance(json.loads(text), list)
    back = runs_from_json(text)
    assert [k for k, _ in back] == [0, 7]
    for (_, a), (_, b) in zip(runs, back, strict=True):
        for f in dataclasses.fields(RunFiles):
            assert _shape(getattr(b, f.name)) == _shape(getattr(a, f.name)), f.name
        assert [str(e) for e in b.problems] == [str(e) for e in a.problems]
        assert _shape(b.request_files) == _shape(a.request_files)
        assert b.complete == a.complete
    sink = back[0][1].problems[2]
    assert type(sink) is SinkError and sink.rows_kept == 37 and sink.__notes__ == ["while flushing"]


def test_defaults_come_back_as_defaults():
    rf = RunFiles(run_dir=Path("d"), run_id="x")
    (_, back), = runs_from_json(runs_to_json([(1, rf)]))
    assert back == rf


@pytest.mark.parametrize("name", ["NoFigures", "os.system", "Exception", ""])
def test_a_problem_class_not_in_the_allow_list_is_refused(name):
    records = json.loads(runs_to_json([(0, _local_run())]))
    records[0]["run"]["problems"][0]["class"] = name
    with pytest.raises(ValueError, match=f"problem class {name!r} refused .*rebuilt: InputError, SinkError"):
        runs_from_json(json.dumps(records))


def test_a_problem_of_another_class_is_refused_before_it_is_sent():
    from specaudit.audit.sources.reading import NoFigures

    class InputError2(InputError):
        pass
    InputError2.__name__ = "InputError"   # a look-alike name is not the allowed class
    for e in (NoFigures("x.log", "no figures", recognised="vllm"), InputError2("x", "y")):
        rf = _local_run()
        rf.problems = [e]
        with pytest.raises(TypeError, match="cannot travel to a Spark task"):
            runs_to_json([(0, rf)])
    assert set(PROBLEM_CLASSES) == {"InputError", "SinkError"}


def test_a_record_with_an_unknown_field_or_path_is_refused():
    records = json.loads(runs_to_json([(0, _local_run())]))
    records[0]["run"]["extra"] = 1
    with pytest.raises(ValueError, match="unknown RunFiles field 'extra'"):
        runs_from_json(json.dumps(records))
    records[0]["run"].pop("extra")
    records[0]["run"]["run_dir"] = {"module": "os", "name": "system"}
    with pytest.raises(ValueError, match="not a path record"):
        runs_from_json(json.dumps(records))


def _imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_the_spark_modules_import_no_pickle():
    files = sorted((REPO / "specaudit" / "audit").glob("spark*.py"))
    assert {p.name for p in files} >= {"spark.py", "spark_tasks.py", "spark_runs.py", "spark_plan.py"}
    bad = {p.name: m for p in files for m in _imported_modules(p) & {"pickle", "_pickle", "cloudpickle", "dill"}}
    assert not bad, f"a Spark module imports a pickler: {bad}"
