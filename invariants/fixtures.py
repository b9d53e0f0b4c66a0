"""FixtureRun: a small valid synthetic run as row dicts, for rules' pass/fail fixtures.

    run = FixtureRun.make("tree", seed=3)
    row = run.steps_where(lambda s: not s["finished"] and s["accepted_depth"] >= 2)[0]
    row["commit_len"] = 1
    result = run.check()            # the whole catalog over the mutated run
"""
from __future__ import annotations

import copy

import pyarrow as pa

from specaudit.trace.schema import REQUESTS_SCHEMA, STEPS_SCHEMA

_CACHE: dict = {}


class FixtureRun:
    def __init__(self, steps: list[dict], requests: list[dict] | None, manifest: dict):
        self.steps = steps
        self.requests = requests
        self.manifest = manifest
        self.copies = 1   # write() also copies the run into run_dir/copy-<i>/ (SA002's fixture)

    @classmethod
    def make(cls, algo: str = "chain", seed: int = 7, **kw) -> FixtureRun:
        """A fresh copy of a small valid run (6 requests, budget 7; trees topk 3)."""
        key = (algo, seed, tuple(sorted(kw.items())))
        if key not in _CACHE:
            from specaudit.trace.synth import synth_run_rows
            opts = dict(n_requests=6, algo=algo, budget=7, max_new_tokens=40, eos_frac=0.5,
                        concurrency=3, seed=seed, zero_step_frac=0.0, run_id=f"fx-{algo}")
            opts.update(kw)
            st, rq, m = synth_run_rows(**opts)
            _CACHE[key] = (st.to_pylist(), rq.to_pylist(), m)
        st, rq, m = _CACHE[key]
        return cls(copy.deepcopy(st), copy.deepcopy(rq), copy.deepcopy(m))

    # ---------------------------------------------------------------- finders
    def step(self, request_id, step: int) -> dict:
        for s in self.steps:
            if s["request_id"] == str(request_id) and s["step"] == step:
                return s
        raise KeyError(f"no step {step} of request {request_id}")

    def steps_where(self, pred) -> list[dict]:
        out = [s for s in self.steps if pred(s)]
        if not out:
            raise LookupError("no synthetic step matches this fixture's condition; change the seed")
        return out

    def steps_of(self, request_id) -> list[dict]:
        return sorted((s for s in self.steps if s["request_id"] == str(request_id)), key=lambda s: s["step"])

    def request(self, request_id) -> dict:
        for r in self.requests or ():
            if r["request_id"] == str(request_id):
                return r
        raise KeyError(f"no request {request_id}")

    @property
    def reported(self) -> dict:
        return self.manifest.setdefault("reported", {})

    @property
    def eos_id(self) -> int:
        return int(self.manifest.get("config", {}).get("eos_id", 0) or 0)

    # ----------------------------------------------------------------- tables
    def tables(self) -> tuple[pa.Table, pa.Table | None]:
        return _table(self.steps, STEPS_SCHEMA), (_table(self.requests, REQUESTS_SCHEMA)
                                                  if self.requests is not None else None)

    def check(self, **kw):
        from specaudit.audit.check import check_tables
        st, rq = self.tables()
        return check_tables(st, rq, self.manifest, **kw)

    def write(self, out, n_files: int = 1):
        from specaudit.trace.synth import write_run
        st, rq = self.tables()
        run_dir = write_run(out, st, rq, self.manifest, n_files=n_files)
        for i in range(1, self.copies):
            write_run(run_dir / f"copy-{i}", st, rq, self.manifest, n_files=n_files)
        return run_dir


def _table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """Rows -> table: the schema's columns in its types, extra keys inferred."""
    extra = []
    for r in rows[:1]:
        extra = [k for k in r if k not in schema.names]
    fields = list(schema)
    cols = {}
    for f in fields:
        vals = [r.get(f.name) for r in rows]
        try:
            cols[f.name] = pa.array(vals, f.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            cols[f.name] = pa.array(vals)  # a fixture that breaks the type on purpose
    for k in extra:
        cols[k] = pa.array([r.get(k) for r in rows])
    return pa.table(cols)
