"""Greedy speculative decoding is lossless by equality: two engines' outputs, token for token.

    res = compare_files("spec-off.jsonl", "spec-on.jsonl")
    specaudit lossless --greedy spec-off.jsonl spec-on.jsonl

Each file holds one JSON object per line, one per request, as the engine answered it: the
output token ids under `tokens` (llama-server's /completion with "return_tokens": true, or
any list of ints) and, to pair the requests, the prompt under `prompt` (else the line
number pairs them). Both runs must be greedy (temperature 0) on the same prompts with the
same stop settings: then the speculative output must equal the plain one exactly, and the
first differing position of each pair is the finding. A shorter output that is a prefix of
the other is a difference too (a stop decided differently).

Exit codes (through the command): 0 identical, 1 a pair differs, 2 input error.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specaudit.trace.safe_io import InputError


@dataclass
class GreedyResult:
    a: str
    b: str
    pairs: int = 0
    tokens: int = 0
    diffs: list = field(default_factory=list)      # {"key", "position", "a", "b", "len_a", "len_b"}
    unpaired: list = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.diffs else 0

    def to_dict(self) -> dict:
        return {"kind": "specaudit-lossless-greedy", "a": self.a, "b": self.b, "pairs": self.pairs,
                "tokens_compared": self.tokens, "identical": not self.diffs, "diffs": self.diffs,
                "unpaired": self.unpaired}

    def text(self) -> str:
        head = (f"greedy outputs: {self.pairs} requests paired by prompt, {self.tokens} tokens compared "
                f"({self.a} vs {self.b})")
        lines = [head]
        for d in self.diffs[:10]:
            lines.append(f"  request {d['key']}: first difference at output position {d['position']}: "
                         f"token {d['a']} vs {d['b']} (lengths {d['len_a']} / {d['len_b']})")
        if len(self.diffs) > 10:
            lines.append(f"  ... and {len(self.diffs) - 10} more")
        if self.unpaired:
            lines.append(f"  {len(self.unpaired)} requests on one side only (not compared; first: {self.unpaired[0]})")
        if self.diffs:
            lines.append(f"NOT lossless: {len(self.diffs)} of {self.pairs} greedy outputs differ; greedy speculative "
                         "decoding must reproduce the plain output exactly")
        elif self.pairs:
            lines.append(f"Identical: all {self.pairs} greedy outputs equal token for token.")
        return "\n".join(lines)


def read_outputs(path) -> dict:
    """{prompt (or #line): [token ids]} from one JSONL file."""
    from specaudit.inputs import iter_jsonl
    p = Path(path)
    out = {}
    for i, rec in iter_jsonl(p, "the outputs"):
        toks = rec.get("tokens") if isinstance(rec, dict) else None
        if not isinstance(toks, list) or not all(isinstance(t, int) for t in toks):
            raise InputError(p, f"line {i} has no `tokens` list of token ids (llama-server: \"return_tokens\": true)")
        key = rec.get("prompt") if isinstance(rec.get("prompt"), str) else f"#{i}"
        if key in out:
            raise InputError(p, f"line {i} repeats a prompt of an earlier line; give each prompt once")
        out[key] = toks
    if not out:
        raise InputError(p, "no outputs in this file")
    return out


def compare(a: dict, b: dict, name_a: str = "A", name_b: str = "B") -> GreedyResult:
    res = GreedyResult(name_a, name_b)
    for n, (key, ta) in enumerate(a.items(), 1):
        tb = b.get(key)
        if tb is None:
            res.unpaired.append(key[:60])
            continue
        res.pairs += 1
        res.tokens += min(len(ta), len(tb))
        if ta != tb:
            j = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
            res.diffs.append({"key": n, "prompt": key[:60], "position": j, "a": ta[j] if j < len(ta) else "(end)",
                              "b": tb[j] if j < len(tb) else "(end)", "len_a": len(ta), "len_b": len(tb)})
    res.unpaired += [k[:60] for k in b if k not in a]
    if not res.pairs:
        raise InputError(Path(name_b), "no request of B has the prompt of a request of A: nothing to compare")
    return res


def compare_files(a, b) -> GreedyResult:
    return compare(read_outputs(a), read_outputs(b), str(a), str(b))
