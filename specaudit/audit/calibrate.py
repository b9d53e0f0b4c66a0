"""Measure the step cost factor r(N, c) = (t_draft + t_verify(c, N)) / t_ar(c).

Three ways to a cost profile (JSON, read by `specaudit estimate --profile`):

measured   on the reference runtime: for each concurrency c, the same c prompts are
           decoded plainly (one target forward of [c, 1] per token, argmax to the host:
           exactly greedy_generate's step) and speculatively with a budget of N - 1
           draft nodes (SpecEngine.step: drafter forward, proposal, verify forward of
           [c, N], acceptance, commit, KV compaction). t_verify therefore includes the
           host work of accepting and committing, as a real engine's step does. Each
           (N, c) is measured `repeats` times on different prompts; after each
           speculative step the plain twin steps until it has decoded as many tokens,
           so both run at the same context and a busy machine slows both alike; r is
           the ratio of mean step times and r_std the standard error over the repeats.
manual     one number for every (N, c), typed by hand (the seed's r = 1.5)
trace      from a trace dataset's own draft_s + verify_s (one value per batched forward)
           against plain decode steps timed here on the same models at the run's
           concurrency and context
"""
from __future__ import annotations

import math
import platform
import time

import numpy as np

from specaudit.audit.cost_profile import CostEntry, CostProfile
from specaudit.audit.defaults import DEFAULT_C, DEFAULT_N
from specaudit.audit.observed_throughput import STALL_FACTOR
from specaudit.stats import mean_se
from specaudit.trace.safe_io import InputError


class _StepClock:
    """A tracer stand-in that keeps the engine's own per-step timings (no records)."""

    def __init__(self):
        self.draft, self.verify, self.step, self.batch = [], [], [], []

    def begin_request(self, *a, **k):
        pass

    def end_request(self, *a, **k):
        pass

    def record_step(self, *, draft_s, verify_s, step_s, request_ids, **k):
        self.draft.append(draft_s)
        self.verify.append(verify_s)
        self.step.append(step_s)
        self.batch.append(len(request_ids))


def algo_for(n_nodes: int, drafter_depth: int) -> tuple[str, int, int]:
    """(algo, budget, topk) that verifies N nodes: a chain when the drafter is deep
    enough, else a best-first tree with topk 4."""
    budget = n_nodes - 1
    if budget < 1:
        raise ValueError(f"N must be at least 2 (a root and one draft), got {n_nodes}")
    if budget <= drafter_depth:
        return "chain", budget, 1
    return "tree", budget, min(4, budget)


class PlainStepper:
    """Plain greedy decoding of len(prompts) requests, one timed step at a time
    (greedy_generate's step: one [c, 1] forward, argmax to the host). Prefill happens in
    the constructor and is not timed. Stepping it between speculative steps makes the
    two share whatever load the machine has at that moment."""

    def __init__(self, target, prompts, device="cpu"):
        import torch
        self.torch, self.target = torch, target
        self.dev = dev = torch.device(device)
        c = len(prompts)
        self.cache = target.new_cache(c)
        cur, lens = [], []
        with torch.inference_mode():
            for j, p in enumerate(prompts):
                L = len(p)
                logits, _ = target(torch.tensor([p], device=dev), torch.arange(L, device=dev)[None], self.cache,
                                   torch.zeros(1, dtype=torch.long, device=dev),
                                   torch.ones(L, L, dtype=torch.bool, device=dev).tril()[None],
                                   rows=torch.tensor([j], device=dev))
                cur.append(int(logits[0, -1].argmax()))
                lens.append(L)
        self.cur = cur
        self.lens_t = torch.tensor(lens, device=dev)
        self.one = torch.ones(c, 1, 1, dtype=torch.bool, device=dev)
        self.room = target.max_seq_len - max(lens)
        self.steps = 0

    def step(self) -> float:
        """One decode step of every row; returns its wall seconds."""
        torch = self.torch
        if self.steps >= self.room - 1:
            raise ValueError("plain decoding ran past the model's context")
        t0 = time.perf_counter()
        with torch.inference_mode():
            tok = torch.tensor(self.cur, device=self.dev)[:, None]
            logits, _ = self.target(tok, self.lens_t[:, None], self.cache, self.lens_t, self.one)
            self.lens_t = self.lens_t + 1
            self.cur = logits[:, -1].argmax(-1).tolist()
        self.steps += 1
        return time.perf_counter() - t0


def steady(walls) -> list[float]:
    """Step times without the stalls: a step over STALL_FACTOR x the median (a preemption on
    a shared machine, the allocator, the garbage collector) is the machine's, not the
    step's; as observed_throughput.observations_from_traces does, they are set apart unless they are
    a quarter of the steps or more (then the machine is that slow, and they stay)."""
    walls = list(walls)
    if not walls:
        return walls
    med = float(np.median(walls))
    kept = [w for w in walls if w <= STALL_FACTOR * med]
    return kept if len(walls) - len(kept) < len(walls) / 4 else walls


def plain_steps(target, prompts, steps: int, device) -> list[float]:
    """Wall seconds of `steps` plain decode steps of len(prompts) requests (prefill not timed)."""
    st = PlainStepper(target, prompts, device)
    return [st.step() for _ in range(steps)]


def spec_steps(target, drafter, prompts, n_nodes: int, max_new_tokens: int, device, eos_id=None, twin=None):
    """Wall seconds of every SpecEngine.step() decoding `prompts` with N-node drafts while
    the batch is full, and the engine's own draft_s / verify_s. Requests never finish early
    on EOS (eos_id is set to a token that does not occur). With `twin` (a PlainStepper),
    plain steps are timed right after each speculative step, as many as the speculative
    requests gained tokens, so both decode at the same context: returns their walls too."""
    import torch

    from specaudit.runtime.engine import Request, SpecConfig, SpecEngine
    algo, budget, topk = algo_for(n_nodes, drafter.depth)
    cfg = SpecConfig(algo=algo, budget=budget, topk=topk, max_new_tokens=max_new_tokens,
                     concurrency=len(prompts), eos_id=-1 if eos_id is None else eos_id)
    clock = _StepClock()
    eng = SpecEngine(target, drafter, cfg, tracer=clock, device=device)
    for i, p in enumerate(prompts):
        eng.add(Request(request_id=str(i), prompt=p, max_new_tokens=max_new_tokens))
    walls, plain = [], []
    reqs = list(eng.running)
    with torch.inference_mode():
        while eng.running and len(eng.running) == len(prompts):
            t0 = time.perf_counter()
            eng.step()
            walls.append(time.perf_counter() - t0)
            if twin is None:
                continue
            # keep the plain twin at the same context: as many plain steps as tokens the
            # speculative requests gained (at least one, so every gap gets a plain sample)
            done = sum(len(r.output) - 1 for r in reqs) / len(reqs)
            first = True
            while (first or twin.steps < done) and twin.steps < twin.room - 1:
                plain.append(twin.step())
                first = False
    n = len(walls)
    return walls, clock.draft[:n], clock.verify[:n], algo, plain


def measure_profile(models=None, n_grid=DEFAULT_N, c_grid=DEFAULT_C, repeats: int = 3, max_new_tokens: int = 96,
                    device: str = "cpu", prompts=None, progress=None) -> CostProfile:
    """Measure r(N, c) on the reference runtime (see the module docstring)."""
    import torch

    from specaudit.model import default_models
    from specaudit.tokenizer import default_prompts, encode
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1 (got {repeats})")
    target, drafter, info = models if models is not None else default_models(device)
    texts = prompts or default_prompts()
    toks = [(getattr(target, "encode", None) or encode)(t) for t in texts]  # a Hugging Face target's tokenizer
    toks = [t for t in toks if t and len(t) + max_new_tokens <= target.max_seq_len]
    if not toks:
        raise InputError(None, f"no prompt fits the context of {target.max_seq_len} with "
                               f"--max-new-tokens {max_new_tokens}")
    for n in n_grid:
        algo_for(n, drafter.depth)
    entries = []
    torch.manual_seed(0)
    k = 0
    for c in c_grid:
        if c < 1:
            raise ValueError(f"concurrency must be at least 1 (got {c})")
        per_n: dict[int, list] = {n: [] for n in n_grid}
        t_ar_all = []
        for rep in range(repeats):
            batch = [toks[(k + j) % len(toks)] for j in range(c)]
            k += c
            for n in n_grid:
                # a plain twin stepped between the speculative steps: same prompts, same load
                twin = PlainStepper(target, batch, device)
                walls, d, v, algo, ar = spec_steps(target, drafter, batch, n, max_new_tokens, device, twin=twin)
                if len(walls) < 2 or len(ar) < 2:
                    continue
                # mean step times, first step dropped (allocator warm-up) and stalls set apart
                # (steady): throughput is tokens over total time, so r is a ratio of means
                # (medians of the short plain step swing with the machine's load more than
                # the means do)
                t_ar, t_step = float(np.mean(steady(ar[1:]))), float(np.mean(steady(walls[1:])))
                per_n[n].append((t_step / t_ar, t_ar, float(np.mean(d[1:])), float(np.mean(v[1:])), algo))
                t_ar_all.append(t_ar)
                if progress:
                    progress(c, n, rep, t_step / t_ar)
        for n, rows in per_n.items():
            if not rows:
                continue
            rs = np.array([r[0] for r in rows])
            m_r, se, n_r = mean_se(rs)
            se = se if n_r > 1 else 0.05 * m_r  # one repeat: take the spread as 5%
            entries.append(CostEntry(
                r=round(float(rs.mean()), 5), r_std=round(se, 5), n_nodes=int(n), concurrency=int(c),
                t_ar_s=round(float(np.mean([r[1] for r in rows])), 7),
                t_draft_s=round(float(np.mean([r[2] for r in rows])), 7),
                t_verify_s=round(float(np.mean([r[3] for r in rows])), 7), samples=len(rows)))
    meta = {"method": "measured on the reference runtime (SpecEngine.step vs plain greedy steps)",
            "device": device, "repeats": repeats, "max_new_tokens": max_new_tokens,
            "host": platform.node(), "torch_threads": torch.get_num_threads(),
            "models": {k2: v2.get("sha256") for k2, v2 in (info or {}).items() if isinstance(v2, dict)}}
    return CostProfile(entries, source="measured", meta=meta)


def profile_from_traces(path, models=None, device="cpu", steps: int = 24) -> CostProfile:
    """r per run of a trace dataset: mean(draft_s + verify_s) over its batched forwards,
    over plain decode steps timed here at the run's concurrency and mean context."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from specaudit.model import default_models
    from specaudit.trace.schema import discover
    runs = discover([path])
    target, drafter, info = models if models is not None else default_models(device)
    entries = []
    for rf in runs:
        if not rf.step_files:
            raise InputError(rf.run_dir, "run has no steps-*.parquet: no timings to derive r from")
        try:
            t = pa.concat_tables([pq.read_table(f, columns=["t_start", "draft_s", "verify_s", "budget", "batch_size",
                                                            "seq_len"]) for f in rf.step_files])
        except Exception as e:
            raise InputError(rf.run_dir, f"cannot read step files: {e}") from None
        d = t.to_pydict()
        if not d["t_start"]:
            raise InputError(rf.run_dir, "no step rows")
        # one timing per batched forward: rows of one forward share t_start
        fw: dict[float, tuple] = {}
        for ts, a, b, bs in zip(d["t_start"], d["draft_s"], d["verify_s"], d["batch_size"]):
            fw[ts] = (a + b, bs)
        cfg = (rf.manifest or {}).get("config") or {}
        c = int(cfg.get("concurrency") or max(d["batch_size"]))
        full = [x for x, bs in fw.values() if bs == c] or [x for x, _ in fw.values()]
        mean_ctx = int(np.mean(d["seq_len"]))
        ctx = max(1, min(mean_ctx, target.max_seq_len - steps - 1))
        prompts = [[(i * 7 + j) % 250 + 1 for j in range(ctx)] for i in range(c)]
        ar = plain_steps(target, prompts, steps, device)[1:]
        t_ar = float(np.mean(ar))
        m, se, _ = mean_se(full)
        _, se_ar, _ = mean_se(ar)
        r = m / t_ar
        r_std = r * math.hypot(se / m if m else 0.0, se_ar / t_ar)
        entries.append(CostEntry(r=round(r, 5), r_std=round(r_std, 5), n_nodes=int(d["budget"][0]) + 1,
                                 concurrency=c, t_ar_s=round(t_ar, 7), t_verify_s=round(m, 7), samples=len(full)))
    # one entry per (N, c): average duplicates
    merged: dict = {}
    for e in entries:
        merged.setdefault((e.n_nodes, e.concurrency), []).append(e)
    out = []
    for (n, c), es in sorted(merged.items()):
        out.append(CostEntry(r=round(float(np.mean([e.r for e in es])), 5),
                             r_std=round(float(np.sqrt(np.mean([e.r_std ** 2 for e in es]))), 5),
                             n_nodes=n, concurrency=c, t_ar_s=es[0].t_ar_s, t_verify_s=es[0].t_verify_s,
                             samples=sum(e.samples or 0 for e in es)))
    return CostProfile(out, source="trace", meta={"method": "trace draft_s + verify_s over plain decode steps timed "
                                                            "on this machine", "traces": str(path), "device": device})


def parse_ints(s: str) -> tuple[int, ...]:
    """'2,4,8' -> (2, 4, 8): the --n-nodes / --concurrency grids (positive integers)."""
    try:
        out = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {s!r}") from None
    if not out or any(x < 1 for x in out):
        raise ValueError(f"expected positive integers, got {s!r}")
    return out


def make_profile(*, cost_factor=None, cost_factor_std=None, from_traces=None, n_grid=DEFAULT_N, c_grid=DEFAULT_C,
                 repeats: int = 3, max_new_tokens: int = 96, device="cpu", target=None, drafter=None,
                 trust_remote_code=False, progress=None) -> CostProfile:
    """`specaudit calibrate`: a hand-given r, r derived from a trace dataset, or r measured
    on the reference runtime (the embedded pair, or Hugging Face checkpoints `target` /
    `drafter`, the drafter drafting up to the largest N - 1). progress(c, n, repeat, r)."""
    if sum(x is not None for x in (cost_factor, from_traces)) > 1:
        raise ValueError("give at most one of --cost-factor and --from-traces")
    if cost_factor is not None:
        return CostProfile.manual(cost_factor, cost_factor_std)
    if from_traces:
        return profile_from_traces(from_traces, device=device)
    models = None
    if target:
        from specaudit.runtime.hf import load_models
        models = load_models(target, drafter, device=device, budget=max(n_grid) - 1,
                             trust_remote_code=trust_remote_code)
    elif drafter:
        raise ValueError("--drafter needs --target hf:PATH_OR_ID")
    return measure_profile(models=models, n_grid=n_grid, c_grid=c_grid, repeats=repeats,
                           max_new_tokens=max_new_tokens, device=device, progress=progress)


def format_profile(prof: CostProfile, out) -> str:
    """The text report of a written profile: one line per (N, c) entry."""
    lines = [f"cost profile ({prof.source}, {prof.coverage()}) -> {out}"]
    for e in prof.entries:
        where = "any N, any c" if e.n_nodes is None else f"N={e.n_nodes:<3d} c={e.concurrency:<3d}"
        times = (f"  t_ar {e.t_ar_s * 1e3:.2f} ms" if e.t_ar_s else "")
        lines.append(f"  {where}  r = {e.r:.3f} (sd {e.r_std:.3f}){times}")
    return "\n".join(lines) + "\n"
