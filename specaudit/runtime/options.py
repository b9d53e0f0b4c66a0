"""Runtime options shared by `specaudit run`, `serve`, `calibrate`, `demo` and the A/B arms of `ab`.

Kept out of specaudit/commands/ so library code (the A/B runner parses its arms with
these) never imports the command layer. One default for --threads everywhere (1).
"""
from __future__ import annotations

from specaudit.cli_vocab import add_list_faults, hidden_alias


def add_runtime_arguments(p) -> None:
    """Options shared by run, serve and ab."""
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--algo", choices=["chain", "tree"], default="chain",
                   help="chain: DFlash-style block; tree: DDTree-style best-first tree (default chain)")
    g.add_argument("--budget", type=int, default=7,
                   help="draft nodes per step, root excluded (chain: block size - 1; default 7)")
    g.add_argument("--branching", dest="topk", type=int, default=None, metavar="N",
                   help="most children per tree node (default: 1 for chain, 4 for tree); not the sampling "
                        "--top-k")
    hidden_alias(g, "--topk", "topk", type=int)         # old spelling, one release
    g.add_argument("--concurrency", type=int, default=1, help="requests verified per batched forward (default 1)")
    g.add_argument("--max-new-tokens", type=int, default=256, help="output tokens per request (default 256)")
    g.add_argument("--inject", metavar="FAULT", default=None,
                   help="inject a known metric/runtime bug (see --list-faults)")
    add_list_faults(g)
    g.add_argument("--seed", type=int, default=0,
                   help="seed (prompt order, and the sampler's generator; default 0)")
    add_host_arguments(g)
    g.add_argument("--eos-id", type=int, default=None,
                   help="token that ends a request (default: the model's EOS, byte 0)")
    add_model_arguments(p.add_argument_group("models"))


def add_model_arguments(g) -> None:
    """--target/--drafter: Hugging Face checkpoints instead of the embedded pair (runtime/hf.py)."""
    g.add_argument("--target", metavar="hf:PATH_OR_ID", default=None,
                   help="a Hugging Face causal LM as the target (safetensors only; needs specaudit[hf])")
    g.add_argument("--drafter", metavar="hf:PATH_OR_ID|skip:N", default=None,
                   help="with --target: a smaller causal LM with the same tokenizer, or skip:N for "
                        "self-speculation on the target's first N layers")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="allow a checkpoint's own Python code (transformers' trust_remote_code); off by default")


def model_kwargs(args) -> dict:
    """run_traced's model keywords from parsed options."""
    return dict(target_spec=getattr(args, "target", None), drafter_spec=getattr(args, "drafter", None),
                trust_remote_code=getattr(args, "trust_remote_code", False))


def add_sampling_arguments(g) -> None:
    """--temperature, --top-p, --top-k: speculative sampling (runtime/sampling.py).

    Added by the commands that sample (run, lossless); serve and the A/B arms are greedy."""
    g.add_argument("--temperature", type=float, default=0.0,
                   help="> 0: speculative sampling at this temperature (default 0: greedy, lossless by equality)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (default 1: off)")
    g.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (default: off)")


def sampling_kwargs(args) -> dict:
    """run_traced's sampling keywords from parsed options."""
    return dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)


def add_host_arguments(g, dtype: bool = True) -> None:
    """--device, --dtype and --threads, the same in every command that runs a model."""
    g.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, or mps where torch has it")
    if dtype:
        g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads on CPU (default 1: decode-sized ops on a small model "
                        "run fastest on one thread, and extra OpenMP threads spin under contention)")


def apply_host_options(args) -> None:
    """Check --device (and --dtype) and set --threads: one line and exit 2 on a bad value."""
    from specaudit.runtime.host import check_device, set_torch_threads
    check_device(args.device, getattr(args, "dtype", "float32"))
    set_torch_threads(args.threads)


def resolve_topk(args) -> int:
    if args.topk is not None:
        return args.topk
    return 1 if args.algo == "chain" else min(4, args.budget)
