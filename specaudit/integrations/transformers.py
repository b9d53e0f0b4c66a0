"""Trace transformers' own assisted generation (`model.generate(..., assistant_model=...)`).

    from specaudit.integrations.transformers import traced_generate
    out = traced_generate(model, input_ids, assistant_model=small, tracer=tracer,
                          max_new_tokens=64)            # greedy; any other generate kwargs

No fork of transformers: for the duration of the call the target's candidate generator is
wrapped in a recorder (its `get_candidates` gives the drafts, `update_candidate_strategy`
the target's scores over them and transformers' own match count), and a forward pre-hook
on the target reads the position ids each verify forward really used. Each verify
forward becomes one step row of the trace contract (docs/trace-contract.md), so
`specaudit check` audits transformers like any engine.

What transformers exposes, and what the recorder fills in (say so in your audit):
    node_tokens, positions   the root and the candidates; the positions the forward got
                             (position_ids, else cache_position) - captured
    target_argmax, margin    argmax and top-2 gap of the scores transformers passed to
                             update_candidate_strategy - captured
    draft_logprob            from the candidate logits when the assistant returns them
    accepted_depth           transformers' n_matches - captured. On the step where
                             generation ends inside the accepted prefix (EOS or the token
                             limit), transformers has already cut n_matches to the
                             committed count; there the recorder records the match count
                             before the cut, with transformers' own comparison
    accepted_path            0..accepted_depth (a chain)
    commit_len               n_matches + 1, the count transformers advances by - captured
    committed_tokens         what transformers appended to input_ids - captured
    mask_hash                not observable (transformers builds its causal mask
                             inside the model): recorded as the chain's causal mask, which
                             is what a causal LM applies to a chain of candidates
    finished                 the last step of the call
    prefill                  transformers fuses prefill into the first verify forward, so
                             the prompt's last token is recorded as `first_token` (the root
                             of step 0) and the rest as `prompt_tokens`; output_tokens is
                             that token followed by every commit

Greedy decoding only (do_sample=False): under sampling transformers draws its uniforms
inside `_speculative_sampling` and does not expose them, so the contract-v2 acceptance
test cannot be re-derived; `traced_generate` refuses do_sample=True with one line.

`bug=` injects a counter bug into the recorder (tests): "commit-counter" records the
commit length as 1 + (any draft accepted), the seed case.
"""
from __future__ import annotations

import time

import numpy as np

from specaudit.trace.schema import InputError

BUGS = ("commit-counter", "depth-plus-one")


class _StepLog:
    """What one generate call did, step by step (batch size 1)."""

    def __init__(self, bug: str | None = None):
        self.bug = bug
        self.steps: list[dict] = []
        self.pending: dict | None = None
        self.positions: list[np.ndarray] = []  # position ids of each target forward, in order

    def on_candidates(self, input_ids, cand, cand_logits, t0: float) -> None:
        cur = int(input_ids.shape[1])
        ids = input_ids[0].tolist()
        drafts = cand[0, cur:].tolist()
        lp = None
        if cand_logits is not None and len(drafts):
            import torch
            logp = torch.log_softmax(cand_logits[0].float(), dim=-1)  # [K, V]
            lp = [0.0] + logp[torch.arange(len(drafts)), torch.tensor(drafts)].tolist()
        self.pending = {"seq_len": cur - 1, "root": ids[-1], "drafts": drafts, "draft_logprob": lp,
                        "t_start": t0, "draft_s": time.time() - t0, "prev_len": cur,
                        "n_forwards": len(self.positions)}

    def on_verified(self, input_ids, scores, n_matches) -> None:
        p = self.pending
        self.pending = None
        if p is None:
            return
        now = time.time()
        N = 1 + len(p["drafts"])
        sc = scores[0, :N].float()                                    # [N, V]
        top2 = sc.topk(2, dim=-1)
        argmax = top2.indices[:, 0].tolist()
        margin = (top2.values[:, 0] - top2.values[:, 1]).tolist()
        committed = input_ids[0, p["prev_len"]:].tolist()
        n = int(n_matches)
        # transformers' own comparison, before any cut at EOS or the token limit
        eq = [d == a for d, a in zip(p["drafts"], argmax[:-1])]
        uncut = next((i for i, ok in enumerate(eq) if not ok), len(eq))
        depth = uncut if len(committed) < uncut + 1 else n
        commit = n + 1
        if self.bug == "commit-counter":
            commit = 1 + int(n > 0)
        elif self.bug == "depth-plus-one":
            depth += 1
        pos = self._positions(p, N)
        self.steps.append({"seq_len": p["seq_len"], "node_tokens": [p["root"], *p["drafts"]], "positions": pos,
                           "target_argmax": argmax, "target_margin": margin,
                           "draft_logprob": p["draft_logprob"], "accepted_path": list(range(uncut + 1)),
                           "accepted_depth": depth, "commit_len": commit, "committed_tokens": committed,
                           "t_start": p["t_start"], "draft_s": p["draft_s"],
                           "verify_s": now - p["t_start"] - p["draft_s"], "step_s": now - p["t_start"]})

    def _positions(self, p: dict, N: int) -> list[int]:
        """The last N position ids of the target forward that verified this step."""
        if len(self.positions) > p["n_forwards"]:
            ids = self.positions[p["n_forwards"]]
            if len(ids) >= N:
                return [int(x) for x in ids[-N:]]
        return [p["seq_len"] + i for i in range(N)]  # not observable: what a causal LM uses


class _Recorder:
    """Proxy around transformers' candidate generator: records, then delegates."""

    def __init__(self, inner, log: _StepLog):
        self._inner, self._log = inner, log

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def get_candidates(self, input_ids, *args, **kwargs):
        t0 = time.time()
        cand, logits = self._inner.get_candidates(input_ids, *args, **kwargs)
        self._log.on_candidates(input_ids, cand, logits, t0)
        return cand, logits

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        self._log.on_verified(input_ids, scores, num_matches)
        return self._inner.update_candidate_strategy(input_ids, scores, num_matches)


def traced_generate(model, input_ids, *, assistant_model, tracer, request_id: str = "0",
                    bug: str | None = None, **generate_kwargs):
    """`model.generate(input_ids, assistant_model=..., **generate_kwargs)`, traced into `tracer`.

    One request per call (transformers' assisted generation runs batch size 1). Returns
    what generate returns. The tracer's manifest should describe the pair (see
    `assisted_manifest`).
    """
    import torch

    if bug is not None and bug not in BUGS:
        raise InputError(None, f"unknown bug {bug!r} (one of {', '.join(BUGS)})")
    if generate_kwargs.get("do_sample"):
        raise InputError(None, "tracing sampled assisted generation is not supported: transformers does not "
                               "expose the uniform draws of its acceptance test (greedy only)")
    if input_ids.shape[0] != 1:
        raise InputError(None, "assisted generation runs one request at a time (batch size 1)")
    log = _StepLog(bug)
    original = model._get_candidate_generator

    def wrapped(*args, **kwargs):
        return _Recorder(original(*args, **kwargs), log)

    def grab_positions(_module, args, kwargs):
        ids = kwargs.get("position_ids")
        if ids is None:
            ids = kwargs.get("cache_position")
        if ids is not None:
            log.positions.append(ids.reshape(-1).tolist())

    prompt = input_ids[0].tolist()
    t_arrive = time.time()
    hook = model.register_forward_pre_hook(grab_positions, with_kwargs=True)
    model._get_candidate_generator = wrapped
    try:
        with torch.inference_mode():
            out = model.generate(input_ids, assistant_model=assistant_model, do_sample=False, **generate_kwargs)
    finally:
        hook.remove()
        del model._get_candidate_generator  # back to the class's method
    t_end = time.time()
    seqs = out.sequences if hasattr(out, "sequences") else out
    _emit(tracer, request_id, prompt, seqs[0].tolist(), log.steps, generate_kwargs, model, t_arrive, t_end)
    return out


def _emit(tracer, rid, prompt, sequence, steps, kw, model, t_arrive, t_end) -> None:
    """Write one request's steps and its requests row through the tracer API."""
    tracer.begin_request(rid, prompt_tokens=prompt[:-1], first_token=prompt[-1], t_arrive=t_arrive)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else []))
    for i, s in enumerate(steps):
        N = len(s["node_tokens"])
        last = i == len(steps) - 1
        parents = np.arange(-1, N - 1, dtype=np.int64)[None]
        tracer.record_step(
            request_ids=[rid], steps=[i], algo="chain", budget=N - 1, topk=1, seq_len=[s["seq_len"]],
            node_tokens=np.array([s["node_tokens"]]), n_nodes=[N], parents=parents,
            positions=np.array([s["positions"]]), node_mask=np.tril(np.ones((1, N, N), dtype=bool)),
            target_argmax=np.array([s["target_argmax"]]), target_margin=np.array([s["target_margin"]], np.float32),
            draft_logprob=np.array([s["draft_logprob"]], np.float32) if s["draft_logprob"] else None,
            accepted_path=[s["accepted_path"]], accepted_depth=[s["accepted_depth"]],
            commit_len=[s["commit_len"]], committed_tokens=[s["committed_tokens"]], finished=[last],
            t_start=s["t_start"], draft_s=s["draft_s"], verify_s=s["verify_s"], step_s=s["step_s"], batch_size=1)
    out = [prompt[-1], *sequence[len(prompt):]]
    reason = "eos" if (len(out) > 1 and out[-1] in eos) else "length"
    tracer.end_request(rid, output_tokens=out, finish_reason=reason, ttft_s=(steps[0]["t_start"] + steps[0]["step_s"]
                       - t_arrive) if steps else t_end - t_arrive, e2e_s=t_end - t_arrive)


def assisted_manifest(run_id: str, model, assistant_model, *, max_new_tokens: int, target_name: str = "target",
                      drafter_name: str = "assistant") -> dict:
    """run.json for a traced assisted-generation run (engine: transformers, its version).

    max_new_tokens is generate's limit + 1: the recorded output starts with the prompt's
    last token (the root of step 0, see the module docstring)."""
    import transformers

    from specaudit.trace.schema import SCHEMA_VERSION
    k = int(getattr(assistant_model.generation_config, "num_assistant_tokens", 20) or 20)
    return {
        "schema_version": SCHEMA_VERSION, "run_id": run_id,
        "engine": {"name": "transformers-assisted-generation", "version": transformers.__version__},
        "models": {"target": {"name": target_name, "sha256": None, "architecture": type(model).__name__},
                   "drafter": {"name": drafter_name, "sha256": None,
                               "architecture": type(assistant_model).__name__}},
        "config": {"algo": "chain", "budget": k, "topk": 1, "block_size": k + 1, "concurrency": 1,
                   "max_new_tokens": max_new_tokens + 1, "dtype": str(next(model.parameters()).dtype).split(".")[-1],
                   "device": str(next(model.parameters()).device), "seed": None, "fault": None,
                   "eos_id": _first_eos(model)},
        "conventions": {"accept_length": "includes_bonus", "mean": "pooled"},
        "host": {}, "started_at": time.time(),
    }


def _first_eos(model):
    eos = model.generation_config.eos_token_id
    return eos[0] if isinstance(eos, (list, tuple)) and eos else eos
