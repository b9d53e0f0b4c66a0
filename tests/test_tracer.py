"""The tracer's conversion against a per-row reference, and its hand-off contract.

`steps_to_arrow` batches many steps into one RecordBatch with a few array operations per
column; the reference below builds the same rows one at a time in plain Python (the
contract in words), so any shortcut the fast path takes (same-width concatenation,
deferred tensor reads, the packed mask hash) must give the same table.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
import torch

from specaudit.trace.host_copy import stage_device, unstage
from specaudit.trace.schema import (
    SAMPLING_FIELDS,
    STEPS_SCHEMA,
    STEPS_SCHEMA_V2,
    _pack_rows,
    ancestor_mask,
    mask_hash,
    mask_hash_from_parents,
)
from specaudit.trace.steps_arrow import steps_to_arrow
from specaudit.trace.tracer import Tracer

# ------------------------------------------------------------------ reference


def _rows_of(x, B):
    """Per-row values of a [B] field given as a list, array or tensor."""
    a = x.numpy() if hasattr(x, "numpy") else np.asarray(x)
    return a.reshape(B, -1)[:, 0].tolist() if a.size else []


def _ragged_rows(x, B):
    if isinstance(x, (list, tuple)):
        return [[int(t) for t in np.asarray(r).reshape(-1)] for r in x]
    a = (x.numpy() if hasattr(x, "numpy") else np.asarray(x)).reshape(B, -1)
    return [[int(t) for t in r if t >= 0] for r in a]


def reference_rows(run_id, items):
    """One dict per (step, request), built row by row."""
    out = []
    for f in items:
        n = np.asarray(f["n_nodes"]).reshape(-1)
        B = len(n)
        arr = {k: (None if f[k] is None else (f[k].numpy() if hasattr(f[k], "numpy") else np.asarray(f[k])))
               for k in ("node_tokens", "parents", "positions", "node_mask", "mask_hash", "draft_logprob",
                         "target_argmax", "target_margin")}
        steps, seq = _rows_of(f["steps"], B), _rows_of(f["seq_len"], B)
        depth, commit, fin = _rows_of(f["accepted_depth"], B), _rows_of(f["commit_len"], B), _rows_of(f["finished"], B)
        path, com = _ragged_rows(f["accepted_path"], B), _ragged_rows(f["committed_tokens"], B)
        s = f.get("sampling")
        for b in range(B):
            k = int(n[b])
            def node(key, cast, b=b, k=k, arr=arr):
                a = arr[key]
                return None if a is None else [cast(v) for v in a[b, :k]]
            h = (int(arr["mask_hash"].reshape(-1)[b]) if arr["mask_hash"] is not None
                 else int(mask_hash(arr["node_mask"][b, :k, :k].astype(bool))))
            row = {"run_id": run_id, "request_id": str(f["request_ids"][b]), "step": int(steps[b]),
                   "algo": f["algo"], "budget": f["budget"], "topk": f["topk"],
                   "batch_size": f["batch_size"] or B, "seq_len": int(seq[b]),
                   "node_tokens": node("node_tokens", int), "parents": node("parents", int),
                   "positions": node("positions", int), "mask_hash": h,
                   "draft_logprob": node("draft_logprob", lambda v: float(np.float32(v))),
                   "target_argmax": node("target_argmax", int),
                   "target_margin": node("target_margin", lambda v: float(np.float32(v))),
                   "accepted_path": path[b], "accepted_depth": int(depth[b]), "commit_len": int(commit[b]),
                   "committed_tokens": com[b], "finished": bool(fin[b]), "t_start": f["t_start"],
                   "draft_s": f["draft_s"], "verify_s": f["verify_s"], "step_s": f["step_s"]}
            for fld in SAMPLING_FIELDS:
                if s is None:
                    row[fld.name] = None
                elif pa.types.is_list(fld.type):
                    row[fld.name] = [float(np.float32(v)) for v in np.asarray(s[fld.name])[b, :k]]
                else:
                    v = np.asarray(s[fld.name]).reshape(-1)[b]
                    row[fld.name] = int(v) if pa.types.is_integer(fld.type) else float(np.float32(v))
            out.append(row)
    return out


def _same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def assert_matches_reference(run_id, items):
    batch = steps_to_arrow(run_id, items)
    sampled = any(f.get("sampling") is not None for f in items)
    assert batch.schema == (STEPS_SCHEMA_V2 if sampled else STEPS_SCHEMA)
    got = batch.to_pylist()
    want = reference_rows(run_id, items)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        for c in batch.schema.names:
            assert _same(g[c], w.get(c)), (i, c, g[c], w.get(c))


# ------------------------------------------------------------------ generators


def _item(rng, B, N, *, algo="tree", width=None, kind="tensor", mask="mask", sampling=False, logprob=True,
          ragged="list", batch_size=None):
    """One batched verify of B requests with N_r <= N nodes, padded to `width` >= N."""
    W = width or N
    n = rng.integers(1, N + 1, size=B)
    n[0] = N
    parents = np.full((B, W), -1, np.int64)
    for b in range(B):
        for i in range(1, n[b]):
            parents[b, i] = i - 1 if algo == "chain" else rng.integers(0, i)
    V = ancestor_mask(parents)                      # padding nodes see only themselves
    conv = {"tensor": torch.from_numpy, "numpy": lambda a: a, "list": lambda a: a.tolist()}[kind]
    tokens = rng.integers(0, 500, size=(B, W))
    depth = rng.integers(0, 3, size=B)
    paths = [list(range(int(d) + 1)) for d in depth]
    commits = [rng.integers(0, 500, size=int(d) + 1).tolist() for d in depth]
    f = dict(request_ids=[f"r{rng.integers(0, 10**6)}" for _ in range(B)], steps=rng.integers(0, 99, B).tolist(),
             algo=algo, budget=N - 1, topk=1 if algo == "chain" else 3, seq_len=conv(rng.integers(1, 900, B)),
             node_tokens=conv(tokens), n_nodes=n if kind != "list" else n.tolist(), parents=conv(parents),
             positions=conv(rng.integers(0, 999, size=(B, W))),
             node_mask=conv(V) if mask == "mask" else None,
             mask_hash=(np.array([mask_hash_from_parents(parents[b, : n[b]]) for b in range(B)], np.uint64)
                        if mask == "hash" else None),
             draft_logprob=conv(rng.normal(size=(B, W)).astype(np.float32)) if logprob else None,
             target_argmax=conv(rng.integers(0, 500, size=(B, W))),
             target_margin=conv(rng.random((B, W)).astype(np.float32)),
             accepted_path=paths if ragged == "list" else np.array(
                 [p + [-1] * (4 - len(p)) for p in paths]),
             accepted_depth=depth.tolist(), commit_len=[len(c) for c in commits], committed_tokens=commits,
             finished=(rng.random(B) < 0.3).tolist(), t_start=float(rng.random() * 1e9),
             draft_s=float(rng.random()), verify_s=float(rng.random()), step_s=float(rng.random()),
             batch_size=batch_size, sampling=None)
    if sampling:
        s = {k: np.where(np.arange(W)[None] < n[:, None], rng.random((B, W)), np.nan).astype(np.float32)
             for k in ("draft_prob", "target_prob", "accept_u")}
        s.update(sampled_token=rng.integers(0, 500, B).astype(np.int32), sampled_prob=rng.random(B).astype(np.float32),
                 sampled_target_prob=rng.random(B).astype(np.float32),
                 sampled_draft_prob=rng.random(B).astype(np.float32),
                 sampled_rank=rng.integers(0, 5, B).astype(np.int32))
        f["sampling"] = s
    return f


# ------------------------------------------------------------------ conversion


@pytest.mark.parametrize("kind", ["tensor", "numpy", "list"])
def test_same_width_steps_match_reference(kind):
    """The common case: every step of a batch has the same width (one concatenation per column)."""
    rng = np.random.default_rng(1)
    for algo, N in (("chain", 8), ("tree", 16), ("tree", 70)):   # 70: two words per packed mask row
        items = [_item(rng, int(rng.integers(1, 4)), N, algo=algo, kind=kind) for _ in range(7)]
        assert_matches_reference("run-a", items)


def test_mixed_steps_match_reference():
    """Widths, producers' types, hashes against masks, ragged forms, missing columns, all in one batch."""
    rng = np.random.default_rng(2)
    items = [
        _item(rng, 2, 8, algo="chain"),
        _item(rng, 3, 12, width=15, kind="numpy", mask="hash", ragged="padded"),
        _item(rng, 1, 5, kind="list", logprob=False),
        _item(rng, 4, 16, width=16, batch_size=9),
        _item(rng, 2, 3, kind="numpy", mask="hash"),
    ]
    assert_matches_reference("run-b", items)
    # every step without draft_logprob: the column is null, not an error
    items = [_item(rng, 2, 6, logprob=False) for _ in range(3)]
    assert_matches_reference("run-c", items)
    assert steps_to_arrow("run-c", items).column("draft_logprob").null_count == 6


def test_sampled_steps_match_reference():
    rng = np.random.default_rng(3)
    assert_matches_reference("run-s", [_item(rng, 2, 8, algo="chain", sampling=True) for _ in range(4)])
    # a step without the v2 record among sampled ones: its v2 fields are null
    mixed = [_item(rng, 2, 8, algo="chain", sampling=True), _item(rng, 1, 8, algo="chain"),
             _item(rng, 3, 10, sampling=True)]
    assert_matches_reference("run-s2", mixed)
    assert steps_to_arrow("run-s2", mixed).column("accept_u").null_count == 1


def test_single_dict_and_empty_rows():
    rng = np.random.default_rng(4)
    f = _item(rng, 3, 9)
    assert steps_to_arrow("one", f).num_rows == 3
    assert_matches_reference("one", [f])


def test_pack_rows_bit_layout():
    """Bit j of a row sits at bit j mod 64 of word j div 64, whatever N."""
    rng = np.random.default_rng(5)
    for N in (1, 7, 8, 9, 63, 64, 65, 130):
        V = rng.random((3, N, N)) < 0.5
        words = _pack_rows(V)
        W = (N + 63) // 64
        assert words.shape == (3, N, W) and words.dtype == np.dtype("<u8")
        j = np.arange(W * 64)
        bits = ((words[..., j // 64] >> (j % 64).astype(np.uint64)) & np.uint64(1)).astype(bool)
        assert (bits[..., :N] == V).all() and not bits[..., N:].any()


def test_stage_device_round_trip():
    """The batched device->host hand-off: one byte buffer, every field back with its dtype and shape."""
    fields = {"a": torch.arange(12, dtype=torch.int64).reshape(3, 4), "b": torch.rand(3, 4),
              "c": torch.rand(2, 3, 3) < 0.5, "d": torch.arange(5, dtype=torch.int32), "e": [1, 2], "f": None,
              "g": torch.arange(6, dtype=torch.int64).reshape(2, 3).t()}   # not contiguous
    want = {k: (v.numpy().copy() if hasattr(v, "numpy") else v) for k, v in fields.items()}
    staged, buf = stage_device(dict(fields), lambda t: isinstance(t, torch.Tensor))
    assert buf is not None and buf.dtype == torch.uint8
    out = unstage(staged, buf.numpy())
    for k, v in want.items():
        if isinstance(v, np.ndarray):
            assert out[k].dtype == v.dtype and out[k].shape == v.shape and (out[k] == v).all(), k
        else:
            assert out[k] == v


# ------------------------------------------------------------------ the tracer


class _Keep:
    def __init__(self):
        self.batches = []

    def write_steps(self, b):
        self.batches.append(b)


def _record(tr, f):
    kw = {k: v for k, v in f.items() if k != "request_ids"}
    tr.record_step(request_ids=f["request_ids"], **kw)


@pytest.mark.parametrize("copy_inputs", [True, False])
def test_tracer_rows_match_reference(copy_inputs):
    rng = np.random.default_rng(6)
    items = [_item(rng, 2, 8, algo="chain"), _item(rng, 3, 12, kind="numpy", mask="hash"),
             _item(rng, 1, 16, kind="list"), _item(rng, 2, 16)]
    keep = _Keep()
    tr = Tracer([keep], {}, "t", batch_s=0.01, copy_inputs=copy_inputs)
    for f in items:
        _record(tr, f)
    tr.close()
    got = pa.Table.from_batches(keep.batches).to_pylist()
    want = reference_rows("t", items)
    assert len(got) == len(want) == 8
    for g, w in zip(got, want):
        assert all(_same(g[c], w[c]) for c in STEPS_SCHEMA.names), (g, w)


def test_copy_inputs_snapshots_what_was_recorded():
    """copy_inputs=True: an engine that reuses its buffers after record_step still gets the
    values it recorded, even though the conversion runs later on the worker."""
    rng = np.random.default_rng(7)
    f = _item(rng, 2, 8, algo="chain")
    want = reference_rows("t", [f])
    keep = _Keep()
    tr = Tracer([keep], {}, "t", batch_s=5.0, copy_inputs=True)
    _record(tr, f)
    for k in ("node_tokens", "positions", "target_argmax", "seq_len", "parents"):
        f[k].fill_(-7)     # the engine writes into its buffers for the next step
    f["node_mask"].fill_(False)
    tr.close()
    got = pa.Table.from_batches(keep.batches).to_pylist()
    assert all(_same(g[c], w[c]) for g, w in zip(got, want) for c in STEPS_SCHEMA.names)


def test_bad_step_is_counted_not_raised_and_close_reports_it():
    """A step the worker cannot convert never stops the decode loop; close() says data was lost."""
    from specaudit.trace.parquet import SinkError
    rng = np.random.default_rng(8)
    keep = _Keep()
    tr = Tracer([keep], {}, "t", batch_s=0.01, copy_inputs=False)
    f = _item(rng, 2, 8)
    f["n_nodes"] = None            # nonsense a buggy engine might send
    _record(tr, f)
    with pytest.raises(SinkError):
        tr.close()
    assert tr.error_count >= 1


def test_record_step_files_fresh_inputs_as_given_without_converting():
    """record_step must not convert on the decode thread when the engine hands fresh tensors
    over (copy_inputs=False): the queued item holds the very objects it was given."""
    rng = np.random.default_rng(9)
    f = _item(rng, 2, 8)
    tr = Tracer([], {}, "t", batch_s=60.0, copy_inputs=False)
    _record(tr, f)
    kind, item = tr._q.get_nowait()
    assert kind == "steps" and item.fields["node_tokens"] is f["node_tokens"]
    assert item.fields["node_mask"] is f["node_mask"]
    tr.close()


def test_batch_interval_follows_the_sinks():
    """Parquet alone: one conversion a second; a live sink (Prometheus, OTel) or a sink that
    flushes more often sets a shorter interval; an explicit batch_s wins."""
    from prometheus_client import CollectorRegistry

    from specaudit.trace.otel_sink import OtelSink
    from specaudit.trace.prom_sink import PromSink
    from specaudit.trace.tracer import BATCH_S, LIVE_BATCH_S, default_batch_s

    class Flushing:
        def __init__(self, flush_s):
            self.flush_s = flush_s
    assert default_batch_s([Flushing(5.0)]) == BATCH_S == 1.0
    assert default_batch_s([Flushing(5.0), PromSink(CollectorRegistry())]) == LIVE_BATCH_S
    assert default_batch_s([OtelSink.__new__(OtelSink)]) == LIVE_BATCH_S
    assert default_batch_s([Flushing(0.05)]) == 0.05
    tr = Tracer([Flushing(5.0)], {}, "t", batch_s=0.5)
    assert tr.batch_s == 0.5
    tr.close()
