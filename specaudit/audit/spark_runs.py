"""A whole-run Spark task's runs as JSON text, never pickle: [(run_key, RunFiles)] <-> str.

The driver sends each whole-run task its runs in one STRING cell (`runs_to_json`); the
worker rebuilds them (`runs_from_json`). The text is a list of {"run_key": int, "run": R},
R one RunFiles, every field kept:

    {"run_dir": P, "run_id": str, "manifest": {...} | null, "step_files": [P, ...],
     "requests_file": P | null, "problems": [E, ...], "duplicate_of": P | null,
     "request_parts": [P, ...], "real_dir": str | null, "sizes": {"<file>": bytes}}

P, a path as discovery made it: "a/b.parquet" (a local Path), {"uri": "s3a://...", "size": n}
(a UriPath, as Spark listed it), {"str": "s3a://..."} (a plain string: a listed URI run's
duplicate_of). E, a problem: {"class": name, "path": str | null, "reason": str, "attrs": {...}},
attrs a subclass's own attributes (JSON values). The class is looked up in PROBLEM_CLASSES
by name, never imported by a name the data gives: anything else is refused.

Here, not in specaudit.trace: a UriPath is the Spark checker's (the trace layer imports
no reader).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path, PurePath

from specaudit.audit.spark_plan import UriPath
from specaudit.trace.parquet import SinkError
from specaudit.trace.safe_io import InputError
from specaudit.trace.schema import RunFiles

# The problems rebuilt: the trace layer's InputErrors (discovery and manifest reads make
# plain InputError; a sink's SinkError is the layer's one subclass). An engine reader's
# NoFigures never is a run's problem, and importing it would make the checker import the
# sources reader (tests/test_architecture.py).
PROBLEM_CLASSES = {c.__name__: c for c in (InputError, SinkError)}

_PATHS = ("run_dir", "requests_file", "duplicate_of")    # a path or None
_PATH_LISTS = ("step_files", "request_parts")
_AS_IS = ("run_id", "manifest", "real_dir", "sizes")    # JSON values already (sizes: str keys)


def runs_to_json(members) -> str:
    """[(run_key, RunFiles)] -> the JSON text a task's `runs` cell holds."""
    return json.dumps([{"run_key": k, "run": run_files_to_json(rf)} for k, rf in members])


def runs_from_json(text: str) -> list[tuple[int, RunFiles]]:
    """runs_to_json's text -> [(run_key, RunFiles)], as the driver had them."""
    return [(rec["run_key"], run_files_from_json(rec["run"])) for rec in json.loads(text)]


def run_files_to_json(rf: RunFiles) -> dict:
    out = {}
    for f in dataclasses.fields(RunFiles):
        v = getattr(rf, f.name)
        if f.name in _PATHS:
            out[f.name] = None if v is None else _path_out(v)
        elif f.name in _PATH_LISTS:
            out[f.name] = [_path_out(p) for p in v]
        elif f.name == "problems":
            out[f.name] = [_problem_out(e) for e in v]
        elif f.name in _AS_IS:
            out[f.name] = v
        else:   # a field added to RunFiles: give it a JSON form here, or tasks would lose it
            raise TypeError(f"RunFiles.{f.name} has no JSON form (specaudit/audit/spark_runs.py)")
    return out


def run_files_from_json(d: dict) -> RunFiles:
    kw = {}
    for name, v in d.items():
        if name in _PATHS:
            kw[name] = None if v is None else _path_in(v)
        elif name in _PATH_LISTS:
            kw[name] = [_path_in(p) for p in v]
        elif name == "problems":
            kw[name] = [_problem_in(e) for e in v]
        elif name in _AS_IS:
            kw[name] = v
        else:
            raise ValueError(f"a task's runs: unknown RunFiles field {name!r}")
    return RunFiles(**kw)


def _path_out(p):
    if isinstance(p, UriPath):
        return {"uri": p.uri, "size": p.size}
    if isinstance(p, PurePath):
        return str(p)
    if isinstance(p, str):
        return {"str": p}
    raise TypeError(f"a run's path {p!r} is a {type(p).__name__}: no JSON form")


def _path_in(v):
    if isinstance(v, str):
        return Path(v)
    if isinstance(v, dict) and v.keys() == {"uri", "size"}:
        return UriPath(v["uri"], v["size"])
    if isinstance(v, dict) and v.keys() == {"str"}:
        return v["str"]
    raise ValueError(f"a task's runs: {v!r} is not a path record")


def _problem_out(e: InputError) -> dict:
    name = type(e).__name__
    if PROBLEM_CLASSES.get(name) is not type(e):
        raise TypeError(f"a run's problem of class {type(e).__qualname__} cannot travel to a Spark task "
                        f"(rebuilt: {', '.join(sorted(PROBLEM_CLASSES))})")
    attrs = {k: v for k, v in vars(e).items() if k not in ("path", "reason")}
    return {"class": name, "path": e.path, "reason": e.reason, "attrs": attrs}


def _problem_in(rec: dict) -> InputError:
    cls = PROBLEM_CLASSES.get(rec.get("class"))
    if cls is None:
        raise ValueError(f"a task's runs: problem class {rec.get('class')!r} refused "
                         f"(rebuilt: {', '.join(sorted(PROBLEM_CLASSES))})")
    e = cls(rec["path"], rec["reason"])
    vars(e).update(rec["attrs"])
    return e
