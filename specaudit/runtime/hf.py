"""Hugging Face causal LMs behind the runtime's `CausalLM` protocol, and as drafters.

    specaudit run --target hf:PATH_OR_ID --drafter hf:PATH_OR_ID   # a smaller LM drafts
    specaudit run --target hf:PATH_OR_ID --drafter skip:N           # self-speculation

Words:
    target adapter  `HFTarget`: one cached forward over a block of T new tokens per row
                    with explicit position ids and a [B, T, T] node mask, the protocol
                    the verifier speaks (specaudit/model.py `CausalLM`).
    causal drafter  `HFDrafter`: drafts K tokens one at a time with a causal LM (greedy,
                    chain drafting) and hands the runtime the K per-position
                    log-probabilities, [R, K, V], the same shape the embedded block
                    drafter produces. A tree over it branches on the per-position top-k of
                    the greedy path's distributions (the drafter never saw the branches).
    layer skip      the target's first N decoder layers and its own head (LayerSkip-style
                    self-speculation: no second model to load).

How the KV cache works. The runtime writes each row's block at its own slots
(cache_lens[b] + 0..T-1) and compacts accepted tree paths with move_rows; HF caches
append at one shared length. `HFKVCache` keeps per-layer keys/values [B, Hkv, S, Dh]
itself; each forward hands the model a fresh `DynamicCache` holding the rows' prefixes
(P = max cache_lens slots, invalid ones masked out), gives it a 4D additive mask
[B, 1, T, P + T] (prefix validity, then the node mask), and copies the T new entries per
layer back to the rows' own slots. The copy costs one prefix gather per forward: right
for the CPU tests and for auditing on a GPU, not a serving engine (use vLLM/SGLang for
that and trace them with the tracer API). Llama-, Qwen2- and GPT-2-style models are
tested (tests/test_hf.py); any model whose attention accepts a custom 4D mask, explicit
position_ids and a DynamicCache works the same way.

Safety: weights load with safetensors only (`use_safetensors=True`: a checkpoint that has
only pickle .bin files is refused) and remote code runs only with --trust-remote-code.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from specaudit.trace.safe_io import InputError

DEFAULT_DRAFT_DEPTH = 8  # K for a causal drafter under a tree (a chain uses its budget)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise InputError(None, "Hugging Face models need transformers: pip install 'specaudit[hf]'") from None
    return transformers


# ------------------------------------------------------------------------ KV cache


class HFKVCache:
    """Per-layer keys/values [B, Hkv, S, Dh], one row per batch slot (see module doc)."""

    def __init__(self, n_layer: int, batch: int, n_kv: int, head_dim: int, slots: int, device, dtype):
        import torch
        shape = (n_layer, batch, n_kv, slots, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    def move_rows(self, rows, src, dst) -> None:
        """Copy slot src[i] to slot dst[i] of batch row rows[i] in every layer (tree compaction)."""
        kk = self.k[:, rows, :, src]  # [L, M, Hkv, Dh]; gather first so overlaps are safe
        vv = self.v[:, rows, :, src]
        self.k[:, rows, :, dst] = kk
        self.v[:, rows, :, dst] = vv


def _layers(model):
    """The decoder layer list of a Llama/Qwen2-style (model.model.layers) or GPT-2-style
    (model.transformer.h) causal LM, and a setter that swaps it."""
    base = getattr(model, "model", None)
    if base is not None and hasattr(base, "layers"):
        return base.layers, lambda new: setattr(base, "layers", new)
    base = getattr(model, "transformer", None)
    if base is not None and hasattr(base, "h"):
        return base.h, lambda new: setattr(base, "h", new)
    raise InputError(None, f"{type(model).__name__}: no decoder layer list (model.layers or transformer.h); "
                           "this architecture is not supported")


def _kv_shape(cfg) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) from a config, for Llama/Qwen2/GPT-2 naming."""
    n_layer = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
    n_head = getattr(cfg, "num_attention_heads", None) or cfg.n_head
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_head
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head
    return n_layer, n_kv, head_dim


# ------------------------------------------------------------------------- target


class HFTarget:
    """A transformers causal LM as a runtime target (`CausalLM` protocol)."""

    def __init__(self, model, tokenizer=None, eos_id: int | None = None, margin: int = 64):
        self.model = model.eval()
        cfg = model.config
        self.tokenizer = tokenizer
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.hidden_size = int(cfg.hidden_size)
        self.max_seq_len = int(getattr(cfg, "max_position_embeddings", None) or cfg.n_positions)
        eos = eos_id if eos_id is not None else getattr(cfg, "eos_token_id", None)
        self.eos_id = int(eos[0] if isinstance(eos, (list, tuple)) else (eos if eos is not None else -1))
        self.margin = margin
        self.n_layer, self.n_kv, self.head_dim = _kv_shape(cfg)
        self.cache_kw = _cache_kw(model)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, tokens) -> str:
        return self.tokenizer.decode(list(tokens))

    def new_cache(self, batch: int, length: int | None = None) -> HFKVCache:
        p = next(self.model.parameters())
        return HFKVCache(self.n_layer, batch, self.n_kv, self.head_dim,
                         (length or self.max_seq_len) + self.margin, p.device, p.dtype)

    def forward(self, tokens, positions, cache: HFKVCache, cache_lens, node_mask, rows=None):
        """tokens, positions [B, T]; cache_lens [B]; node_mask [B, T, T] -> logits [B, T, V], hidden [B, T, D]."""
        import torch
        from transformers import DynamicCache

        B, T = tokens.shape
        dev = tokens.device
        rows = torch.arange(B, device=dev) if rows is None else rows
        P = int(cache_lens.max())
        past = DynamicCache()
        for layer in range(self.n_layer):  # each row's prefix, [B, Hkv, P, Dh]
            past.update(cache.k[layer, rows, :, :P], cache.v[layer, rows, :, :P], layer)
        prefix_ok = torch.arange(P, device=dev)[None, None, :] < cache_lens[:, None, None]  # [B, 1, P]
        allowed = torch.cat([prefix_ok.expand(B, T, P), node_mask], dim=-1)                 # [B, T, P + T]
        dtype = cache.k.dtype
        mask = torch.zeros(B, 1, T, P + T, device=dev, dtype=dtype)
        mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
        out = self.model(input_ids=tokens, position_ids=positions, attention_mask=mask,
                         use_cache=True, output_hidden_states=True, **{self.cache_kw: past})
        slots = cache_lens[:, None] + torch.arange(T, device=dev)[None, :]                   # [B, T]
        rr = rows[:, None].expand(B, T)
        for layer in range(self.n_layer):
            lk, lv = _layer_kv(_out_cache(out), layer)                                  # [B, Hkv, P+T, Dh]
            cache.k[layer, rr, :, slots] = lk[:, :, P:].transpose(1, 2)                       # [B, T, Hkv, Dh]
            cache.v[layer, rr, :, slots] = lv[:, :, P:].transpose(1, 2)
        return out.logits, out.hidden_states[-1]

    __call__ = forward


def _cache_kw(model) -> str:
    """The forward keyword for a cache: `cache` (transformers >= 5.x), else `past_key_values`."""
    import inspect
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _out_cache(out):
    c = getattr(out, "cache", None)
    return c if c is not None else out.past_key_values


def _layer_kv(cache, layer: int):
    """(keys, values) of one layer of a transformers cache, across cache API versions."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return layers[layer].keys, layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


# ------------------------------------------------------------------------ drafters


class HFDrafter:
    """A causal LM that drafts K tokens greedily, one at a time (chain drafting).

    The runtime hands it each request's tokens (prompt + output, the root last) instead
    of the target's hidden state (`needs_context`); it returns the log-probabilities of
    the K positions after the root, [R, K, V], each conditioned on the greedy drafts
    before it. No drafter cache is kept across steps: each step re-reads the request's
    prefix (simple and exact; costs a prefill of the drafter per step).
    """

    needs_context = True

    def __init__(self, model, depth: int, vocab_size: int | None = None):
        self.model = model.eval()
        self.depth = int(depth)
        self.cache_kw = _cache_kw(model)
        self.vocab_size = vocab_size or int(model.get_output_embeddings().weight.shape[0])

    def draft(self, contexts: list[list[int]]):
        """contexts: R token lists (root last) -> log-probs [R, K, V] (torch, float32)."""
        import torch
        import torch.nn.functional as F

        p = next(self.model.parameters())
        R = len(contexts)
        L = max(len(c) for c in contexts)
        # left-pad so every row's next token is at the same column; positions skip the pad
        ids = torch.zeros(R, L, dtype=torch.long, device=p.device)
        att = torch.zeros(R, L, dtype=torch.long, device=p.device)
        for i, c in enumerate(contexts):
            ids[i, L - len(c):] = torch.tensor(c, device=p.device)
            att[i, L - len(c):] = 1
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        out_lp = torch.empty(R, self.depth, self.vocab_size, device=p.device)
        past = None
        cur, cur_pos = ids, pos
        for k in range(self.depth):
            out = self.model(input_ids=cur, attention_mask=att, position_ids=cur_pos, use_cache=True,
                             **({self.cache_kw: past} if past is not None else {}))
            lp = F.log_softmax(out.logits[:, -1, : self.vocab_size].float(), dim=-1)  # [R, V]
            out_lp[:, k] = lp
            past = _out_cache(out)
            nxt = lp.argmax(-1, keepdim=True)                                         # [R, 1]
            att = torch.cat([att, torch.ones(R, 1, dtype=att.dtype, device=att.device)], dim=1)
            cur_pos = cur_pos[:, -1:] + 1
            cur = nxt
        return out_lp

    def __call__(self, h_prev, root):  # the block-drafter signature: not usable without context
        raise TypeError("HFDrafter drafts from each request's tokens: call draft(contexts)")


def layer_skip_drafter(target_model, n_layers: int, depth: int) -> HFDrafter:
    """The target's first `n_layers` decoder layers plus its final norm and head, as a
    causal drafter sharing the target's weights (LayerSkip-style self-speculation)."""
    import copy

    import torch.nn as nn

    layers, _ = _layers(target_model)
    total = len(layers)
    if not 1 <= n_layers < total:
        raise InputError(None, f"--drafter skip:{n_layers}: the target has {total} layers; "
                               f"give 1..{total - 1}")
    shallow = copy.copy(target_model)              # a new module object; parameters shared
    shallow._modules = dict(target_model._modules)
    for name in ("model", "transformer"):
        inner = getattr(target_model, name, None)
        if inner is not None and isinstance(inner, nn.Module):
            inner2 = copy.copy(inner)
            inner2._modules = dict(inner._modules)
            shallow._modules[name] = inner2
            key = "layers" if hasattr(inner, "layers") else "h"
            inner2._modules[key] = nn.ModuleList(list(getattr(inner, key))[:n_layers])
            cfg = copy.copy(inner.config)
            for attr in ("num_hidden_layers", "n_layer"):
                if hasattr(cfg, attr):
                    setattr(cfg, attr, n_layers)
            if hasattr(cfg, "layer_types") and cfg.layer_types is not None:
                cfg.layer_types = list(cfg.layer_types)[:n_layers]
            inner2.config = cfg
            shallow.config = cfg
            break
    return HFDrafter(shallow, depth)


# ------------------------------------------------------------------------- loading


def _local_dir(spec: str) -> Path | None:
    p = Path(spec).expanduser()
    return p if p.exists() else None


def _check_model_dir(path: Path) -> None:
    if not path.is_dir():
        raise InputError(path, "is not a model folder (expected config.json and *.safetensors)")
    if not (path / "config.json").is_file():
        raise InputError(path, "is not a model folder: no config.json")
    if not any(path.glob("*.safetensors")):
        if any(path.glob("*.bin")) or any(path.glob("*.pt")):
            raise InputError(path, "holds only pickle weights (.bin/.pt); specaudit loads safetensors only "
                                   "(convert with transformers: model.save_pretrained(dir, safe_serialization=True))")
        raise InputError(path, "holds no *.safetensors weights")
    from specaudit.inputs import check_input
    for f in path.glob("*.safetensors"):   # a FIFO or a device among the weights: refused, not read
        check_input(f)


def _free_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _weights_sha256(path: Path | None, spec: str) -> str:
    """sha256 over the safetensors files (names and bytes), or of the spec for a hub id."""
    h = hashlib.sha256()
    if path is None:
        h.update(spec.encode())
        return h.hexdigest()
    for f in sorted(path.glob("*.safetensors")):
        h.update(f.name.encode())
        from specaudit.inputs import open_input
        with open_input(f) as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def load_causal_lm(spec: str, device="cpu", dtype="float32", trust_remote_code: bool = False):
    """'hf:PATH_OR_ID' -> (model, tokenizer, info). InputError for anything a user can fix."""
    import torch

    transformers = _transformers()
    if not spec.startswith("hf:") or len(spec) <= 3:
        raise InputError(None, f"model {spec!r}: expected hf:PATH_OR_ID")
    name = spec[3:]
    path = _local_dir(name)
    if path is not None:
        _check_model_dir(path)
        size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        free = _free_memory_bytes()
        if free is not None and str(device) == "cpu" and size > free:
            raise InputError(path, f"weights are {size / 2**30:.1f} GiB but this machine has "
                                   f"{free / 2**30:.1f} GiB free")
        cfg_json = (path / "config.json").read_text(errors="replace")
        if '"auto_map"' in cfg_json and not trust_remote_code:
            raise InputError(path, "needs remote code (auto_map in config.json); pass --trust-remote-code "
                                   "if you trust it")
    src = str(path) if path is not None else name
    # transformers' own loading bars and advice would bury our one-line errors
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            src, use_safetensors=True, trust_remote_code=trust_remote_code, dtype=getattr(torch, dtype))
        tok = transformers.AutoTokenizer.from_pretrained(src, trust_remote_code=trust_remote_code)
    except InputError:
        raise
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(path or name, f"cannot load as a causal LM: {first}") from None
    model.to(device)
    info = {"name": spec, "sha256": _weights_sha256(path, name), "architecture": type(model).__name__,
            "parameters": int(sum(p.numel() for p in model.parameters()))}
    return model, tok, info


def _same_vocab(t1, t2) -> bool:
    try:
        return t1.get_vocab() == t2.get_vocab()
    except (AttributeError, NotImplementedError):
        return True


def load_models(target: str, drafter: str | None, *, device="cpu", dtype="float32", budget: int = 7,
                algo: str = "chain", trust_remote_code: bool = False):
    """(--target, --drafter) specs -> (target, drafter, info) for SpecEngine.

    drafter: 'hf:PATH_OR_ID' (a smaller causal LM with the same tokenizer) or 'skip:N'
    (the target's first N layers). K, the drafted positions, is the chain's budget, or
    min(budget, 8) under a tree.
    """
    if not drafter:
        raise InputError(None, "--target hf:... needs --drafter hf:PATH_OR_ID or --drafter skip:N")
    model, tok, tinfo = load_causal_lm(target, device, dtype, trust_remote_code)
    tgt = HFTarget(model, tok)
    depth = budget if algo == "chain" else min(budget, DEFAULT_DRAFT_DEPTH)
    if drafter.startswith("skip:"):
        try:
            n = int(drafter[5:])
        except ValueError:
            raise InputError(None, f"--drafter {drafter!r}: expected skip:N (N decoder layers)") from None
        d = layer_skip_drafter(model, n, depth)
        dinfo = {"name": drafter, "sha256": tinfo["sha256"], "architecture": f"{tinfo['architecture']} "
                 f"first {n} layers"}
    else:
        dmodel, dtok, dinfo = load_causal_lm(drafter, device, dtype, trust_remote_code)
        if not _same_vocab(tok, dtok):
            raise InputError(None, f"tokenizer mismatch: {target} and {drafter} do not share a vocabulary "
                                   "(speculative decoding needs the drafter to propose the target's tokens)")
        d = HFDrafter(dmodel, depth, vocab_size=tgt.vocab_size)
    return tgt, d, {"target": tinfo, "drafter": dinfo}
