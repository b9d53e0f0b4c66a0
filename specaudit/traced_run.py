"""`specaudit run` as a library function: the reference runtime, traced into a dataset.

Wiring only (model -> runtime -> tracer -> sinks); the CLI wraps `run_traced`, and so
do the tests, the demo, the A/B tool and the benchmarks.
"""
from __future__ import annotations

import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from specaudit import __version__
from specaudit.runtime.host import check_device, host_info, set_torch_threads
from specaudit.tokenizer import default_prompts, encode, load_prompts
from specaudit.trace.derived import means, run_means
from specaudit.trace.safe_io import InputError
from specaudit.trace.schema import SAMPLING_SCHEMA_VERSION, SCHEMA_VERSION, manifest_conventions

MIN_FREE_BYTES = 16 << 20


class _SinkFailing(Exception):
    """Raised from the progress callback to end a run whose trace sink is failing."""


def trace_bytes_bound(num_prompts: int, max_new_tokens: int, budget: int) -> int:
    """Upper bound on a run's trace size: every step commits at least one token, and a
    step row holds about six int32 lists of N = budget + 1 entries plus ~128 bytes of
    scalars (before zstd, which only shrinks it)."""
    return int(num_prompts) * int(max_new_tokens) * ((int(budget) + 1) * 24 + 128)


def check_free_space(folder: Path, need: int) -> None:
    """InputError before any decoding when the dataset's file system lacks `need` bytes
    (plus MIN_FREE_BYTES): a run on a full disk used to decode everything, then fail."""
    import shutil
    p = Path(folder)
    while not p.exists() and p != p.parent:
        p = p.parent
    free = shutil.disk_usage(p).free
    if free < need + MIN_FREE_BYTES:
        raise InputError(folder, f"only {free / 2**20:.1f} MiB free where the trace needs up to "
                                 f"{(need + MIN_FREE_BYTES) / 2**20:.1f} MiB; free space or pick another --out")


def reference_manifest(run_id: str, models_info: dict, cfg, *, dtype: str, device: str, seed: int,
                       engine_extra: dict | None = None, **config) -> dict:
    """run.json (without finished_at and reported) for a run of the reference runtime.

    `cfg` is the runtime's SpecConfig; keyword arguments add or override config keys
    (the server, whose requests bring their own token limits, sets max_new_tokens None).
    """
    import torch
    m = {
        "schema_version": SCHEMA_VERSION, "run_id": run_id,
        "engine": {"name": "specaudit-reference", "version": __version__, **(engine_extra or {})},
        "models": models_info,
        "config": {"algo": cfg.algo, "budget": cfg.budget, "topk": cfg.topk,
                   "block_size": cfg.budget + 1 if cfg.algo == "chain" else None,
                   "concurrency": cfg.concurrency, "max_new_tokens": cfg.max_new_tokens,
                   "dtype": dtype, "device": device, "seed": seed, "fault": cfg.fault,
                   "eos_id": cfg.eos_id, "threads": torch.get_num_threads(),
                   "draft_noise": getattr(cfg, "draft_noise", 0.0), **config},
        "conventions": {"accept_length": "includes_bonus", "mean": "pooled"},
        "host": host_info(device), "started_at": time.time(),
    }
    if getattr(cfg, "sampled", False):
        # contract v2: a sampled run writes the sampling columns and says how it sampled
        m["schema_version"] = SAMPLING_SCHEMA_VERSION
        m["config"]["sampling"] = cfg.sampling.manifest()
    return m


@dataclass
class RunResult:
    run_id: str
    run_dir: Path | None
    manifest: dict
    outputs: list[list[int]]
    reference: list[list[int]] | None
    wall_s: float
    greedy_wall_s: float | None = None
    summary: dict = field(default_factory=dict)


def new_run_id(algo: str, budget: int, topk: int, concurrency: int, fault: str | None) -> str:
    tag = f"{algo}-b{budget}-k{topk}-c{concurrency}" + (f"-{fault}" if fault else "")
    return f"{tag}-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(2)}"


def derived_means(run_dir, reqs, manifest: dict | None = None) -> dict:
    """The run's mean accepted depth and commit length from the raw tensors, not the counters,
    in its declared conventions (`manifest`'s, else its run.json's), so they sit beside its
    reported figures in the same convention (specaudit/trace/derived.py: the definition);
    an untraced run has only its requests' outputs (commit length; depth None)."""
    conventions = manifest_conventions(manifest) if manifest is not None else None
    if run_dir is not None:
        m = run_means(run_dir, conventions)
        if m["mean_commit_len"] is not None:
            return {"mean_accepted_depth": round(m["mean_accepted_depth"], 3),
                    "mean_commit_len": round(m["mean_commit_len"], 3)}
    # untraced: a request's output is prefill's first token, then its commits
    c = means([r.steps for r in reqs], [0] * len(reqs), [max(len(r.output) - 1, 0) for r in reqs],
              conventions)["mean_commit_len"]
    return {"mean_accepted_depth": None, "mean_commit_len": round(c, 3) if c is not None else None}


def run_traced(*, algo="chain", budget=7, topk=1, concurrency=1, num_prompts=8, max_new_tokens=256,
               prompts=None, prompts_file=None, oracle=False, inject=None, seed=0, device="cpu",
               dtype="float32", out=None, run_id=None, eos_id=None, progress=False,
               flush_steps=4096, flush_s=5.0, extra_sinks=(), trace=True, models=None,
               threads=None, temperature=0.0, top_p=1.0, top_k=None, draft_noise=0.0, target_spec=None,
               drafter_spec=None,
               trust_remote_code=False) -> RunResult:
    """Run chain or tree speculative decoding on the embedded models, traced.

    `out` is the dataset folder (the run adds its own partition); `trace=False` runs
    untraced (benchmarks). `models` = (target, drafter, info) skips loading;
    `target_spec`/`drafter_spec` ('hf:PATH_OR_ID', 'skip:N') load Hugging Face models
    (runtime/hf.py) and their tokenizer instead of the embedded pair.
    `threads` sets torch's intra-op threads (process-wide) when given. `draft_noise` > 0
    weakens the drafter on purpose (SpecConfig.draft_noise; recorded in run.json).
    `temperature` > 0 runs speculative sampling (runtime/sampling.py) with `top_p`,
    `top_k` and `seed`, and writes contract v2; 0 (the default) is greedy.
    Raises InputError / ValueError for bad input, before anything is written.
    """
    import torch

    from specaudit.model import EOS_ID, default_models
    from specaudit.runtime.engine import Request, SpecConfig, SpecEngine, greedy_generate
    from specaudit.runtime.faults import get_fault
    from specaudit.trace.parquet import ParquetSink, prepare_run_dir
    from specaudit.trace.tracer import Tracer

    check_device(device, dtype)
    if num_prompts < 1:
        raise InputError(None, f"--num-prompts must be at least 1 (got {num_prompts})")
    get_fault(inject)
    if threads is not None:
        set_torch_threads(threads)
    from specaudit.runtime.sampling import SamplingParams
    sp = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    sp.validate()
    if oracle and not sp.greedy:
        raise InputError(None, "--oracle compares with plain greedy decoding; under --temperature > 0 "
                               "use `specaudit lossless` (a two-sample test against plain sampling)")
    if models is None and target_spec:
        from specaudit.runtime.hf import load_models
        models = load_models(target_spec, drafter_spec, device=device, dtype=dtype, budget=budget, algo=algo,
                             trust_remote_code=trust_remote_code)
    elif drafter_spec:
        raise InputError(None, "--drafter needs --target hf:PATH_OR_ID (the embedded target has its own drafter)")
    model_eos = getattr(models[0], "eos_id", EOS_ID) if models is not None else EOS_ID
    cfg = SpecConfig(algo=algo, budget=budget, topk=topk, max_new_tokens=max_new_tokens,
                     concurrency=concurrency, eos_id=model_eos if eos_id is None else eos_id, fault=inject,
                     sampling=None if sp.greedy else sp, draft_noise=float(draft_noise))
    torch.manual_seed(seed)
    texts = prompts if prompts is not None else (load_prompts(prompts_file) if prompts_file else default_prompts())
    if not prompts and not prompts_file:
        # the embedded set, rotated by the seed so different seeds see different prompts
        k = seed % len(texts)
        texts = texts[k:] + texts[:k]
    texts = (texts * (num_prompts // len(texts) + 1))[:num_prompts]
    target, drafter, info = models if models is not None else default_models(device, getattr(torch, dtype))
    toks = [(getattr(target, "encode", None) or encode)(t) for t in texts]
    cfg.validate(drafter.depth)
    for i, t in enumerate(toks):
        if not t:
            raise InputError(prompts_file, f"prompt {i} is empty")
        if len(t) + max_new_tokens > target.max_seq_len:
            raise InputError(prompts_file, f"prompt {i} has {len(t)} tokens; with --max-new-tokens "
                             f"{max_new_tokens} that exceeds the context of {target.max_seq_len}")
    run_id = run_id or new_run_id(algo, budget, topk, concurrency, inject)
    if trace and out is not None:
        prepare_run_dir(Path(out), run_id)  # refuse early: nothing half-written
        check_free_space(Path(out), trace_bytes_bound(num_prompts, max_new_tokens, budget))

    reference, greedy_wall = None, None
    if oracle:
        reference, greedy_wall = greedy_generate(target, toks, max_new_tokens, cfg.eos_id,
                                                 concurrency, device)

    manifest = reference_manifest(run_id, info, cfg, dtype=dtype, device=device, seed=seed,
                                  num_prompts=num_prompts, oracle=oracle)
    sinks = list(extra_sinks)
    run_dir = None
    if trace and out is not None:
        sink = ParquetSink(out, run_id, flush_steps=flush_steps, flush_s=flush_s)
        run_dir = sink.run_dir
        sinks.insert(0, sink)
    # the engine allocates fresh tensors every step and never writes to them afterwards
    tracer = Tracer(sinks, manifest, run_id, copy_inputs=False) if (trace and sinks) else None
    engine = SpecEngine(target, drafter, cfg, tracer=tracer, device=device)
    reqs = [Request(request_id=str(i), prompt=t, max_new_tokens=max_new_tokens,
                    reference=reference[i] if reference is not None else None)
            for i, t in enumerate(toks)]
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(reqs), desc=f"{algo} b={budget} k={topk} c={concurrency}",
                   unit="req", file=sys.stderr, dynamic_ncols=True)
    def on_request(r, n):
        if bar:
            bar.update(1)
        if tracer is not None and not tracer.health()["ok"]:
            raise _SinkFailing()            # stop early: decoding on would trace nothing

    t0 = time.time()
    stopped = None
    interrupted = None
    try:
        engine.run(reqs, progress=on_request)
    except _SinkFailing:
        stopped = tracer.health()["last_error"]   # close() below writes what it can
    except KeyboardInterrupt as e:   # Ctrl-C, or SIGTERM (commands/run.py raises Terminated)
        interrupted = e
    finally:
        if bar:
            bar.close()
    wall = time.time() - t0
    if interrupted is not None:
        # the final flush still happens: requests in flight end as "abort" (traced), then
        # the sinks close with what was decoded; the interrupt goes on to the CLI (130/143)
        for r in reqs:
            if not r.finished:
                try:
                    engine.abort(r)
                except Exception:   # stopped mid-step: its request row may be missing
                    pass
        if tracer is not None:
            tracer.close(reported=engine.metrics.reported(wall), wall_s=wall)
        raise interrupted
    reported = engine.metrics.reported(wall)
    if tracer is not None:
        manifest = tracer.close(reported=reported, wall_s=wall)   # SinkError if rows were lost
        if stopped:
            from specaudit.trace.parquet import SinkError
            raise SinkError(run_dir, f"stopped early after {sum(r.finished for r in reqs)} of {len(reqs)} "
                                     f"requests: the trace sink failed ({stopped}); what was written is readable")
    else:
        manifest["reported"] = reported
    outputs = [r.output for r in reqs]
    gen = sum(len(o) for o in outputs)
    summary = {
        "run_id": run_id, "requests": len(reqs), "steps": reported["verify_steps"],
        **derived_means(run_dir, reqs, manifest),
        "tokens": gen, "tokens_per_s": round(gen / wall, 1) if wall > 0 else 0.0,
        # beside the derived figures: what the runtime's own metrics code (under audit) says
        "reported_mean_accepted_depth": round(reported["mean_accepted_depth"], 3),
        "reported_mean_commit_len": round(reported["mean_commit_len"], 3),
        "reported_tokens_per_s": round(reported["gen_throughput_tps"], 1),
    }
    if reference is not None:
        summary["greedy_tokens_per_s"] = round(sum(len(o) for o in reference) / greedy_wall, 1)
        summary["speedup"] = round(summary["tokens_per_s"] / summary["greedy_tokens_per_s"], 3)
        summary["lossless"] = outputs == reference
    return RunResult(run_id, run_dir, manifest, outputs, reference, wall, greedy_wall, summary)
