"""The small Arrow tables behind two views: `runs` (one row per run, its manifest
flattened) and `violations` (the checker's findings, passed in by the command layer:
readers never import each other)."""
from __future__ import annotations

import json
import math

import pyarrow as pa

from specaudit.trace.schema import REPORTED_KEYS

VIOLATION_SCHEMA = pa.schema([
    ("code", pa.string()), ("name", pa.string()), ("severity", pa.string()),
    ("message", pa.string()), ("run_id", pa.string()), ("request_id", pa.string()),
    ("step", pa.int64()), ("file", pa.string()), ("line", pa.int64()),
    ("values", pa.string()),  # JSON text: the numbers, machine-readable
])


def findings_table(findings) -> pa.Table:
    """Findings (Finding objects, dicts, or an Arrow table) -> the `violations` table."""
    if findings is None:
        return VIOLATION_SCHEMA.empty_table()
    if isinstance(findings, pa.Table):
        rows = findings.to_pylist()
    else:
        rows = [f.to_dict() if hasattr(f, "to_dict") else dict(f) for f in findings]
    cols = {f.name: [] for f in VIOLATION_SCHEMA}
    for r in rows:
        for name in cols:
            v = r.get(name)
            if name == "values":
                if not isinstance(v, str):      # already JSON text when it comes from this table
                    v = json.dumps(v if v is not None else {}, default=str, sort_keys=True)
            elif name in ("step", "line") and v is not None:
                v = int(v)
            elif v is not None:
                v = str(v)
            cols[name].append(v)
    return pa.table(cols, schema=VIOLATION_SCHEMA)


# ---------------------------------------------------------------------------- runs

RUN_COLUMNS = [
    ("run_id", pa.string()), ("config", pa.string()), ("algo", pa.string()),
    ("budget", pa.int64()), ("topk", pa.int64()), ("block_size", pa.int64()),
    ("concurrency", pa.int64()), ("max_new_tokens", pa.int64()), ("dtype", pa.string()),
    ("device", pa.string()), ("seed", pa.int64()), ("fault", pa.string()),
    ("engine", pa.string()), ("engine_version", pa.string()),
    ("target_model", pa.string()), ("target_sha256", pa.string()),
    ("drafter_model", pa.string()), ("drafter_sha256", pa.string()),
    ("hostname", pa.string()), ("started_at", pa.float64()), ("finished_at", pa.float64()),
    ("complete", pa.bool_()), ("accept_length_convention", pa.string()),
    ("mean_convention", pa.string()),
] + [(f"reported_{k}", pa.float64()) for k in REPORTED_KEYS] + [
    ("step_files", pa.int64()), ("run_dir", pa.string()), ("problems", pa.string()),
    ("manifest", pa.string()), ("rollups", pa.string()),
]
RUNS_SCHEMA = pa.schema(RUN_COLUMNS)


def config_label(cfg: dict) -> str | None:
    """'chain b7 k1 c4' (+ ' fault=NAME'): the name a config goes by in queries and plots."""
    if not cfg or not cfg.get("algo"):
        return None
    s = f"{cfg.get('algo')} b{cfg.get('budget')} k{cfg.get('topk')} c{cfg.get('concurrency', 1)}"
    if cfg.get("fault"):
        s += f" fault={cfg['fault']}"
    return s


def finite_number(v, typ=float):
    """v as typ when it is a finite number (bools are not), else None."""
    try:
        if v is None or isinstance(v, bool):
            return None
        x = typ(v)
        return None if isinstance(x, float) and not math.isfinite(x) else x
    except (TypeError, ValueError):
        return None


def runs_table(runs, rollups: dict | None = None) -> pa.Table:
    """RunFiles (from schema.discover) -> the `runs` table: one row per run, manifest flattened.
    rollups: run_dir -> what the views made of the run's rollups, in words (Dataset.rollup_notes)."""
    cols = {name: [] for name, _ in RUN_COLUMNS}
    strings = {name for name, t in RUN_COLUMNS if t == pa.string()}
    for rf in runs:
        m = rf.manifest or {}
        cfg = m.get("config") or {}
        eng = m.get("engine") or {}
        models = m.get("models") or {}
        rep = m.get("reported") or {}
        conv = m.get("conventions") or {}
        host = m.get("host") or {}
        row = {
            "run_id": rf.run_id, "config": config_label(cfg), "algo": cfg.get("algo"),
            "budget": finite_number(cfg.get("budget"), int), "topk": finite_number(cfg.get("topk"), int),
            "block_size": finite_number(cfg.get("block_size"), int),
            "concurrency": finite_number(cfg.get("concurrency"), int),
            "max_new_tokens": finite_number(cfg.get("max_new_tokens"), int),
            "dtype": cfg.get("dtype"), "device": cfg.get("device"), "seed": finite_number(cfg.get("seed"), int),
            "fault": cfg.get("fault"),
            "engine": eng.get("name") if isinstance(eng, dict) else str(eng),
            "engine_version": eng.get("version") if isinstance(eng, dict) else None,
            "target_model": (models.get("target") or {}).get("name"),
            "target_sha256": (models.get("target") or {}).get("sha256"),
            "drafter_model": (models.get("drafter") or {}).get("name"),
            "drafter_sha256": (models.get("drafter") or {}).get("sha256"),
            "hostname": host.get("hostname") if isinstance(host, dict) else str(host),
            "started_at": finite_number(m.get("started_at")), "finished_at": finite_number(m.get("finished_at")),
            "complete": rf.complete,
            "accept_length_convention": conv.get("accept_length"), "mean_convention": conv.get("mean"),
            "step_files": len(rf.step_files), "run_dir": str(rf.run_dir),
            "problems": "; ".join(str(p) for p in rf.problems) or None,
            "manifest": json.dumps(m, sort_keys=True, default=str) if m else None,
            "rollups": (rollups or {}).get(str(rf.run_dir)),
        }
        for k in REPORTED_KEYS:
            row[f"reported_{k}"] = finite_number(rep.get(k))
        for name in cols:
            v = row[name]
            cols[name].append(str(v) if v is not None and name in strings else v)
    return pa.table(cols, schema=RUNS_SCHEMA)
