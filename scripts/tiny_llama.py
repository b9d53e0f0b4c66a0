"""Tiny byte-level Llama checkpoints, trained here, for the real engines under audit.

llama.cpp's server and vLLM run Llama-architecture checkpoints, not the embedded GPT pair of
specaudit/model.py, so the live tests need a target and a drafter in that architecture. Nothing
may be downloaded at run time, so both are trained on this machine, on the Python standard
library's own source (present wherever Python is), and cached by everything that determines them.

    python3 scripts/tiny_llama.py            # prints {"target": DIR, "drafter": DIR, ...} as JSON
    from tiny_llama import ensure_pair       # (scripts/ on sys.path) the same from a test

Each folder is a Hugging Face LlamaForCausalLM checkpoint: config.json, model.safetensors (never
pickle), generation_config.json, tokenizer.json / tokenizer_config.json, and training_report.json
written by this script (what was trained, on what, for how long, to which loss).

Vocabulary (258 ids): the 256 byte symbols of the GPT-2 byte-level alphabet (id = byte value),
one merge (two spaces, id 256: llama.cpp refuses a BPE vocabulary with no merges) and `</s>`
(id 257, end of sequence). Training encodes bytes directly (`encode_bytes`), which equals the
tokenizer's encoding (checked at build time on a sample of the corpus).

Cache: `$SPECAUDIT_CACHE/models/` (default ~/.cache/specaudit/models), one folder per role and
key (a hash of the architecture, training settings, corpus and this file's format version),
written to a temporary folder and renamed into place under a file lock, so concurrent test
workers train once and a half-written folder is never seen.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

FORMAT = 1                 # bump when the folder's contents change meaning
VOCAB = 258
MERGE_ID = 256             # "  " (two spaces): Python indentation makes it the commonest pair
EOS_ID = 257
CORPUS_BYTES = 2_000_000   # stdlib source kept for training (the first files in sorted order)


@dataclass(frozen=True)
class Spec:
    """Architecture and training of one checkpoint (everything that decides its weights)."""
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    steps: int
    batch: int = 32
    seq: int = 128
    lr: float = 3e-3
    seed: int = 0
    threads: int = 2       # float sums differ with the thread count: part of the key


# The target: hidden 128, 4 layers, 4 heads of 32, 2 KV heads. The drafter: a quarter of the
# target's layers' width and half its depth, trained on the same text for fewer steps, so it
# agrees with the target often but not always (real partial acceptance).
TARGET = Spec(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=344, steps=400)
DRAFTER = Spec(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=172, steps=200, seed=1)


def cache_root() -> Path:
    return Path(os.environ.get("SPECAUDIT_CACHE") or Path.home() / ".cache" / "specaudit")


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode map: printable bytes stand for themselves, the rest shift to 256+."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def corpus() -> bytes:
    """The first CORPUS_BYTES of the standard library's top-level .py files, in name order."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    out, n = [], 0
    for f in sorted(lib.glob("*.py")):
        data = f.read_bytes()
        out.append(data)
        n += len(data)
        if n >= CORPUS_BYTES:
            break
    return b"".join(out)[:CORPUS_BYTES]


def encode_bytes(data: bytes) -> np.ndarray:
    """Token ids of raw bytes: each byte is its own id, non-overlapping "  " pairs become MERGE_ID
    left to right (what BPE with a single merge does). Returns int64 [T]."""
    b = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    sp = b == 0x20
    # a space starts a merged pair when it and the next byte are spaces and it is the first,
    # third, ... of its run of spaces: parity of its position within the run
    run_start = np.flatnonzero(sp & ~np.concatenate([[False], sp[:-1]]))
    idx = np.arange(len(b))
    start_of = np.maximum.accumulate(np.where(np.isin(idx, run_start), idx, 0))
    first = sp & ((idx - start_of) % 2 == 0) & np.concatenate([sp[1:], [False]])
    second = np.concatenate([[False], first[:-1]])
    b[first] = MERGE_ID
    return b[~second]


def build_tokenizer():
    """The byte-level BPE tokenizer (tokenizers' own objects; no regex split, no prefix space)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    sym = _byte_symbols()
    vocab = {s: i for i, s in enumerate(sym)}
    space = sym[0x20]
    vocab[space + space] = MERGE_ID
    vocab["</s>"] = EOS_ID
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(space, space)]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("</s>", special=True)])
    return tok


def _key(spec: Spec, corpus_sha: str) -> str:
    blob = json.dumps({"spec": asdict(spec), "corpus": corpus_sha, "format": FORMAT,
                       "vocab": VOCAB}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _train(spec: Spec, ids: np.ndarray, out: Path, log=print) -> dict:
    """Train one LlamaForCausalLM from scratch on `ids`; save it to `out`; return its report."""
    import torch
    import transformers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                      num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                      num_key_value_heads=spec.kv_heads, max_position_embeddings=2048,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      bos_token_id=EOS_ID, eos_token_id=EOS_ID, torch_dtype="float32")
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=spec.lr, total_steps=spec.steps,
                                                pct_start=0.1)
    data = torch.from_numpy(ids)
    gen = torch.Generator().manual_seed(spec.seed)
    t0, losses = time.perf_counter(), []
    model.train()
    for step in range(spec.steps):
        # [batch] random window starts; x, y: [batch, seq] next-byte pairs
        starts = torch.randint(0, len(data) - spec.seq - 1, (spec.batch,), generator=gen)
        win = torch.stack([data[s:s + spec.seq + 1] for s in starts.tolist()])
        logits = model(input_ids=win[:, :-1]).logits            # [batch, seq, VOCAB]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), win[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == spec.steps - 1:
            log(f"tiny_llama: {out.name} step {step + 1}/{spec.steps} loss {losses[-1]:.3f}")
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=EOS_ID, eos_token_id=EOS_ID).save_pretrained(out)
    fast = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(), eos_token="</s>",
                                   bos_token="</s>", model_max_length=2048)
    fast.save_pretrained(out)
    return {"steps": spec.steps, "final_loss_mean_last_20": float(np.mean(losses[-20:])),
            "first_loss": losses[0], "train_wall_s": round(time.perf_counter() - t0, 1),
            "torch": torch.__version__, "transformers": transformers.__version__}


def ensure(role: str, spec: Spec, cache: Path | None = None, log=print) -> Path:
    """The checkpoint folder for `spec`, trained and cached on first use."""
    data = corpus()
    sha = hashlib.sha256(data).hexdigest()
    root = (cache or cache_root()) / "models"
    final = root / f"tinyllama-{role}-{_key(spec, sha)}"
    if (final / "training_report.json").is_file():
        return final
    with _locked(root / ".lock"):
        if (final / "training_report.json").is_file():     # another process trained it meanwhile
            return final
        ids = encode_bytes(data)
        tok = build_tokenizer()
        sample = data[:20000].decode("utf-8", "replace").encode("utf-8")
        if tok.encode(sample.decode("utf-8")).ids != encode_bytes(sample).tolist():
            raise RuntimeError("tiny_llama: the tokenizer and encode_bytes disagree (a bug in this file)")
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repository root
        from specaudit.machine_load import load_fields  # the busy rule's load keys (stdlib only)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        report = _train(spec, ids, tmp, log=log)
        report.update(role=role, spec=asdict(spec), format=FORMAT, vocab=VOCAB, merge_id=MERGE_ID,
                      eos_id=EOS_ID, corpus={"what": "Python standard library, top-level *.py in name order",
                                             "python": platform.python_version(), "bytes": len(data),
                                             "tokens": int(len(ids)), "sha256": sha},
                      written_by="scripts/tiny_llama.py", date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      machine=load_fields())
        (tmp / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
        os.chmod(tmp, 0o777 & ~_umask())
        os.replace(tmp, final)
    return final


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def ensure_pair(cache: Path | None = None, target: Spec = TARGET, drafter: Spec = DRAFTER,
                log=print) -> dict:
    """{"target": DIR, "drafter": DIR}: both checkpoints, trained on first use, then cached."""
    return {"target": ensure("target", target, cache, log), "drafter": ensure("drafter", drafter, cache, log)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Prints one JSON object: the two checkpoint folders and their training reports.")
    ap.add_argument("--cache", type=Path, default=None,
                    help="cache folder (default $SPECAUDIT_CACHE or ~/.cache/specaudit)")
    args = ap.parse_args(argv)
    pair = ensure_pair(args.cache, log=lambda m: print(m, file=sys.stderr, flush=True))
    out = {k: str(v) for k, v in pair.items()}
    out["reports"] = {k: json.loads((v / "training_report.json").read_text()) for k, v in pair.items()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
