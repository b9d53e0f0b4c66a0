"""The embedded models: a byte-level GPT target and a DFlash-style block drafter.

One readable file, gpt-fast style. Nothing here knows about speculative decoding
or tracing; the runtime talks to the target only through the `CausalLM` protocol
below, so another model (a Hugging Face checkpoint on a GPU, say) can be plugged in
without touching the verify code.

Shapes in comments: B batch rows, T new tokens per row, S cache slots, H heads,
Dh head dim, D model width, V vocabulary, K drafter depth.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

EOS_ID = 0  # byte 0 never occurs in source text; the corpus separates files with it


# --------------------------------------------------------------------------- target


@dataclass
class GPTConfig:
    vocab_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    max_seq_len: int = 512
    rope_base: float = 10000.0


class KVCache:
    """Per-layer key/value rows, one cache row per batch slot.

    k, v: [L, B, S, H, Dh]. Slot s of row b holds the token at cache index s; the
    runtime owns which slots are valid (`cache_lens`), the model only reads and writes.
    S has `margin` spare slots past max_seq_len so a verify block written at the end
    of a full context never indexes out of range.
    """

    def __init__(self, cfg: GPTConfig, batch: int, device, dtype, margin: int = 128,
                 length: int | None = None):
        hd = cfg.d_model // cfg.n_head
        # `length` caps the slots for callers that know their sequences are short
        # (training-data generation): the cache is B x S x ... and zero-filled.
        shape = (cfg.n_layer, batch, (length or cfg.max_seq_len) + margin, cfg.n_head, hd)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    def move_rows(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slot src[i] to slot dst[i] of batch row rows[i], in every layer.

        Used to compact an accepted tree path into contiguous slots. Gathering all
        sources before writing makes overlapping src/dst safe.
        """
        kk = self.k[:, rows, src]  # [L, M, H, Dh]
        vv = self.v[:, rows, src]
        self.k[:, rows, dst] = kk
        self.v[:, rows, dst] = vv


def rope_tables(cfg: GPTConfig, device) -> tuple[torch.Tensor, torch.Tensor]:
    hd = cfg.d_model // cfg.n_head
    inv = 1.0 / (cfg.rope_base ** (torch.arange(0, hd, 2, device=device).float() / hd))
    # positions up to 2x the context: a buggy runtime may feed positions past it and
    # we want a wrong answer, not an index error
    t = torch.arange(2 * cfg.max_seq_len + 256, device=device).float()
    freqs = torch.outer(t, inv)  # [P, Dh/2]
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [B, T, H, Dh]; cos/sin [B, T, Dh/2]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return out.flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
        self.fc2 = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False)

    def attn(self, x, cos, sin, kv=None, write=None, attn_mask=None):
        B, T, D = x.shape
        H = self.n_head
        q, k, v = self.qkv(x).view(B, T, 3, H, D // H).unbind(2)  # each [B, T, H, Dh]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv is None:  # training / plain full-sequence forward: causal
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        else:
            kc, vc = kv  # [Bc, S, H, Dh]: this layer's whole cache
            rows, slots, gather = write  # [B, T] each: where the block's keys/values go
            kc[rows, slots] = k.to(kc.dtype)
            vc[rows, slots] = v.to(vc.dtype)
            s_used = attn_mask.shape[-1]
            if gather:  # an arbitrary set of rows (prefill of one new request): copy them
                r = rows[:, 0]
                kr, vr = kc[r, :s_used], vc[r, :s_used]
            else:  # rows 0..B-1: views, no copy
                kr, vr = kc[:B, :s_used], vc[:B, :s_used]
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2), kr.transpose(1, 2).to(q.dtype), vr.transpose(1, 2).to(q.dtype),
                attn_mask=attn_mask)  # mask [B, 1, T, S_used]
        return self.proj(y.transpose(1, 2).reshape(B, T, D))

    def forward(self, x, cos, sin, kv=None, write=None, attn_mask=None):
        x = x + self.attn(self.ln1(x), cos, sin, kv, write, attn_mask)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Byte-level decoder-only transformer with rotary positions and a KV cache."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.wte.weight  # tied: fewer bytes to ship
        cos, sin = rope_tables(cfg, "cpu")
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(_init_weights)

    # CausalLM protocol ------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.cfg.d_model

    @property
    def max_seq_len(self) -> int:
        return self.cfg.max_seq_len

    eos_id = EOS_ID

    def new_cache(self, batch: int, length: int | None = None) -> KVCache:
        p = self.wte.weight
        return KVCache(self.cfg, batch, p.device, p.dtype, length=length)

    def forward_train(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full causal forward. idx [B, T] -> logits [B, T, V], hidden [B, T, D]."""
        T = idx.shape[1]
        cos = self.rope_cos[:T].unsqueeze(0)
        sin = self.rope_sin[:T].unsqueeze(0)
        x = self.wte(idx)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        h = self.ln_f(x)
        return self.head(h), h

    def forward(self, tokens, positions, cache: KVCache, cache_lens, node_mask, rows=None):
        """One cached forward over a block of T new tokens per row.

        tokens, positions: [B, T]; rows: [B] cache rows these batch rows use
        (default 0..B-1, the fast path: reads are views, not gathers); cache_lens:
        [B] valid slots per row before this call; node_mask: [B, T, T] bool,
        node_mask[b, i, j] = token i may attend to token j of this block.
        New keys/values are written at slots cache_lens[b] + 0..T-1.
        Every token sees the whole valid prefix. Returns logits [B, T, V] and the
        final hidden states [B, T, D] (the drafter is conditioned on them).
        """
        B, T = tokens.shape
        dev = tokens.device
        gather = rows is not None
        if rows is None:
            rows = torch.arange(B, device=dev)
        ar = torch.arange(T, device=dev)
        slots = cache_lens[:, None] + ar[None, :]  # [B, T]
        s_used = int(cache_lens.max()) + T
        # attention mask over cache slots [B, T, S_used]: the prefix, then the block
        key = torch.arange(s_used, device=dev)
        mask = key[None, None, :] < cache_lens[:, None, None]  # prefix part
        blk = torch.zeros(B, T, s_used, dtype=torch.bool, device=dev)
        blk.scatter_(2, slots[:, None, :].expand(B, T, T), node_mask)
        mask = (mask | blk).unsqueeze(1)  # [B, 1, T, S_used]
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # [B, T, Dh/2]
        write = (rows[:, None].expand(B, T), slots, gather)
        x = self.wte(tokens)
        for i, blk_ in enumerate(self.blocks):
            x = blk_(x, cos, sin, (cache.k[i], cache.v[i]), write, mask)
        h = self.ln_f(x)
        return self.head(h), h



def _init_weights(m: nn.Module) -> None:
    # GPT-2 style: N(0, 0.02). Default nn.Embedding init (std 1) with tied weights
    # gives logits in the hundreds at step 0.
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
        if getattr(m, "bias", None) is not None:
            nn.init.zeros_(m.bias)


class CausalLM(Protocol):
    """What the runtime needs from a target model.

    forward(tokens [B,T], positions [B,T], cache, cache_lens [B], node_mask [B,T,T],
    rows [B] or None) -> (logits [B,T,V], hidden [B,T,D]), writing the block's
    keys/values at slots cache_lens + 0..T-1 of cache rows `rows` (default 0..B-1).
    The cache object must offer move_rows(rows, src, dst) for tree compaction.
    """

    vocab_size: int
    hidden_size: int
    max_seq_len: int
    eos_id: int

    def new_cache(self, batch: int): ...

    def forward(self, tokens, positions, cache, cache_lens, node_mask, rows=None): ...


# -------------------------------------------------------------------------- drafter


@dataclass
class DrafterConfig:
    vocab_size: int = 256
    d_target: int = 256
    d_model: int = 256
    depth: int = 8  # K: future positions proposed in one forward (block size - 1)
    n_layer: int = 2


class DrafterMLP(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc(self.ln(x))))


class BlockDrafter(nn.Module):
    """DFlash-style block drafter: one forward proposes all K future positions.

    Input: the target's final hidden state at the node whose argmax is the root
    ([B, D_t]) and the root token ([B]). Output: log-probabilities [B, K, V] for
    offsets 1..K after the root. Per-position heads on a shared trunk, not a small
    transformer: on CPU a non-causal block transformer cost as much as a target
    forward, which erased the speedup. The positions are independent given the
    root, which is what makes DDTree's best-first tree over per-position top-k
    well defined.
    """

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.inp = nn.Linear(cfg.d_target, cfg.d_model)
        self.emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.trunk = DrafterMLP(cfg.d_model)
        self.offset = nn.Parameter(torch.zeros(cfg.depth, cfg.d_model))
        self.heads = nn.ModuleList(DrafterMLP(cfg.d_model) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.vocab_size)
        nn.init.normal_(self.offset, std=0.02)

    @property
    def depth(self) -> int:
        return self.cfg.depth

    def forward(self, h_prev: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        x = self.trunk(self.inp(h_prev) + self.emb(root))  # [B, D]
        x = x[:, None, :] + self.offset[None]  # [B, K, D]
        for blk in self.heads:
            x = blk(x)
        return F.log_softmax(self.out(self.ln_f(x)).float(), dim=-1)  # [B, K, V]


# --------------------------------------------------------------------- weights I/O


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_model(model: nn.Module, path: Path, kind: str) -> None:
    """Save weights as fp16 safetensors with the config in the metadata."""
    from safetensors.torch import save_file

    sd = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()
          if k != "head.weight"}  # tied to wte.weight
    save_file(sd, str(path), metadata={"kind": kind, "config": json.dumps(asdict(model.cfg))})


def load_model(path: Path, device="cpu", dtype=torch.float32):
    """Load a GPT or BlockDrafter from safetensors (never pickle)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    kind = meta.get("kind")
    if kind == "gpt":
        model = GPT(GPTConfig(**json.loads(meta["config"])))
    elif kind == "drafter":
        model = BlockDrafter(DrafterConfig(**json.loads(meta["config"])))
    else:
        raise ValueError(f"{path}: not a specaudit weights file (metadata kind={kind!r})")
    sd = load_file(str(path))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k != "head.weight"]
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not match the config "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.to(device=device, dtype=dtype).eval()


def weights_dir() -> Path:
    return Path(__file__).resolve().parent / "weights"


def default_models(device="cpu", dtype=torch.float32):
    """The embedded pair, with their sha256 for run.json."""
    d = weights_dir()
    tp, dp = d / "target.safetensors", d / "drafter.safetensors"
    target = load_model(tp, device, dtype)
    drafter = load_model(dp, device, dtype)
    info = {
        "target": {"name": "specaudit-bytegpt", "path": tp.name, "sha256": sha256_file(tp)},
        "drafter": {"name": "specaudit-block-drafter", "path": dp.name, "sha256": sha256_file(dp)},
    }
    return target, drafter, info


def bits_per_byte(loss_nats: float) -> float:
    return loss_nats / math.log(2)
