"""Engine outputs as DuckDB tables: `specaudit query` and `report` over logs, scrapes and
AIPerf / JSON records, as over traces.

    traces, engines = split_paths(["chain.log", "traces/"])
    windows = windows_table(engines)           # pyarrow.Table, one row per window
    findings = engine_findings(engines)        # the SA7xx findings of those files

Two tables, loaded into the same locked, offline DuckDB session as the trace views
(specaudit.postmortem.views.connect / connect_tables):

    windows    one row per window the engine readers made (specaudit.audit.sources, their
               public API: iter_readings, streamed a chunk at a time): one SGLang `Decode
               batch` line, one vLLM `SpecDecoding metrics` line, one scrape interval, one
               JSON record. Columns: file, source, engine, version, line, time, t, rank,
               concurrency, cuda_graph, k, kind, then every figure read (accept_len,
               accept_rate, verify_steps, drafted, accepted, gen_tps, printed_rate_pct,
               per_pos, per_pos_counts, per_pos_kind, per_pos_drafted, histogram,
               step_rate), the engine's conventions and source-specific extras (JSON
               text), and the line itself (text). A figure the engine did not print is NULL.
    findings   the SA7xx findings of those files (audit_file, what `specaudit check` says
               of them), plus the trace checker's when it ran: the `violations` columns.

A path is engine output when it is a file that is not part of a trace (not Parquet, not a
run.json, not an A/B result); folders are trace datasets.
"""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

_F = pa.float64()
_L = pa.list_(pa.float64())
WINDOW_COLUMNS = [
    ("file", pa.string()), ("source", pa.string()), ("engine", pa.string()), ("version", pa.string()),
    ("line", pa.int64()), ("time", pa.string()), ("t", _F), ("rank", pa.string()),
    ("concurrency", _F), ("cuda_graph", pa.bool_()), ("k", pa.int64()), ("kind", pa.string()),
    ("accept_len", _F), ("accept_rate", _F), ("verify_steps", _F), ("drafted", _F), ("accepted", _F),
    ("gen_tps", _F), ("printed_rate_pct", _F), ("per_pos", _L), ("per_pos_counts", _L),
    ("per_pos_kind", pa.string()), ("per_pos_drafted", _L), ("histogram", _L), ("step_rate", _F),
    ("conventions", pa.string()), ("extra", pa.string()), ("text", pa.string()),
]
WINDOW_SCHEMA = pa.schema(WINDOW_COLUMNS)


def is_engine_path(p) -> bool:
    """A file that is not part of a trace dataset (nor a `specaudit ab` JSON result)."""
    p = Path(p)
    if p.is_dir() or not p.exists():
        return False
    if p.suffix == ".parquet" or p.name == "run.json" or p.name.endswith(".rollup.parquet"):
        return False
    if p.suffix == ".json":
        try:
            with open(p, "rb") as f:
                head = f.read(4096)
        except OSError:
            return True
        if b'"specaudit-ab-evidence"' in head:
            return False
    return True


def split_paths(paths) -> tuple[list[str], list[str]]:
    """-> (trace paths, engine-output paths), each in the order given, as given."""
    traces, engines = [], []
    for p in paths:
        (engines if is_engine_path(p) else traces).append(p)
    return traces, engines


def _float_list(v):
    if v is None:
        return None
    try:
        return [None if x is None else float(x) for x in v]
    except (TypeError, ValueError):
        return None


def _json(d) -> str | None:
    return json.dumps(d, default=str, sort_keys=True) if d else None


def windows_table(paths, source: str | None = None) -> pa.Table:
    """Every window of every engine-output path as one Arrow table (WINDOW_SCHEMA).
    InputError (one line) for a file that is no engine's output, or mixes two engines.
    Streams: one chunk of windows (specaudit.audit.sources.stream.CHUNK_WINDOWS) is held as
    Python objects at a time; what is kept is Arrow."""
    from specaudit.audit.sources import iter_readings
    parts = [_chunk_table(r, str(path)) for path in paths for r in iter_readings(path, source)]
    return pa.concat_tables(parts) if parts else WINDOW_SCHEMA.empty_table()


def _chunk_table(r, path: str) -> pa.Table:
    """One Reading's windows as WINDOW_SCHEMA rows, built column by column."""
    ws = r.windows
    n = len(ws)
    cache: dict = {}

    def js(d: dict):
        # windows repeat the same few dicts (the file's conventions, the same extras): one
        # json.dumps per distinct content, not per window
        if not d:
            return None
        try:
            key = tuple(sorted(d.items()))
            hash(key)
        except TypeError:                  # a list or dict value: not hashable, dump it
            return _json(d)
        if key not in cache:
            cache[key] = _json(d)
        return cache[key]

    def num(attr):
        return [None if (v := getattr(w, attr)) is None else float(v) for w in ws]

    cols = {
        "file": [path] * n, "source": [r.source] * n,
        "engine": [w.engine or r.engine for w in ws], "version": [w.version or r.version for w in ws],
        "line": [w.line for w in ws], "time": [None if w.time is None else str(w.time) for w in ws],
        "t": num("t"), "rank": [None if w.rank is None else str(w.rank) for w in ws],
        "concurrency": num("concurrency"), "cuda_graph": [w.cuda_graph for w in ws], "k": [w.k for w in ws],
        "kind": [w.kind for w in ws], "accept_len": num("accept_len"), "accept_rate": num("accept_rate"),
        "verify_steps": num("drafts"), "drafted": num("draft_tokens"), "accepted": num("accepted_tokens"),
        "gen_tps": num("gen_tps"), "printed_rate_pct": num("printed_rate_pct"),
        "per_pos": [_float_list(w.per_pos) for w in ws], "per_pos_counts": [_float_list(w.per_pos_counts) for w in ws],
        "per_pos_kind": [w.per_pos_kind for w in ws], "per_pos_drafted": [_float_list(w.per_pos_drafted) for w in ws],
        "histogram": [_float_list(w.histogram) for w in ws], "step_rate": [w.step_rate for w in ws],
        "conventions": [js({**r.conventions, **w.conventions}) for w in ws], "extra": [js(w.extra) for w in ws],
        "text": [w.text or None for w in ws],
    }
    return pa.Table.from_arrays([pa.array(cols[name], type=typ) for name, typ in WINDOW_COLUMNS],
                                schema=WINDOW_SCHEMA)


def engine_findings(paths, source: str | None = None) -> list:
    """The SA7xx findings of every engine-output path (specaudit.audit.sources.audit_file)."""
    from specaudit.audit.sources import audit_file
    out = []
    for path in paths:
        out += audit_file(path, source)
    return out
