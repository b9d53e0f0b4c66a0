"""The embedded models' tokenizer (bytes; 0 is EOS) and the prompts they are run on.

Its own small module because readers (diff shows prompts), the server and the runtime
all need it, and none of them should import the run wiring for a byte decoder.
"""
from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from specaudit.trace.safe_io import InputError

MAX_PROMPTS_BYTES = 64 << 20   # a prompts file; more is not a prompt set


def default_prompts() -> list[str]:
    """The embedded held-out prompts (source code the models never trained on)."""
    text = resources.files("specaudit").joinpath("data/prompts.jsonl").read_text()
    return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]


def load_prompts(path) -> list[str]:
    """JSONL ({"prompt": ...} or a JSON string per line) or plain text, one prompt a line."""
    from specaudit.inputs import read_input_text
    p = Path(path)
    if not os.path.lexists(p):
        raise InputError(p, "prompts file not found")
    text = read_input_text(p, MAX_PROMPTS_BYTES, "--prompts")   # a FIFO or a device: refused, never waited on
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if p.suffix in (".jsonl", ".json"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(p, f"line {i} is not JSON ({e.msg})") from None
            if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
                out.append(obj["prompt"])
            elif isinstance(obj, str):
                out.append(obj)
            else:
                raise InputError(p, f"line {i}: expected a string or an object with \"prompt\"")
        else:
            out.append(line)
    if not out:
        raise InputError(p, "no prompts in file")
    return out


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(tokens) -> str:
    return bytes(t for t in tokens if 0 < t < 256).decode("utf-8", errors="replace")
