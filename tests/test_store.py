"""Trace store and tracer: layout, atomic files, SIGKILL survival, manifest, external API."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import torch
from conftest import mask_hash_vectors

from specaudit.model import sha256_file, weights_dir
from specaudit.trace.parquet import ParquetSink
from specaudit.trace.safe_io import InputError
from specaudit.trace.schema import (
    REPORTED_KEYS,
    REQUESTS_SCHEMA,
    STEPS_SCHEMA,
    discover,
    mask_hash,
    mask_hash_from_parents,
    read_manifest,
)
from specaudit.trace.tracer import Tracer


def test_layout_and_manifest(clean_dataset):
    out, results = clean_dataset
    runs = discover([out])
    assert sorted(r.run_id for r in runs) == sorted(r.run_id for r in results)
    for rf, res in zip(sorted(runs, key=lambda r: r.run_id), sorted(results, key=lambda r: r.run_id)):
        assert rf.run_dir.name == f"run_id={res.run_id}"
        assert rf.complete and not rf.problems
        m = rf.manifest
        assert m["schema_version"] == 1 and m["finished_at"] >= m["started_at"]
        for k in ("algo", "budget", "topk", "concurrency", "max_new_tokens", "dtype", "device", "seed", "fault"):
            assert k in m["config"], k
        assert set(REPORTED_KEYS) <= set(m["reported"])
        assert m["models"]["target"]["sha256"] == sha256_file(weights_dir() / "target.safetensors")
        assert m["models"]["drafter"]["sha256"] == sha256_file(weights_dir() / "drafter.safetensors")
        for f in rf.step_files:
            meta = pq.ParquetFile(f).metadata
            assert meta.row_group(0).column(0).compression == "ZSTD"
            assert pq.read_schema(f).equals(STEPS_SCHEMA)
        rq = pq.read_schema(rf.requests_file)
        assert all(rq.field(n).type == REQUESTS_SCHEMA.field(n).type for n in REQUESTS_SCHEMA.names)
    # the whole folder is one dataset, unioned by name (run_id is also a column)
    table = ds.dataset(sorted(map(str, out.rglob("steps-*.parquet"))),
                       format="parquet").to_table(columns=["run_id", "step"])
    assert table.num_rows == sum(r.manifest["reported"]["verify_steps"] for r in results)


def test_reported_counters_match_rows_on_clean_run(clean_dataset):
    _, results = clean_dataset
    res = results[0]
    steps = [r for f in sorted(res.run_dir.glob("steps-*.parquet")) for r in pq.ParquetFile(f).read().to_pylist()]
    rep = res.manifest["reported"]
    assert rep["verify_steps"] == len(steps)
    assert rep["drafted_tokens"] == sum(len(s["node_tokens"]) - 1 for s in steps)
    assert rep["accepted_tokens"] == sum(len(s["accepted_path"]) - 1 for s in steps)
    assert rep["committed_tokens"] == sum(len(s["committed_tokens"]) for s in steps)


def test_mask_hash_contract_vectors():
    for v in mask_hash_vectors():
        if "mask_rows" in v:
            got = int(mask_hash(np.array(v["mask_rows"], dtype=bool)))
        else:
            got = mask_hash_from_parents(v["parents"])
        assert got == v["mask_hash_uint64"], v["name"]


def test_shared_vectors_copy_is_current():
    shared = Path(__file__).resolve().parents[2] / "shared" / "spec" / "mask-hash-vectors.json"
    if not shared.exists():
        pytest.skip("no ../shared beside this checkout")
    assert json.loads(shared.read_text()) == json.loads(
        (Path(__file__).parent / "data" / "mask-hash-vectors.json").read_text())


def test_external_engine_api(tmp_path):
    """An engine that is not ours records padded tensors and ragged lists; rows come out right."""
    tr = Tracer([ParquetSink(tmp_path, "ext", flush_steps=1)],
                {"schema_version": 1, "engine": {"name": "toy", "version": "0"}, "models": {},
                 "config": {"algo": "tree"}, "host": {}}, "ext")
    tr.begin_request("a", prompt_tokens=[1, 2], first_token=3)
    tr.begin_request("b", prompt_tokens=[4], first_token=5)
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, -1, -1]])
    mask = torch.zeros(2, 4, 4, dtype=torch.bool)
    mask[0] = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    mask[1, :2, :2] = torch.tensor([[1, 0], [1, 1]], dtype=torch.bool)
    tr.record_step(request_ids=["a", "b"], steps=[0, 0], algo="tree", budget=3, topk=2,
                   seq_len=torch.tensor([2, 1]), node_tokens=torch.tensor([[3, 7, 8, 9], [5, 6, 0, 0]]),
                   n_nodes=[4, 2], parents=parents, positions=torch.tensor([[2, 3, 3, 4], [1, 2, 0, 0]]),
                   node_mask=mask, target_argmax=torch.tensor([[7, 9, 1, 4], [6, 2, 0, 0]]),
                   accepted_path=[[0, 1, 3], [0, 1]], accepted_depth=[2, 1], commit_len=[3, 2],
                   committed_tokens=[[7, 9, 4], [6, 2]], finished=[False, True],
                   t_start=time.time(), draft_s=0.001, verify_s=0.002, step_s=0.004)
    tr.end_request("b", output_tokens=[5, 6, 2], finish_reason="length", ttft_s=0.1, e2e_s=0.2)
    tr.end_request("a", output_tokens=[3, 7, 9, 4], finish_reason="abort", ttft_s=0.1, e2e_s=0.3)
    m = tr.close(reported={"verify_steps": 2})
    rows = pq.read_table(tmp_path / "run_id=ext" / "steps-000000.parquet").to_pylist()
    assert rows[0]["node_tokens"] == [3, 7, 8, 9] and rows[1]["node_tokens"] == [5, 6]
    assert rows[1]["parents"] == [-1, 0] and rows[1]["positions"] == [1, 2]
    assert rows[0]["mask_hash"] == mask_hash_from_parents([-1, 0, 0, 1])
    assert rows[1]["mask_hash"] == mask_hash_from_parents([-1, 0])
    assert rows[0]["draft_logprob"] is None and rows[0]["batch_size"] == 2
    reqs = pq.read_table(tmp_path / "run_id=ext" / "requests.parquet").to_pylist()
    assert {r["request_id"]: r["finish_reason"] for r in reqs} == {"a": "abort", "b": "length"}
    assert read_manifest(tmp_path / "run_id=ext" / "run.json")["reported"] == {"verify_steps": 2}
    assert m["finished_at"] > 0


def test_existing_run_id_refused(tmp_path):
    ParquetSink(tmp_path, "r1").open_run({"x": 1})
    with pytest.raises(InputError, match="already exists"):
        ParquetSink(tmp_path, "r1")


def _wait_for(pred, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_sigkill_leaves_readable_dataset(tmp_path):
    """A real subprocess, killed with SIGKILL mid-run, leaves only whole, readable files."""
    out = tmp_path / "traces"
    proc = subprocess.Popen(
        [sys.executable, "-m", "specaudit", "run", "--algo", "chain", "--num-prompts", "64",
         "--max-new-tokens", "200", "--flush-steps", "16", "--flush-seconds", "0.05",
         "--run-id", "killed", "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    run_dir = out / "run_id=killed"
    try:
        assert _wait_for(lambda: len(list(run_dir.glob("steps-*.parquet"))) >= 3, 120), \
            proc.stderr.read().decode() if proc.poll() is not None else "no step files appeared"
        time.sleep(0.13)  # land the kill at an arbitrary point of a later flush
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    visible = sorted(run_dir.glob("steps-*.parquet"))
    assert len(visible) >= 3
    rows = 0
    for f in visible:  # every visible file is complete and non-empty
        n = pq.ParquetFile(f).read().num_rows
        assert 1 <= n <= 16 * 8  # flushed at 16 rows or 50 ms, whichever came first
        rows += n
    # the dataset API reads it (temporary dot-files are skipped), the manifest is the start one
    assert ds.dataset([str(f) for f in visible], format="parquet").to_table().num_rows == rows
    (rf,) = discover([out])
    assert rf.manifest is not None and "finished_at" not in rf.manifest
    # requests are written as they finish (a killed run keeps the finished ones), but the
    # run never closed: incomplete
    assert not rf.complete
