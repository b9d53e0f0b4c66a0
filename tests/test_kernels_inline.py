"""InlineAuditor: the engine hook, its backends, the non-blocking counter read, and the
Prometheus collector; then the real engine with each injected fault (embedded models)."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from specaudit.kernels import RULES, InlineAuditor, as_uint64
from specaudit.kernels.audit import NUM_COUNTERS
from test_kernels import engine_step, make_batch

from specaudit.trace.steps_arrow import node_mask_hashes


def hook_steps(fault=None, seeds=range(4)):
    """Runtime-shaped hook calls (numpy parents/n_nodes, lists of counters, tensors)."""
    for s in seeds:
        b = make_batch("tree", 6, 13, 77 + s)
        yield engine_step(b, fault, "tree", int(b["rng"].integers(0, b["V"])))[0]


@pytest.mark.parametrize("fault", [None, "bonus-double-count", "causal-mask-on-tree"])
def test_backends_agree_on_host_and_device_inputs(fault):
    """backend=triton (interpreted here) and backend=torch count the same, whether the
    hook passes numpy arrays and lists (staged in one copy) or tensors."""
    a, b = InlineAuditor("cpu", backend="triton"), InlineAuditor("cpu", backend="torch")
    for kw in hook_steps(fault):
        ra = a.audit(**kw)
        as_tensors = {k: (torch.as_tensor(np.asarray(v)) if isinstance(v, (list, np.ndarray)) else v)
                      for k, v in kw.items()}
        as_tensors["node_mask"] = kw["node_mask"].numpy()  # a host mask keeps its bool dtype
        rb = b.audit(**as_tensors)
        assert ra.flags.tolist() == rb.flags.tolist()
        want = node_mask_hashes(kw["node_mask"].numpy(), np.asarray(kw["n_nodes"]))  # the tracer's
        assert as_uint64(ra.mask_hash).tolist() == want.tolist()
        assert a.last is ra
    assert a.read() == b.read() == a.read_sync()
    snap = a.read()
    assert snap["steps"] == 4 * 6
    assert (snap["violating_steps"] > 0) == (fault is not None)


def test_auditor_rejects_bad_backend_and_oversized_trees():
    with pytest.raises(ValueError, match="backend must be auto, triton or torch"):
        InlineAuditor("cpu", backend="cuda")
    assert InlineAuditor("cpu").backend == "torch"  # auto on CPU: the torch reference
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available here"):
            InlineAuditor("cuda")
    aud = InlineAuditor("cpu", backend="triton")
    N = 65
    with pytest.raises(ValueError, match="above this kernel's limit of 64"):
        aud.audit(algo="chain", node_tokens=torch.zeros(1, N, dtype=torch.long),
                  parents=np.arange(-1, N - 1)[None], n_nodes=[N],
                  target_argmax=torch.zeros(1, N, dtype=torch.long), accepted_depth=[0],
                  commit_len=[1], finished=[False])
    assert aud.read()["steps"] == 0


def test_prometheus_collector_exposes_counters():
    aud = InlineAuditor("cpu", backend="torch")
    for kw in hook_steps("position-off-by-one", seeds=range(2)):
        aud.audit(**kw)
    reg = CollectorRegistry()
    reg.register(aud.collector())
    text = generate_latest(reg).decode()
    assert "specaudit_inline_audit_steps_total 12.0" in text
    assert "specaudit_inline_audit_violating_steps_total 12.0" in text
    assert 'specaudit_inline_audit_violations_total{code="SA201",rule="positions"} 12.0' in text
    for r in RULES:   # every flag names the catalog codes it reports
        assert re.search(rf'specaudit_inline_audit_violations_total{{code="SA[0-9,SA]+",rule="{r}"}}', text), r
    assert "# TYPE specaudit_inline_audit_violations_total counter" in text


class FakeEvent:
    """torch.cuda.Event stand-in: completes only when the test says so."""

    def __init__(self):
        self.done = True

    def record(self):
        self.done = False

    def query(self):
        return self.done


def test_counter_ring_never_blocks_and_never_reads_a_pending_copy():
    """The CUDA read path (pinned ring + events), driven with fake events on CPU: read()
    returns the newest completed copy, never one still in flight; the writer never
    overwrites the slot a reader would use, and skips a step when every slot is busy."""
    aud = InlineAuditor("cpu", backend="torch")
    aud._cuda = True  # white box: the ring's bookkeeping, without a GPU
    aud._slots = [torch.zeros(NUM_COUNTERS, dtype=torch.int64) for _ in range(3)]
    aud._events = [FakeEvent() for _ in range(3)]
    aud._seq, aud._pending = [0, 0, 0], [False] * 3
    one = next(hook_steps("position-off-by-one", seeds=[0]))
    one = {k: (torch.as_tensor(np.asarray(v)) if isinstance(v, (list, np.ndarray)) else v)
           for k, v in one.items()}  # tensors: staging would pin memory, which needs CUDA
    B = len(one["commit_len"])
    steps = lambda: aud.read()["steps"] // B
    aud.audit(**one)                       # step 1 -> slot 0, in flight
    assert steps() == 0                    # nothing completed yet: zeros, no wait
    aud._events[0].done = True
    assert steps() == 1
    aud.audit(**one)                       # step 2 -> slot 1 (slot 0 is the newest done)
    assert aud._pending == [False, True, False] and steps() == 1
    aud.audit(**one)                       # step 3 -> slot 2
    aud.audit(**one)                       # step 4: slots busy or kept -> skipped
    assert aud._seq == [1, 2, 3]
    aud._events[2].done = True
    assert steps() == 3                    # newest completed copy wins
    aud._events[1].done = True
    assert steps() == 3                    # an older copy completing later does not go back
    aud.audit(**one)                       # step 5 -> slot 0 (not the newest done, not pending)
    assert aud._seq == [4, 2, 3] and aud._pending == [True, False, False]
    aud._events[0].done = True
    assert steps() == 5 and aud.read_sync()["steps"] == 5 * B
    assert aud.read()["rules"]["positions"] == 5 * B


# ---------------------------------------------------------------- real engine
class RecordingAuditor(InlineAuditor):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = []

    def audit(self, **kw):
        res = super().audit(**kw)
        self.calls.append((kw, res))
        return res


# The interpreted Triton kernel costs ~0.2 s a step here, so it runs on two cases (the
# property tests already tie it to the reference); the torch backend runs the rest.
ENGINE_CASES = [
    (None, "chain", None, "torch"), (None, "tree", None, "triton"),
    ("commit-counter", "chain", "depth", "torch"), ("bonus-double-count", "tree", "depth", "torch"),
    ("eos-overcount", "chain", "eos", "torch"), ("causal-mask-on-tree", "tree", "mask", "triton"),
    ("position-off-by-one", "tree", "positions", "torch"),
]


@pytest.mark.parametrize("fault,algo,rule,backend", ENGINE_CASES)
def test_engine_inline_audit_catches_each_fault(models, fault, algo, rule, backend):
    """SpecEngine with engine.auditor set: a clean run never flags; each fault's rule
    counts violations; the on-device mask hash equals the tracer's for every step."""
    from specaudit.runtime.engine import Request, SpecConfig, SpecEngine
    from specaudit.tokenizer import default_prompts, encode
    target, drafter, _ = models
    # EOS = newline; eos-overcount needs an EOS inside an accepted commit: 4 x 40 tokens
    # of the embedded prompts hold one, the other faults show on every step
    n_prompts, new = (4, 40) if fault == "eos-overcount" else (2, 24)
    cfg = SpecConfig(algo=algo, budget=7 if algo == "chain" else 12, topk=1 if algo == "chain" else 3,
                     max_new_tokens=new, concurrency=2, eos_id=10, fault=fault)
    engine = SpecEngine(target, drafter, cfg)
    engine.auditor = RecordingAuditor("cpu", backend=backend)
    reqs = [Request(request_id=str(i), prompt=encode(p), max_new_tokens=new)
            for i, p in enumerate(default_prompts()[:n_prompts])]
    engine.run(reqs)
    snap = engine.auditor.read()
    assert snap["steps"] == engine.metrics.verify_steps > 0
    for kw, res in engine.auditor.calls:
        want = node_mask_hashes(kw["node_mask"].numpy(), np.asarray(kw["n_nodes"]))
        assert as_uint64(res.mask_hash).tolist() == want.tolist()
    if rule is None:
        assert snap["violating_steps"] == 0, snap
    else:
        assert snap["rules"][rule] > 0, snap
        others = {r for r, v in snap["rules"].items() if v} - {rule, "commit", "eos"}
        assert not others, f"{fault} also flagged {others}: {snap}"
