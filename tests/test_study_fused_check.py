"""scripts/study_fused_check.py (issue 35's study of a check in batch order): its fused passes
pass clean chain and tree datasets and catch what they test (a committed token that is not
the drafted one, a step that skips, a path off the chain, a parent after its child, a
position off its depth), so the figures it prints time real tests."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from specaudit.trace.synth import write_synthetic_dataset

REPO = Path(__file__).resolve().parents[1]


def study(d: Path) -> dict:
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "study_fused_check.py"), "--dir", str(d),
                        "--repeat", "1"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def broken(tmp_path: Path, name: str, column: str, change, algo: str = "chain") -> Path:
    d = tmp_path / name
    run = write_synthetic_dataset(d, n_steps=3000, n_nodes=8 if algo == "chain" else 16, algo=algo, seed=6)
    f = max(run.glob("steps-*.parquet"), key=lambda p: p.stat().st_size)
    t = pq.read_table(f)
    v = t.column(column).to_pylist()
    i = next(i for i, x in enumerate(v) if (len(x) >= 2 if isinstance(x, list) else x >= 1))
    v[i] = change(v[i])
    pq.write_table(t.set_column(t.schema.get_field_index(column), column, pa.array(v, t.schema.field(column).type)), f)
    return d


def test_clean_then_each_injected_fault_is_counted(tmp_path):
    clean = tmp_path / "clean"
    write_synthetic_dataset(clean, n_steps=3000, n_nodes=8, algo="chain", seed=6)
    out = study(clean)
    assert out["bad_rows"] == 0 and out["steps"] >= 3000
    assert out["fused_of_decode_limit"] > 0 and out["fused_work_ns_per_step"] is not None
    faults = {"commit": ("committed_tokens", lambda x: [x[0] + 1, *x[1:]]),
              "step": ("step", lambda x: x + 5),
              "path": ("accepted_path", lambda x: [x[0], x[1] + 1, *x[2:]])}
    for name, (column, change) in faults.items():
        assert study(broken(tmp_path, name, column, change))["bad_rows"] >= 1, name


def test_trees_clean_then_each_injected_fault_is_counted(tmp_path):
    clean = tmp_path / "clean"
    write_synthetic_dataset(clean, n_steps=3000, n_nodes=16, algo="tree", seed=6)
    out = study(clean)
    assert out["bad_rows"] == 0 and out["steps"] >= 3000
    faults = {"commit": ("committed_tokens", lambda x: [x[0] + 1, *x[1:]]),
              "parent": ("parents", lambda x: [x[0], x[1], len(x) - 1, *x[3:]]),   # a parent after its child
              "position": ("positions", lambda x: [x[0], x[1] + 1, *x[2:]])}
    for name, (column, change) in faults.items():
        assert study(broken(tmp_path, name, column, change, algo="tree"))["bad_rows"] >= 1, name
