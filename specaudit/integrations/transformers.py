"""Trace transformers' own assisted generation (`model.generate(..., assistant_model=...)`).

    from specaudit.integrations.transformers import traced_generate
    out = traced_generate(model, input_ids, assistant_model=small, tracer=tracer,
                          max_new_tokens=64)            # greedy, or do_sample=True; any generate kwargs

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

Sampled (do_sample=True, contract v2). transformers tests each draft with
`_speculative_sampling` (Leviathan et al.: u <= p/q, a chain, then the residual or the
bonus); what it exposes and what the recorder records:
    draft_prob         q(x_i): softmax of the candidate logits the assistant returns
                       (its processed scores, the distribution it drew from) - captured
    target_prob        p(x_i): softmax of the processed target logits transformers passes
                       to update_candidate_strategy (the p its test uses) - captured
    accept_u           NOT exposed: the uniforms are drawn inside _speculative_sampling and
                       dropped. Recorded as unknown: all NaN, with
                       run.json config.sampling.unknown = ["accept_u", "sampled_token"]
    accepted_path      0..n where n + 1 = the tokens transformers committed - captured
    sampled_token      the last committed token - captured; its probabilities are
                       re-derived from the captured p and q exactly as transformers
                       draws it (residual norm(max(0, p - q)) at node n, or p at the
                       bonus); sampled_rank among the raw target logits (a forward hook)
    cut step           when EOS or the token limit ends generation inside the accepted
                       drafts, transformers discards the drawn token and cuts n: the
                       commit is drafts only, the path is what was committed, and the
                       drawn token is unknown (sampled_token -1, probabilities NaN)
So `specaudit check` checks on these rows everything that does not need u: shapes and
values (SA800), an accepted draft has p > 0 and a rejected one p/q < 1 (SA801's bounds),
the residual and support (SA802, SA803), the commit (SA307), and the run's acceptance
count against sum(min(1, p/q)) (SA804, which needs no uniforms). assistant_ensemble_weight
(a relaxed, lossy test) is refused.

`bug=` injects a counter bug into the recorder (tests): "commit-counter" records the
commit length as 1 + (any draft accepted), the seed case; "depth-plus-one" counts the
bonus as a draft.
"""
from __future__ import annotations

import time

import numpy as np

from specaudit.trace.safe_io import InputError

BUGS = ("commit-counter", "depth-plus-one")


class _StepLog:
    """What one generate call did, step by step (batch size 1)."""

    def __init__(self, bug: str | None = None, sampled: bool = False):
        self.bug = bug
        self.sampled = sampled
        self.raw_logits = None   # [T, V] the last target forward's logits (sampled_rank)
        self.problem: str | None = None
        self.steps: list[dict] = []
        self.pending: dict | None = None
        self.positions: list[np.ndarray] = []  # position ids of each target forward, in order

    def on_candidates(self, input_ids, cand, cand_logits, t0: float) -> None:
        cur = int(input_ids.shape[1])
        ids = input_ids[0].tolist()
        drafts = cand[0, cur:].tolist()
        lp, q = None, None
        if cand_logits is not None and len(drafts):
            import torch
            logp = torch.log_softmax(cand_logits[0].float(), dim=-1)  # [K, V]
            lp = [0.0] + logp[torch.arange(len(drafts)), torch.tensor(drafts)].tolist()
            if self.sampled:
                q = cand_logits[0].float().softmax(-1)                 # [K, V] as _speculative_sampling
        elif self.sampled and len(drafts) and self.problem is None:
            self.problem = ("the candidate generator returned no logits: transformers then samples without "
                            "the speculative test (no q to record)")
        self.pending = {"seq_len": cur - 1, "root": ids[-1], "drafts": drafts, "draft_logprob": lp, "q": q,
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
        raw = self.raw_logits
        if self.sampled and raw is not None and raw.shape[0] >= N:
            sc = raw[-N:].float()   # the verify logits themselves (the processed ones hold -inf)
        top2 = sc.topk(2, dim=-1)
        argmax = top2.indices[:, 0].tolist()
        margin = (top2.values[:, 0] - top2.values[:, 1]).tolist()
        committed = input_ids[0, p["prev_len"]:].tolist()
        n = int(n_matches)
        # transformers' own comparison, before any cut at EOS or the token limit
        eq = [d == a for d, a in zip(p["drafts"], argmax[:-1])]
        uncut = next((i for i, ok in enumerate(eq) if not ok), len(eq))
        depth = uncut if len(committed) < uncut + 1 else n
        samp = self._sampling(p, scores, committed) if self.sampled else None
        if samp is not None:   # accepted drafts: what was committed (no argmax comparison)
            uncut = depth = samp.pop("depth")
        commit = n + 1
        if self.bug == "commit-counter":
            commit = 1 + int(n > 0)
        elif self.bug == "depth-plus-one":
            depth += 1
        pos = self._positions(p, N)
        self.steps.append({"sampling": samp, "seq_len": p["seq_len"], "node_tokens": [p["root"], *p["drafts"]],
                           "positions": pos,
                           "target_argmax": argmax, "target_margin": margin,
                           "draft_logprob": p["draft_logprob"], "accepted_path": list(range(uncut + 1)),
                           "accepted_depth": depth, "commit_len": commit, "committed_tokens": committed,
                           "t_start": p["t_start"], "draft_s": p["draft_s"],
                           "verify_s": now - p["t_start"] - p["draft_s"], "step_s": now - p["t_start"]})

    def _sampling(self, p: dict, scores, committed: list[int]) -> dict:
        """Contract v2 values of one sampled step from transformers' p and q (module doc)."""
        import torch
        drafts, q = p["drafts"], p["q"]
        K, N, c = len(drafts), len(drafts) + 1, len(committed)
        pt = scores[0, :N].float().softmax(-1)                                 # [N, V] p at each node
        if q is None:   # no drafts (or no logits): every row still needs its lists
            q = torch.zeros(max(K, 1), pt.shape[-1])
        d = torch.tensor(drafts, dtype=torch.long)
        nan = float("nan")
        out = {"draft_prob": [1.0] + q[torch.arange(K), d].tolist(),            # q(x_i) of node i+1
               "target_prob": [1.0] + pt[torch.arange(K), d].tolist(),          # p at its parent
               "accept_u": [nan] * N}
        cut = c <= K and committed == drafts[:c]   # a drawn token never equals the draft it replaced
        if cut:
            out.update(sampled_token=-1, sampled_prob=nan, sampled_target_prob=nan, sampled_draft_prob=nan,
                       sampled_rank=-1, depth=c)
            return out
        n, t = c - 1, committed[-1]
        if n < K:   # a rejection at node n+1: t was drawn from the residual at node n
            res = (pt[n] - q[n]).clamp(min=0)
            tot = float(res.sum())
            prob = float(res[t]) / tot if tot > 0 else nan
            qd = float(q[n, t])
        else:       # every draft accepted: the bonus from p
            prob, qd = float(pt[n, t]), nan
        raw = self.raw_logits
        rank = int((raw[-N + n] > raw[-N + n, t]).sum()) if raw is not None and raw.shape[0] >= N else -1
        out.update(sampled_token=t, sampled_prob=prob, sampled_target_prob=float(pt[n, t]),
                   sampled_draft_prob=qd, sampled_rank=rank, depth=n)
        return out

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
    sampled = bool(generate_kwargs.pop("do_sample", False))
    w = generate_kwargs.get("assistant_ensemble_weight",
                            getattr(model.generation_config, "assistant_ensemble_weight", None))
    if w is not None:
        raise InputError(None, f"assistant_ensemble_weight={w}: a relaxed (lossy) acceptance test; specaudit "
                               "traces the exact test only (leave it unset)")
    if input_ids.shape[0] != 1:
        raise InputError(None, "assisted generation runs one request at a time (batch size 1)")
    log = _StepLog(bug, sampled=sampled)
    original = model._get_candidate_generator

    def wrapped(*args, **kwargs):
        return _Recorder(original(*args, **kwargs), log)

    def grab_positions(_module, args, kwargs):
        ids = kwargs.get("position_ids")
        if ids is None:
            ids = kwargs.get("cache_position")
        if ids is not None:
            log.positions.append(ids.reshape(-1).tolist())

    def grab_logits(_module, _args, output):   # [T, V] raw logits of the last target forward
        lg = getattr(output, "logits", None)
        log.raw_logits = lg[0].detach() if lg is not None else None

    prompt = input_ids[0].tolist()
    t_arrive = time.time()
    hooks = [model.register_forward_pre_hook(grab_positions, with_kwargs=True)]
    if sampled:
        hooks.append(model.register_forward_hook(grab_logits))
    model._get_candidate_generator = wrapped
    try:
        with torch.inference_mode():
            out = model.generate(input_ids, assistant_model=assistant_model, do_sample=sampled, **generate_kwargs)
    finally:
        for h in hooks:
            h.remove()
        del model._get_candidate_generator  # back to the class's method
    if log.problem:
        raise InputError(None, f"cannot trace this sampled generate: {log.problem}")
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
            sampling=None if s["sampling"] is None else {
                k: np.array([v]) for k, v in s["sampling"].items()},   # [1, N] lists, [1] scalars
            t_start=s["t_start"], draft_s=s["draft_s"], verify_s=s["verify_s"], step_s=s["step_s"], batch_size=1)
    out = [prompt[-1], *sequence[len(prompt):]]
    reason = "eos" if (len(out) > 1 and out[-1] in eos) else "length"
    tracer.end_request(rid, output_tokens=out, finish_reason=reason, ttft_s=(steps[0]["t_start"] + steps[0]["step_s"]
                       - t_arrive) if steps else t_end - t_arrive, e2e_s=t_end - t_arrive)


# what transformers' sampled assisted generation does not expose (module doc; contract v2)
UNKNOWN = ["accept_u", "sampled_token"]


def assisted_manifest(run_id: str, model, assistant_model, *, max_new_tokens: int, target_name: str = "target",
                      drafter_name: str = "assistant", sampling: dict | None = None) -> dict:
    """run.json for a traced assisted-generation run (engine: transformers, its version).

    max_new_tokens is generate's limit + 1: the recorded output starts with the prompt's
    last token (the root of step 0, see the module docstring). `sampling`: for a sampled
    run, generate's {"temperature", "top_p", "top_k", "seed"}; the manifest then says
    contract v2 and lists the values transformers does not expose (UNKNOWN)."""
    import transformers

    from specaudit.trace.schema import SAMPLING_SCHEMA_VERSION, SCHEMA_VERSION
    k = int(getattr(assistant_model.generation_config, "num_assistant_tokens", 20) or 20)
    m = {
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
    if sampling is not None:
        m["schema_version"] = SAMPLING_SCHEMA_VERSION
        gc = model.generation_config   # what generate falls back on: the model's, then its global defaults
        dflt = getattr(gc, "_get_default_generation_params", dict)()
        eff = {k: sampling[k] if k in sampling else (getattr(gc, k, None) if getattr(gc, k, None) is not None
                                                     else dflt.get(k)) for k in ("temperature", "top_p", "top_k")}
        m["config"]["sampling"] = {
            "temperature": eff["temperature"] if eff["temperature"] is not None else 1.0,
            "top_p": eff["top_p"] if eff["top_p"] is not None else 1.0,
            "top_k": eff["top_k"] or None, "seed": sampling.get("seed"),
            "transform": "transformers' logits processors (the target's and the assistant's generation config)",
            "chain_scheme": "Leviathan et al. 2023 (transformers _speculative_sampling)", "tree_scheme": None,
            "accept": "u <= p(x) / q(x), u ~ U[0, 1)", "unknown": list(UNKNOWN)}
    return m


def _first_eos(model):
    eos = model.generation_config.eos_token_id
    return eos[0] if isinstance(eos, (list, tuple)) and eos else eos
