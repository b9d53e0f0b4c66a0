"""vLLM's start-up lines: which target, which drafter, which speculative method.

Two lines name them (vLLM V1, 2025-2026):

    (APIServer pid=7) INFO 12-02 06:40:01 [api_utils.py:286] non-default args: {'model': '/m/t',
        'enforce_eager': True, 'speculative_config': {'model': '/m/t', 'num_speculative_tokens': 4}}
    (EngineCore pid=9) INFO 12-02 06:40:09 [core.py:134] Initializing a V1 LLM engine (v0.32.0)
        with config: model='/m/t', speculative_config=SpeculativeConfig(method='draft_model',
        model='/m/t', num_spec_tokens=4), tokenizer='/m/t', ..., device_config=cpu, ...

The first is what the user passed (a Python dict literal, read with ast.literal_eval,
never eval); the second is what the engine resolved (the method is only known there). The
keys this module puts into Reading.config (the vocabulary of the SA7xx rules):

    engine_version      "0.32.0" (the engine line)
    device              "cpu", "cuda", ... (the engine line's device_config)
    target_model        the target's name or folder, as printed
    draft_model         the drafter's name or folder, as printed (None for ngram, suffix)
    spec_method         draft_model | eagle | eagle3 | mtp | ngram | ... (engine line, or
                        the user's explicit 'method')
    draft_sample_method greedy (vLLM's default) | probabilistic, as the user passed it
    num_spec_tokens     k
    spec_off            True when the engine line says speculative_config=None
    startup_line        the line number of the line that gave the models
"""
from __future__ import annotations

import ast
import re

ENGINE_RE = re.compile(r"Initializing a V1 LLM engine \(v(?P<ver>[^)\s]+)\) with config: model='(?P<model>[^']*)'")
SPEC_RE = re.compile(r"speculative_config=SpeculativeConfig\(method='(?P<method>[^']*)', "
                     r"model=(?:'(?P<dmodel>[^']*)'|None), num_spec_tokens=(?P<k>\d+)\)")
DEVICE_RE = re.compile(r"\bdevice_config=(?P<dev>[A-Za-z0-9_:]+)")
ARGS_RE = re.compile(r"non-default args: (?P<dict>\{.*\})\s*$")
MAX_ARGS = 64 * 1024   # a longer dict is not a start-up line worth parsing


def startup(raw: str, line: int) -> dict:
    """What one start-up line says (empty when it is neither, or does not parse)."""
    out: dict = {}
    m = ENGINE_RE.search(raw)
    if m:
        out.update(engine_version=m.group("ver"), target_model=m.group("model"), startup_line=line)
        s = SPEC_RE.search(raw, m.end())
        if s:
            out.update(spec_method=s.group("method"), draft_model=s.group("dmodel"),
                       num_spec_tokens=int(s.group("k")))
        elif "speculative_config=None" in raw:
            out["spec_off"] = True   # the engine resolved no speculative decoding
        d = DEVICE_RE.search(raw, m.end())
        if d:
            out["device"] = d.group("dev")
        return out
    a = ARGS_RE.search(raw)
    if not a or len(a.group("dict")) > MAX_ARGS:
        return out
    try:
        args = ast.literal_eval(a.group("dict"))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return out
    if not isinstance(args, dict):
        return out
    sc = args.get("speculative_config")
    if isinstance(args.get("model"), str):
        out["target_model"] = args["model"]
    if isinstance(sc, dict):
        out["startup_line"] = line
        if isinstance(sc.get("model"), str):
            out["draft_model"] = sc["model"]
        if isinstance(sc.get("method"), str):
            out["spec_method"] = sc["method"]
        out["draft_sample_method"] = sc.get("draft_sample_method") or "greedy"
        if isinstance(sc.get("num_speculative_tokens"), int):
            out["num_spec_tokens_arg"] = sc["num_speculative_tokens"]
    return out


def _norm(name: str) -> str:
    """A model name or folder compared as printed: trailing slashes and './' dropped."""
    n = name.strip().rstrip("/")
    return n[2:] if n.startswith("./") else n


def self_draft(config: dict) -> bool:
    """True when the log shows a separate draft model that is the target itself: method
    draft_model (resolved by the engine, or passed explicitly) and the same name or folder
    for both. MTP and EAGLE checkpoints may share the target's folder but draft with their
    own heads: not a self-draft."""
    t, d = config.get("target_model"), config.get("draft_model")
    if not (isinstance(t, str) and isinstance(d, str) and t and d):
        return False
    return config.get("spec_method") == "draft_model" and _norm(t) == _norm(d)
