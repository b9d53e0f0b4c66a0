"""The speculative decoding loop: prefill, draft, verify, accept, commit, compact.

Greedy and lossless: the output equals plain greedy decoding of the target (tested).
Requests live in cache rows ("slots"); the running batch is verified in one forward
with per-request masks, positions and cache lengths, and requests join and leave it
between steps (continuous batching).

Per step and request r (seq_len = tokens already in r's KV cache):
    draft    drafter(h_prev, root) -> log-probs of the K positions after the root
    propose  chain [root, d1..d_budget] or a best-first tree of budget nodes
    verify   target forward over the nodes; keys/values land at slots seq_len + i
    accept   walk from the root along children that equal the target's argmax
    commit   accepted drafts + bonus (argmax at the last accepted node), cut at EOS
             or the token limit; the bonus becomes the next root
    compact  move the accepted path's KV rows to slots seq_len + 0..depth
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from specaudit.runtime.faults import get_fault
from specaudit.runtime.metrics import SpecMetrics
from specaudit.runtime.proposer import Draft, propose_chain, propose_tree
from specaudit.runtime.sampling import (
    SAMPLING_FAULTS,
    SamplingParams,
    categorical,
    sample_drafts,
    sampling_record,
    transform,
    verify_sampled,
)
from specaudit.runtime.verifier import accept_greedy, build_batch


@dataclass
class SpecConfig:
    algo: str = "chain"          # chain | tree
    budget: int = 7              # draft nodes per step, root excluded
    topk: int = 1                # most children per node (chain: 1)
    max_new_tokens: int = 256    # output tokens per request, the prefill's first token included
    concurrency: int = 1         # cache rows: requests verified together
    eos_id: int = 0
    fault: str | None = None
    sampling: SamplingParams | None = None  # None or temperature 0: greedy
    # sd of Gaussian noise added to the drafter's log-probs before proposing: a weaker
    # drafter on purpose (lower acceptance, every record still true); 0 = off; in run.json
    draft_noise: float = 0.0

    @property
    def sampled(self) -> bool:
        return self.sampling is not None and not self.sampling.greedy

    def validate(self, drafter_depth: int) -> None:
        if self.sampling is not None:
            self.sampling.validate()
        if self.fault in SAMPLING_FAULTS and not self.sampled:
            raise ValueError(f"fault {self.fault!r} lives in speculative sampling: give --temperature > 0")
        if self.algo not in ("chain", "tree"):
            raise ValueError(f"--algo must be chain or tree, not {self.algo!r}")
        if not (0 <= self.draft_noise < float("inf")):
            raise ValueError(f"draft_noise must be 0 or a positive number, not {self.draft_noise!r}")
        if self.budget < 1:
            raise ValueError(f"--budget must be at least 1 (got {self.budget})")
        if self.topk < 1:
            raise ValueError(f"--branching (topk) must be at least 1 (got {self.topk})")
        if self.topk > self.budget:
            raise ValueError(f"--branching ({self.topk}) cannot exceed --budget ({self.budget})")
        if self.algo == "chain" and self.topk != 1:
            raise ValueError("a chain has one child per node: use --branching 1 or --algo tree")
        if self.algo == "chain" and self.budget > drafter_depth:
            raise ValueError(f"a chain of budget {self.budget} needs a drafter of depth "
                             f">= {self.budget}; the drafter proposes {drafter_depth} positions")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be at least 1 (got {self.max_new_tokens})")
        if self.concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1 (got {self.concurrency})")
        get_fault(self.fault)


@dataclass
class Request:
    request_id: str
    prompt: list[int]
    max_new_tokens: int
    slot: int = -1
    seq_len: int = 0
    root: int = -1
    h_prev: torch.Tensor | None = None
    output: list[int] = field(default_factory=list)
    steps: int = 0
    finished: bool = False
    finish_reason: str | None = None
    prev_draft: Draft | None = None
    t_arrive: float = 0.0
    t_first: float = 0.0
    t_end: float = 0.0
    reference: list[int] | None = None


def cut_commit(accepted: list[int], bonus: int, remaining: int, eos_id: int,
               cut_at_eos: bool = True) -> tuple[list[int], str | None]:
    """The commit of one step: accepted drafts then the bonus, cut at EOS (inclusive)
    or at the request's remaining token budget. Returns (tokens, finish reason or None)."""
    full = accepted + [bonus]
    reason = None
    if eos_id in full:
        if cut_at_eos:
            full = full[: full.index(eos_id) + 1]
        reason = "eos"
    if len(full) >= remaining:
        if len(full) > remaining:
            full = full[:remaining]
            reason = "eos" if eos_id in full else "length"
        elif reason is None:
            reason = "length"
    return full, reason


class SpecEngine:
    """Chain and tree speculative decoding over a target (`CausalLM`) and a drafter.

    The tracer, when given, is called once per batched verify step with the tensors the
    verify forward really used, exactly as an external engine would call it.
    """

    def __init__(self, target, drafter, cfg: SpecConfig, tracer=None, device="cpu"):
        cfg.validate(drafter.depth)
        self.target, self.drafter, self.cfg = target, drafter, cfg
        self.tracer = tracer
        self.device = torch.device(device)
        self.fault = cfg.fault
        self.metrics = SpecMetrics(cfg.fault)
        self.cache = target.new_cache(cfg.concurrency)
        self.slots: list[Request | None] = [None] * cfg.concurrency
        # Optional on-device audit (specaudit.kernels): called once per step with the
        # device tensors, before any host copy; it must not synchronise.
        self.auditor = None
        # speculative sampling (runtime/sampling.py): one host generator per engine
        self.sp = cfg.sampling if cfg.sampled else None
        self.rng = np.random.default_rng(self.sp.seed) if self.sp is not None else None

    # ------------------------------------------------------------------ requests
    def check_fits(self, prompt_len: int, max_new: int) -> None:
        limit = self.target.max_seq_len
        if prompt_len < 1:
            raise ValueError("empty prompt")
        if prompt_len + max_new > limit:
            raise ValueError(f"prompt of {prompt_len} tokens + {max_new} new tokens exceeds the "
                             f"context of {limit} tokens")

    def free_slots(self) -> list[int]:
        return [i for i, r in enumerate(self.slots) if r is None]

    @property
    def running(self) -> list[Request]:
        return [r for r in self.slots if r is not None]

    @torch.inference_mode()
    def add(self, req: Request) -> Request:
        """Prefill a request into a free slot; it joins the next step's batch.

        The prefill's argmax is the first output token and the first root.
        """
        self.check_fits(len(req.prompt), req.max_new_tokens)
        free = self.free_slots()
        if not free:
            raise RuntimeError("no free slot")
        req.slot = free[0]
        req.t_arrive = req.t_arrive or time.time()
        pick = self._pick_first if self.sp is not None else None
        first, req.h_prev = prefill(self.target, self.cache, req.prompt, req.slot, self.device, pick)
        req.seq_len, req.root = len(req.prompt), first
        req.output = [first]
        req.t_first = time.time()
        self.metrics.on_prefill()
        if self.tracer is not None:
            self.tracer.begin_request(req.request_id, prompt_tokens=req.prompt, first_token=first,
                                      reference_tokens=req.reference, t_arrive=req.t_arrive)
        if first == self.cfg.eos_id or req.max_new_tokens <= 1:
            self._finish(req, "eos" if first == self.cfg.eos_id else "length")
        else:
            self.slots[req.slot] = req
        return req

    def abort(self, req: Request) -> None:
        if req.slot >= 0 and self.slots[req.slot] is req:
            self._finish(req, "abort")

    def _finish(self, req: Request, reason: str) -> None:
        req.finished, req.finish_reason, req.t_end = True, reason, time.time()
        if req.slot >= 0 and self.slots[req.slot] is req:
            self.slots[req.slot] = None
        if self.tracer is not None:
            self.tracer.end_request(req.request_id, output_tokens=req.output, finish_reason=reason,
                                    ttft_s=req.t_first - req.t_arrive, e2e_s=req.t_end - req.t_arrive)

    def _draft(self, reqs, h_prev, roots):
        """Drafter log-probs [R, K, V]. The embedded block drafter reads the target's hidden
        state at the root and the root; a causal-LM drafter (runtime/hf.py) reads each
        request's tokens, the root last."""
        if getattr(self.drafter, "needs_context", False):
            return self.drafter.draft([r.prompt + r.output for r in reqs])
        return self.drafter(h_prev, torch.from_numpy(roots).to(self.device))

    # ------------------------------------------- what greedy and sampled steps share
    def _draft_logprobs(self, reqs):
        """-> roots [R] int64, drafter log-probs [R, K, V] (numpy). draft_noise adds
        seeded Gaussian noise: acceptance falls, nothing recorded lies (and under
        sampling q is the noisy drafter's, so the output stays lossless)."""
        h_prev = torch.stack([r.h_prev for r in reqs])
        roots = np.array([r.root for r in reqs], dtype=np.int64)
        lp = self._draft(reqs, h_prev, roots).float().cpu().numpy()
        if self.cfg.draft_noise > 0:
            rng = self.__dict__.setdefault("_noise_rng", np.random.default_rng(12345))
            lp = lp + rng.normal(0.0, self.cfg.draft_noise, lp.shape).astype(lp.dtype)
        return roots, lp

    def _propose(self, roots, lp) -> list[Draft]:
        """Greedy proposals from the log-probs: a chain of budget drafts, or a best-first tree."""
        cfg = self.cfg
        if cfg.algo == "chain":
            return propose_chain(roots, lp, cfg.budget)
        return propose_tree(roots, lp, cfg.budget, cfg.topk)

    def _verify(self, reqs, drafts):
        """One target forward over every request's nodes -> (seq_lens [R], VerifyBatch,
        logits [R, N, V], hidden [R, N, H])."""
        dev = self.device
        seq_lens = np.array([r.seq_len for r in reqs], dtype=np.int64)
        vb = build_batch(drafts, seq_lens, dev, causal=self.fault == "causal-mask-on-tree",
                         position_shift=1 if self.fault == "position-off-by-one" else 0)
        slot_ids = [r.slot for r in reqs]
        # rows 0..R-1 (the usual case) let the model read its cache as views
        rows = None if slot_ids == list(range(len(reqs))) else torch.tensor(slot_ids, device=dev)
        logits, hidden = self.target(vb.tokens, vb.positions, self.cache,
                                     torch.from_numpy(seq_lens).to(dev), vb.node_mask, rows=rows)
        return seq_lens, vb, logits, hidden

    def _commit(self, reqs, drafts, vb, paths, next_tokens, hidden):
        """Commit each request's accepted path plus its next token (greedy: the bonus
        argmax; sampled: the residual or bonus draw), cut at EOS / max_new_tokens, count,
        move the accepted path's KV rows, advance the request.
        -> (committed tokens, accepted depths, commit lengths, finish reasons), one per request."""
        cfg = self.cfg
        commits, depths, commit_lens, reasons = [], [], [], []
        mv_rows, mv_src, mv_dst = [], [], []
        for i, (r, path, nxt) in enumerate(zip(reqs, paths, next_tokens)):
            accepted = vb.tokens_np[i, path[1:]].tolist()
            remaining = r.max_new_tokens - len(r.output)
            committed, reason = cut_commit(accepted, nxt, remaining, cfg.eos_id,
                                           cut_at_eos=self.fault != "eos-overcount")
            d, c = self.metrics.step_counters(path, int(vb.n_nodes[i]), committed)
            depths.append(d)
            commit_lens.append(c)
            commits.append(committed)
            reasons.append(reason)
            r.output.extend(committed)
            # KV compaction: the accepted path's rows go to seq_len + 0..depth.
            # The kv-compaction fault keeps rows 0..depth in node order instead.
            if self.fault != "kv-compaction":
                moved = np.flatnonzero(path != np.arange(len(path)))
                if moved.size:
                    mv_rows += [r.slot] * moved.size
                    mv_src += (r.seq_len + path[moved]).tolist()
                    mv_dst += (r.seq_len + moved).tolist()
            r.h_prev = hidden[i, int(path[-1])]
            r.root = nxt
            r.prev_draft = drafts[i]
            r.seq_len += len(path)
            r.steps += 1
        if mv_rows:
            t = lambda x: torch.tensor(x, device=self.device)
            self.cache.move_rows(t(mv_rows), t(mv_src), t(mv_dst))
        return commits, depths, commit_lens, reasons

    def _record(self, reqs, seq_lens, vb, argmax_t, margin_t, paths, depths, commit_lens, commits,
                fin_flags, times, **extra) -> None:
        """One tracer record for the step; times = (start, drafted, verified, committed);
        extra: sampling= (contract v2) for a sampled step."""
        cfg = self.cfg
        t0, t1, t2, t3 = times
        self.tracer.record_step(
            request_ids=[r.request_id for r in reqs], steps=[r.steps - 1 for r in reqs],
            algo=cfg.algo, budget=cfg.budget, topk=cfg.topk, seq_len=seq_lens,
            node_tokens=vb.tokens, n_nodes=vb.n_nodes, parents=vb.parents,
            positions=vb.positions, node_mask=vb.node_mask,
            draft_logprob=vb.logprob, target_argmax=argmax_t, target_margin=margin_t,
            accepted_path=paths, accepted_depth=depths, commit_len=commit_lens,
            committed_tokens=commits, finished=fin_flags,
            t_start=t0, draft_s=t1 - t0, verify_s=t2 - t1, step_s=t3 - t0, **extra)

    def _finish_done(self, reqs, reasons) -> list[Request]:
        """Finish the requests whose commit ended them; return those."""
        finished = []
        for r, reason in zip(reqs, reasons):
            if reason is not None:
                self._finish(r, reason)
                finished.append(r)
        return finished

    # ---------------------------------------------------------------------- step
    @torch.inference_mode()
    def step(self) -> list[Request]:
        """One batched verify over the running requests. Returns those that finished."""
        reqs = self.running
        if not reqs:
            return []
        if self.sp is not None:
            return self._step_sampled(reqs)
        cfg = self.cfg
        t0 = time.time()
        # draft: one drafter forward for the whole batch -> [R, K, V]
        roots, lp = self._draft_logprobs(reqs)   # [R], [R, K, V]
        drafts = self._propose(roots, lp)
        if self.fault == "stale-draft":
            drafts = [self._stale(r, d) for r, d in zip(reqs, drafts)]
        t1 = time.time()
        # verify: one target forward over all requests' nodes
        seq_lens, vb, logits, hidden = self._verify(reqs, drafts)
        top2 = logits.float().topk(2, dim=-1)
        argmax_t = top2.indices[..., 0]  # [R, N]
        margin_t = top2.values[..., 0] - top2.values[..., 1]
        argmax = argmax_t.cpu().numpy()
        t2 = time.time()
        # accept, commit, compact
        tokens_np = vb.tokens_np
        paths = accept_greedy(tokens_np, vb.parents, vb.n_nodes, argmax)
        commits, depths, commit_lens, reasons = self._commit(
            reqs, drafts, vb, paths, [int(argmax[i, p[-1]]) for i, p in enumerate(paths)], hidden)
        t3 = time.time()
        fin_flags = [reason is not None for reason in reasons]
        if self.auditor is not None:
            self.auditor.audit(algo=cfg.algo, node_tokens=vb.tokens, parents=vb.parents,
                               n_nodes=vb.n_nodes, target_argmax=argmax_t,
                               accepted_depth=depths, commit_len=commit_lens, finished=fin_flags,
                               node_mask=vb.node_mask, positions=vb.positions, seq_len=seq_lens,
                               eos_id=cfg.eos_id)
        if self.tracer is not None:
            self._record(reqs, seq_lens, vb, argmax_t, margin_t, paths, depths, commit_lens, commits,
                         fin_flags, (t0, t1, t2, t3))
        return self._finish_done(reqs, reasons)

    # ------------------------------------------------------- speculative sampling
    def _target_t(self) -> float:
        """Temperature of the target's transform; the temperature-one-side fault leaves
        the target at 1 while the drafter uses --temperature."""
        return 1.0 if self.fault == "temperature-one-side" else self.sp.temperature

    def _pick_first(self, logits: torch.Tensor) -> int:
        """The prefill's first token, drawn from the target's transformed distribution."""
        p = transform(logits.float().cpu().numpy(), self.sp, self._target_t())
        return int(categorical(self.rng, p))

    def _step_sampled(self, reqs: list[Request]) -> list[Request]:
        """One batched verify under speculative sampling (runtime/sampling.py).

        Same draft -> verify -> commit -> compact loop as the greedy step; what differs:
        drafts are drawn from q (chain: the block's K offsets; tree: the greedy
        best-first shape filled with i.i.d. draws), acceptance is the sampling test,
        the token after the last accepted node is drawn (residual or bonus), and the
        tracer gets the contract v2 record.
        """
        sp = self.sp
        t0 = time.time()
        roots, lp = self._draft_logprobs(reqs)   # [R], [R, K, V]
        q = transform(lp, sp)                                                             # [R, K, V]
        shapes = self._propose(roots, lp)   # the greedy shapes; tokens drawn below
        drafts = []
        for i, d in enumerate(shapes):
            toks = sample_drafts(self.rng, q[i], d.parents)
            toks[0] = roots[i]
            depth_lp = lp[i, np.maximum(_depths(d.parents) - 1, 0), toks]
            depth_lp[0] = 0.0
            drafts.append(Draft(toks, d.parents, depth_lp.astype(np.float32)))
        t1 = time.time()
        seq_lens, vb, logits, hidden = self._verify(reqs, drafts)
        lf = logits.float()
        top2 = lf.topk(2, dim=-1)
        argmax_t = top2.indices[..., 0]  # [R, N]
        margin_t = top2.values[..., 0] - top2.values[..., 1]
        lg = lf.cpu().numpy()                                    # [R, N, V]
        p_all = transform(lg, sp, self._target_t())              # [R, N, V]
        t2 = time.time()
        outs = [verify_sampled(self.rng, vb.tokens_np[i, : vb.n_nodes[i]], vb.parents[i, : vb.n_nodes[i]],
                               p_all[i, : vb.n_nodes[i]], q[i], lg[i, : vb.n_nodes[i]], self.fault)
                for i in range(len(reqs))]
        paths = [o.path for o in outs]
        commits, depths, commit_lens, reasons = self._commit(
            reqs, drafts, vb, paths, [o.token for o in outs], hidden)
        t3 = time.time()
        fin_flags = [reason is not None for reason in reasons]
        if self.tracer is not None:
            self._record(reqs, seq_lens, vb, argmax_t, margin_t, paths, depths, commit_lens, commits,
                         fin_flags, (t0, t1, t2, t3), sampling=sampling_record(outs, int(vb.tokens_np.shape[1])))
        return self._finish_done(reqs, reasons)

    def _stale(self, req: Request, fresh: Draft) -> Draft:
        """Fault: reuse the previous proposal's drafts under the new root."""
        prev = req.prev_draft
        if prev is None:
            return fresh
        toks = prev.tokens.copy()
        toks[0] = fresh.tokens[0]
        return Draft(toks, prev.parents, prev.logprob)

    # ------------------------------------------------------------------- drive
    def run(self, requests: list[Request], progress=None) -> list[Request]:
        """Run all requests with at most `concurrency` in flight (continuous batching)."""
        pending = list(requests)[::-1]
        done = []
        while pending or self.running:
            while pending and self.free_slots():
                r = self.add(pending.pop())
                if r.finished:
                    done.append(r)
                    if progress:
                        progress(r, 0)
            fin = self.step()
            done.extend(fin)
            if progress:
                for r in fin:
                    progress(r, len(r.output))
        return done


def prefill(target, cache, prompt: list[int], row: int, device, pick=None) -> tuple[int, torch.Tensor]:
    """Causal forward of one prompt into cache row `row` (from slot 0).

    Returns the first token (greedy, or `pick(logits [V])` when sampling) and the final
    hidden state at the last prompt token (the drafter's conditioning for the first root).
    """
    L = len(prompt)
    logits, h = target(torch.tensor([prompt], dtype=torch.long, device=device),
                       torch.arange(L, device=device)[None], cache,
                       torch.zeros(1, dtype=torch.long, device=device),
                       torch.ones(L, L, dtype=torch.bool, device=device).tril()[None],
                       rows=torch.tensor([row], device=device))
    if pick is not None:
        return int(pick(logits[0, -1])), h[0, -1]
    return int(logits[0, -1].argmax()), h[0, -1]


@torch.inference_mode()
def greedy_generate(target, prompts: list[list[int]], max_new_tokens: int, eos_id: int,
                    concurrency: int = 1, device="cpu") -> tuple[list[list[int]], float]:
    """Plain greedy decoding of the target, one token per forward, batched.

    The losslessness oracle and the speed baseline. Returns the outputs (first token
    included, cut at EOS inclusive or at max_new_tokens) and the wall seconds.
    """
    return _plain_generate(target, prompts, max_new_tokens, eos_id, concurrency, torch.device(device),
                           None, lambda lg: lg.argmax(-1).tolist())


def _plain_generate(target, prompts, max_new_tokens: int, eos_id: int, concurrency: int, dev, pick, next_tokens):
    """One token per forward, `concurrency` prompts at a time (the plain baselines).
    pick(logits [V]) -> the first token (None: greedy); next_tokens(logits [G, V]) -> [G]
    the next token of each request of the group. -> (outputs, wall seconds)."""
    outs: list[list[int]] = [None] * len(prompts)  # type: ignore[list-item]
    t0 = time.time()
    for lo in range(0, len(prompts), concurrency):
        group = list(range(lo, min(lo + concurrency, len(prompts))))
        cache = target.new_cache(len(group))
        cur, lens = [], []
        for j, gi in enumerate(group):
            t, _ = prefill(target, cache, prompts[gi], j, dev, pick)
            outs[gi] = [t]
            cur.append(t)
            lens.append(len(prompts[gi]))
        alive = [outs[gi][-1] != eos_id and max_new_tokens > 1 for gi in group]
        lens_t = torch.tensor(lens, device=dev)
        one = torch.ones(len(group), 1, 1, dtype=torch.bool, device=dev)
        while any(alive):
            tok = torch.tensor(cur, device=dev)[:, None]
            logits, _ = target(tok, lens_t[:, None], cache, lens_t, one)
            lens_t = lens_t + 1
            nxt = next_tokens(logits[:, -1])
            for j, gi in enumerate(group):
                if not alive[j]:
                    continue
                outs[gi].append(nxt[j])
                cur[j] = nxt[j]
                if nxt[j] == eos_id or len(outs[gi]) >= max_new_tokens:
                    alive[j] = False
    return outs, time.time() - t0


def _depths(parents: np.ndarray) -> np.ndarray:
    d = np.zeros(len(parents), dtype=np.int64)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


@torch.inference_mode()
def sample_generate(target, prompts: list[list[int]], max_new_tokens: int, eos_id: int,
                    sampling: SamplingParams, concurrency: int = 1, device="cpu",
                    temperature: float | None = None) -> tuple[list[list[int]], float]:
    """Plain sampling from the target, one token per forward, batched: the reference
    distribution `specaudit lossless` compares speculative sampling against.

    Same transform as the speculative path (runtime/sampling.py); its own generator
    seeded with sampling.seed. Returns the outputs and the wall seconds.
    """
    rng = np.random.default_rng(sampling.seed)
    pick = lambda lg: int(categorical(rng, transform(lg.float().cpu().numpy(), sampling, temperature)))
    # [G, V] logits -> [G] draws, from the same generator as the first token's
    draw = lambda lg: categorical(rng, transform(lg.float().cpu().numpy(), sampling, temperature)).tolist()
    return _plain_generate(target, prompts, max_new_tokens, eos_id, concurrency, torch.device(device), pick, draw)
