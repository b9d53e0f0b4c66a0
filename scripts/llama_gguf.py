#!/usr/bin/env python3
"""GGUF files for llama.cpp from the project's own Hugging Face Llama checkpoints, cached.

    python3 scripts/llama_gguf.py                # the tiny_llama pair: prints {"target": F, "drafter": F}
    python3 scripts/llama_gguf.py HF_DIR [...]   # one GGUF per folder

Written by llama.cpp's own converter (convert_hf_to_gguf.py and gguf-py from the pinned sdist
that scripts/llama_server_build.py unpacks), run in a child process, f32, nothing downloaded.
A tokenizer.json with no SentencePiece model goes straight to the converter's GPT-2 (byte-level
BPE) path, so the sentencepiece package is not needed. Two refusals are handled here:

- the converter names a BPE pre-tokenizer by the hash of how it splits a test string and
  refuses one it does not know (`get_vocab_base_pre`: "BPE pre-tokenizer was not
  recognized"); a tokenizer of ours with no regex split is not in its table, so the wrapper
  below answers "gpt-2" (byte-level, GPT-2's split) when, and only when, the converter refuses;
- llama.cpp refuses a BPE vocabulary with no merges at load ("cannot find tokenizer merges"):
  a tokenizer.json with an empty merge list is refused here first, in one line.

Cache: $SPECAUDIT_CACHE/models/gguf/<name>-<key>.gguf, key = sha256 of the folder's
config.json, tokenizer.json and model.safetensors and the sdist version; written to a
temporary name and renamed.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import llama_server_build as B  # noqa: E402  (scripts/ first on sys.path)

# The child: import the converter, answer its pre-tokenizer question only where it refuses.
WRAPPER = r"""
import sys, runpy
tree = sys.argv[1]
sys.path[:0] = [tree, tree + "/gguf-py"]
import conversion.base as base
orig = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return orig(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
base.TextModel.get_vocab_base_pre = pre
import conversion.llama as llama
orig_set_vocab = llama.LlamaModel.set_vocab
def set_vocab(self):
    # a byte-level BPE tokenizer.json and no SentencePiece model: straight to the GPT-2 path
    # (the default tries SentencePiece first and needs the sentencepiece package to say no)
    if (self.dir_model / "tokenizer.json").exists() and not (self.dir_model / "tokenizer.model").exists():
        return self._set_vocab_gpt2()
    return orig_set_vocab(self)
llama.LlamaModel.set_vocab = set_vocab
sys.argv = [tree + "/convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class ConvertError(Exception):
    pass


def _key(hf: Path, version: str) -> str:
    h = hashlib.sha256(version.encode())
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        with open(hf / name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:12]


def check_merges(hf: Path) -> None:
    tok = json.loads((hf / "tokenizer.json").read_text())
    model = tok.get("model") or {}
    if model.get("type") == "BPE" and not model.get("merges"):
        raise ConvertError(f"convert {hf}: the BPE tokenizer has no merges; llama.cpp refuses it at load "
                           "('cannot find tokenizer merges'): give the tokenizer at least one merge")


def ensure_gguf(hf: Path, name: str | None = None, L: B.Layout | None = None, out_dir: Path | None = None) -> Path:
    hf = Path(hf)
    L = L or B.Layout()
    for need in ("config.json", "tokenizer.json", "model.safetensors"):
        if not (hf / need).exists():
            raise ConvertError(f"convert {hf}: no {need} (a Hugging Face Llama checkpoint folder is needed)")
    check_merges(hf)
    name = name or hf.name
    out = Path(out_dir) if out_dir else B.cache_root().parent / "models" / "gguf"
    dst = out / f"{name}-{_key(hf, L.version)}.gguf"
    if dst.exists():
        return dst
    if not (L.tree / "convert_hf_to_gguf.py").exists():
        B.ensure_server(L)   # downloads and unpacks the sdist (and builds the server, needed anyway)
    out.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + f".{os.getpid()}.tmp")
    r = subprocess.run([sys.executable, "-c", WRAPPER, str(L.tree), str(hf), "--outfile", str(tmp),
                        "--outtype", "f32"], capture_output=True, text=True)
    if r.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        last = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()][-1:] or ["(no output)"]
        raise ConvertError(f"convert {hf} with llama.cpp's convert_hf_to_gguf.py failed: {last[0][:300]}")
    tmp.replace(dst)
    return dst


def ensure_pair_gguf() -> dict:
    from tiny_llama import ensure_pair
    pair = ensure_pair(log=lambda m: print(m, file=sys.stderr, flush=True))
    return {role: ensure_gguf(Path(d), name=f"tiny-llama-{role}") for role, d in pair.items()
            if role in ("target", "drafter")}


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="GGUF files for llama-server from Hugging Face Llama folders "
                                 "(default: the tiny_llama pair), cached under $SPECAUDIT_CACHE/models/gguf")
    ap.add_argument("folders", nargs="*", type=Path, help="Hugging Face checkpoint folders")
    a = ap.parse_args(argv)
    try:
        res = {str(f): ensure_gguf(f) for f in a.folders} if a.folders else ensure_pair_gguf()
    except (ConvertError, B.StepError) as e:
        print(str(e), file=sys.stderr)
        return 2
    print(json.dumps({k: str(v) for k, v in res.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
