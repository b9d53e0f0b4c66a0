"""The embedded models' byte tokenizer as a Hugging Face tokenizer folder, for clients
that count tokens with `transformers` (AIPerf's --tokenizer), so nothing is downloaded.

    python -m specaudit.serve.hf_tokenizer DIR      # writes DIR/tokenizer.json + tokenizer_config.json

The tokenizer is GPT-2's byte-level BPE with no merges: every UTF-8 byte is one token
whose id is the byte's value (0..255, 0 = EOS), exactly specaudit.tokenizer.encode.
Written as the documented tokenizer.json format; no library needed to write it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _byte_chars() -> list[str]:
    """GPT-2's reversible byte -> printable character table, indexed by byte value."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def tokenizer_json() -> dict:
    vocab = {c: b for b, c in enumerate(_byte_chars())}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 0, "content": _byte_chars()[0], "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def write(folder) -> Path:
    """Write the tokenizer folder; returns it."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False))
    eos = _byte_chars()[0]
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False}, ensure_ascii=False))
    return d


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m specaudit.serve.hf_tokenizer DIR", file=sys.stderr)
        sys.exit(2)
    print(write(sys.argv[1]))
