"""Contract v2 (speculative sampling) trace rows from what vllm_sampling_probe.py captured.

One step row per (request, verify forward) of vLLM, through specaudit's Tracer and
Parquet sink, so that `specaudit check` audits vLLM's decisions with the catalog:

    node_tokens, positions   the verify forward's input buffers (root, then the drafts)
    target_argmax, margin    the verify logits, raw
    accepted_path            the drafts vLLM's rejection sampler returned unchanged
    accepted_depth           vLLM's own count: tokens it returned minus one (scheduler.py)
    committed_tokens         the tokens vLLM appended to the request
    draft_prob               1 per draft: draft_sample_method "greedy" drafts the argmax,
                             and vLLM's sampler treats its probability as one-hot
    target_prob              p(x) of each draft under the REQUEST's temperature, from
                             the raw logits (logits / T, softmax: the contract's
                             transform), not from what vLLM divided by
    accept_u                 vLLM's own uniform for each draft it tested
    sampled_*                the token vLLM drew after the accepted drafts (-1 when it
                             produced none), its probabilities at the request's
                             temperature, its rank among the raw logits

Where vLLM's sampler used another temperature than the request's, its decisions do not
follow u < p/q for these p: SA801 names each one, SA804 the run's rate.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _soft(raw, T):
    """[N, V] raw logits -> softmax(raw / T) in float64 (T > 0)."""
    import torch
    return torch.softmax(raw.double() / float(T), dim=-1)


def step_fields(s: dict, T: float, V: int) -> dict:
    """The contract fields of one captured verify step (root + nd drafts)."""
    nan = float("nan")
    nodes = [int(x) for x in s["node_tokens"]]
    N, nd = len(nodes), len(nodes) - 1
    drafts = nodes[1:]
    raw = s["raw"]                                            # [N, V] raw verify logits
    out = [int(t) for t in s["out"]]
    valid = [t for t in out if 0 <= t < V]                    # what vLLM's parse_output keeps
    a = 0
    while a < nd and out[a] == drafts[a]:
        a += 1
    top2 = raw.topk(2, dim=-1)
    p = _soft(raw, T)                                         # [N, V] at the request's temperature
    tested = min(a + 1, nd)                                   # drafts 1..a accepted, a+1 rejected
    u = [nan] * N
    for j in range(tested):
        u[j + 1] = float(s["u"][j]) if j < len(s["u"]) else nan
    t = out[a] if a < len(out) else -1
    samp = dict(sampled_token=-1, sampled_prob=nan, sampled_target_prob=nan, sampled_draft_prob=nan,
                sampled_rank=-1)
    if 0 <= t < V:
        pt = float(p[a, t])
        if a < nd:   # after a rejection: the residual max(0, p - onehot(draft)) renormalised
            prob = pt / max(1e-300, 1.0 - float(p[a, drafts[a]]))
            qd = 0.0
        else:        # every draft accepted: the bonus from p
            prob, qd = pt, nan
        samp = dict(sampled_token=t, sampled_prob=prob, sampled_target_prob=pt, sampled_draft_prob=qd,
                    sampled_rank=int((raw[a] > raw[a, t]).sum()))
    return dict(
        N=N, nodes=nodes, positions=[int(x) for x in s["positions"]], seq_len=int(s["positions"][0]),
        target_argmax=top2.indices[:, 0].tolist(), target_margin=(top2.values[:, 0] - top2.values[:, 1]).tolist(),
        path=list(range(a + 1)), depth=max(len(valid) - 1, 0) if nd else 0, valid=valid,
        sampling=dict(draft_prob=[1.0] * N, target_prob=[1.0] + [float(p[j, drafts[j]]) for j in range(nd)],
                      accept_u=u, **samp))


def write_trace(steps: list, outputs: list, dataset: str, *, temperature: float, model: str, k: int,
                seed, vllm_version: str, run_id: str | None = None) -> dict:
    """Write the run; return {"run_id", "dir", "rows", "mismatch"} (mismatch: steps whose
    returned tokens differ from what vLLM appended: there should be none)."""
    sys.path.insert(0, str(REPO))
    import numpy as np

    from specaudit.trace.parquet import ParquetSink
    from specaudit.trace.schema import SAMPLING_SCHEMA_VERSION
    from specaudit.trace.tracer import Tracer

    V = int(steps[0]["raw"].shape[-1]) if steps else 0
    run_id = run_id or f"vllm-probe-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    manifest = {
        "schema_version": SAMPLING_SCHEMA_VERSION, "run_id": run_id,
        "engine": {"name": "vllm", "version": vllm_version, "traced_by": "scripts/vllm_sampling_probe.py"},
        "models": {"target": {"name": model, "sha256": None}, "drafter": {"name": model, "sha256": None}},
        "config": {"algo": "chain", "budget": k, "topk": 1, "block_size": k + 1, "concurrency": len(outputs),
                   "max_new_tokens": max((len(o["gen"]) for o in outputs), default=0), "dtype": "float32",
                   "device": "cpu", "seed": seed, "fault": None,
                   "eos_id": -1,   # ignore_eos: no token ends a request (None would read as token 0)
                   "sampling": {"temperature": temperature, "top_p": 1.0, "top_k": None, "seed": seed,
                                "transform": "logits / T, softmax (the request's SamplingParams)",
                                "chain_scheme": "Leviathan et al. 2023; greedy drafts: q one-hot",
                                "tree_scheme": None, "accept": "u < p(x) / q(x), u ~ U[0, 1)"}},
        "conventions": {"accept_length": "includes_bonus", "mean": "pooled"},
        "host": {}, "started_at": time.time()}
    tr = Tracer([ParquetSink(dataset, run_id)], manifest, run_id)
    by_user = {o["request_id"]: o for o in outputs}
    rows = mismatch = 0
    tally = {"drafted": 0, "accepted": 0, "vllm_counted": 0, "no_drawn_token": 0}
    order: list = []
    per: dict = {}
    for s in steps:
        per.setdefault(s["rid"], []).append(s)
        if s["rid"] not in order:
            order.append(s["rid"])
    for rid in order:
        o = by_user.get(rid.split("-")[0]) or by_user.get(rid)
        if o is None:
            continue
        prompt, gen = o["prompt"], o["gen"]
        tr.begin_request(rid, prompt_tokens=prompt, first_token=gen[0], t_arrive=o["t0"])
        ptr, i = 1, 0
        for s in per[rid]:
            if s["positions"][-1] < len(prompt):        # the prefill (it produced gen[0])
                continue
            if ptr >= len(gen):
                break
            f = step_fields(s, temperature, V)
            committed = gen[ptr:ptr + len(f["valid"])]
            mismatch += committed != f["valid"][:len(committed)]
            ptr += len(committed)
            N = f["N"]
            tr.record_step(
                request_ids=[rid], steps=[i], algo="chain", budget=k, topk=1, seq_len=[f["seq_len"]],
                node_tokens=np.array([f["nodes"]]), n_nodes=[N], parents=np.arange(-1, N - 1)[None],
                positions=np.array([f["positions"]]), node_mask=np.tril(np.ones((1, N, N), dtype=bool)),
                target_argmax=np.array([f["target_argmax"]]),
                target_margin=np.array([f["target_margin"]], np.float32),
                accepted_path=[f["path"]], accepted_depth=[f["depth"]], commit_len=[len(committed)],
                committed_tokens=[committed], finished=[ptr >= len(gen)],
                sampling={key: np.array([v]) for key, v in f["sampling"].items()},
                t_start=s["t"], draft_s=0.0, verify_s=0.0, step_s=0.0, batch_size=s["batch"])
            i += 1
            rows += 1
            tally["drafted"] += N - 1
            tally["accepted"] += len(f["path"]) - 1
            tally["vllm_counted"] += f["depth"]
            tally["no_drawn_token"] += f["sampling"]["sampled_token"] == -1
        tr.end_request(rid, output_tokens=gen, finish_reason="length", ttft_s=0.0,
                       e2e_s=max(0.0, per[rid][-1]["t"] - o["t0"]))
    tr.close()
    # accepted: drafts the sampler returned unchanged; vllm_counted: what vLLM's metrics
    # counted for the same steps (one less on a step that drew no token after a rejection)
    return {"run_id": run_id, "dir": str(Path(dataset) / f"run_id={run_id}"), "rows": rows,
            "mismatch": int(mismatch), "nan_steps": sum(1 for s in steps if math.isnan(float(s["raw"].sum()))),
            **{k: int(v) for k, v in tally.items()}}
