"""vLLM's benchmark summaries: the `Speculative Decoding` section of `vllm bench serve`
and the summary printed by `examples/offline_inference/spec_decode.py`.

`vllm bench serve` (2025-2026) ends its report with a section whose label column is 40
characters wide:

    ---------------Speculative Decoding---------------
    Acceptance rate (%):                     61.02
    Acceptance length:                       2.83
    Drafts:                                  1234
    Draft tokens:                            3702
    Accepted tokens:                         2259
    Per-position acceptance (%):
      Position 0:                            80.00
    ==================================================

(a value may read `N/A`; `Drafts`, `Draft tokens`, `Accepted tokens` may be absent.)
Over the run, from the server's counters: rate = 100 x accepted / draft tokens, length =
1 + accepted / drafts, position i = 100 x accepted at i / drafts, two decimals.

`spec_decode.py` prints, after a line of dashes:

    total_num_output_tokens: 12840
    num_drafts: 3925
    num_draft_tokens: 11775
    num_accepted_tokens: 7110
    mean acceptance length: 2.81
    acceptance at token 0: 0.80

(length = 1 + accepted / drafts; position i = accepted at i / drafts; two decimals.) The
output-token total bounds what was accepted: every draft step emits its accepted drafts
plus one token, so output tokens >= drafts + accepted (SA731).
"""
from __future__ import annotations

import re

from specaudit.audit.sources.reading import LineParser, Reading, Window

NUM = r"(-?(?:\d+(?:\.\d*)?|\.\d+)|N/A|nan|inf)"
BENCH_HEAD = re.compile(r"^-{3,}\s*Speculative Decoding\s*-{3,}\s*$")
BENCH = {
    "rate_pct": re.compile(r"^Acceptance rate \(%\):\s+" + NUM + r"\s*$"),
    "length": re.compile(r"^Acceptance length:\s+" + NUM + r"\s*$"),
    "drafts": re.compile(r"^Drafts:\s+" + NUM + r"\s*$"),
    "draft_tokens": re.compile(r"^Draft tokens:\s+" + NUM + r"\s*$"),
    "accepted": re.compile(r"^Accepted tokens:\s+" + NUM + r"\s*$"),
}
BENCH_POS_HEAD = re.compile(r"^Per-position acceptance \(%\):\s*(N/A)?\s*$")
BENCH_POS = re.compile(r"^\s*Position (\d+):\s+" + NUM + r"\s*$")
EX = {
    "output": re.compile(r"^total_num_output_tokens:\s*" + NUM + r"\s*$"),
    "drafts": re.compile(r"^num_drafts:\s*" + NUM + r"\s*$"),
    "draft_tokens": re.compile(r"^num_draft_tokens:\s*" + NUM + r"\s*$"),
    "accepted": re.compile(r"^num_accepted_tokens:\s*" + NUM + r"\s*$"),
    "length": re.compile(r"^mean acceptance length:\s*" + NUM + r"\s*$"),
}
EX_POS = re.compile(r"^acceptance at token (\d+):\s*" + NUM + r"\s*$")

BENCH_VERSION = "vllm bench serve 'Speculative Decoding' section"
EX_VERSION = "examples/offline_inference/spec_decode.py summary"
CONV = {"accept_rate": "accepted / draft tokens over the run (bench: percent, two decimals)",
        "accept_len": "1 + accepted / drafts (verify steps): counts the bonus token",
        "per_pos": "accepted at position i / drafts (unconditional)"}

MARKERS = (b"Speculative Decoding", b"Acceptance", b"Drafts:", b"Draft tokens:", b"Accepted tokens:",
           b"Position ", b"num_draft", b"num_accepted_tokens", b"total_num_output_tokens",
           b"mean acceptance length", b"acceptance at token")


def looks_like_line(line: str) -> bool:
    s = line.strip()
    return bool(BENCH_HEAD.match(s)) or s.startswith("num_accepted_tokens:") or s.startswith("total_num_output_tokens:")


def _number_or_na(s: str):
    """A number, None for N/A; ValueError for nan / inf."""
    if s == "N/A":
        return None
    x = float(s)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(s)
    return x


def _whole(key: str, tok: str) -> bool:
    """A last line's value is whole when it shows the decimals vLLM prints (two for rates
    and lengths); a count shows nothing that tells a cut, so a count on a cut line is not."""
    if key in ("drafts", "draft_tokens", "accepted", "output"):
        return False
    return tok == "N/A" or ("." in tok and len(tok) - tok.index(".") - 1 == 2)


class Parser(LineParser):
    source = "vllm-bench"
    engine = "vllm"

    def __init__(self, path: str):
        super().__init__(path)
        self.block: dict | None = None   # the section being read: its kind, first line, values

    def _close(self):
        b, self.block = self.block, None
        if not b:
            return
        v, kind, first = b["v"], b["kind"], b["line"]
        w = Window(line=first, engine="vllm", kind="interval", conventions=dict(CONV))
        w.drafts, w.draft_tokens, w.accepted_tokens = v.get("drafts"), v.get("draft_tokens"), v.get("accepted")
        w.accept_len = v.get("length")
        pos = [p for _i, p in sorted(b["pos"].items())]
        if b.get("pos_cut"):
            pos = []   # a position was cut: k and the sum of the rates cannot be told
        elif b["pos"] and sorted(b["pos"]) != list(range(len(b["pos"]))):
            # a position missing (a cut or reordered paste): k and the rates cannot be told
            self.skip(first, f"per-position rates with a gap (positions {sorted(b['pos'])}): not read", b["text"])
            pos = []
        if kind == "bench":
            w.version = BENCH_VERSION
            if v.get("rate_pct") is not None:
                w.accept_rate = v["rate_pct"] / 100.0
                w.extra["printed_rate"] = (w.accept_rate, 0.00005)   # percent with two decimals
            if pos and all(p is not None for p in pos):
                w.per_pos = [p / 100.0 for p in pos]
                w.extra["pos_tol"] = 0.00005
        else:
            w.version = EX_VERSION
            if v.get("output") is not None:
                w.extra["output_tokens"] = v["output"]
            if pos and all(p is not None for p in pos):
                w.per_pos = pos
                w.extra["pos_tol"] = 0.005   # two decimals
            w.conventions.pop("accept_rate")
        if w.per_pos and w.drafts and w.draft_tokens:
            ratio = w.draft_tokens / w.drafts
            if abs(ratio - round(ratio)) < 1e-9 and len(w.per_pos) < round(ratio):
                # vLLM drafts k per step: fewer rates than k means the paste stops early
                self.skip(first, f"{len(w.per_pos)} per-position rates but drafted / drafts = {round(ratio)}: "
                                 "the list is incomplete (not read)", b.get("text", ""))
                w.per_pos = None
                w.extra.pop("pos_tol", None)
        if w.per_pos:
            w.per_pos_kind = "verify_steps"
            w.k = len(w.per_pos)
        if not any(x is not None for x in (w.accept_len, w.accept_rate, w.drafts, w.draft_tokens, w.accepted_tokens)):
            self.skip(first, f"{w.version} without a single figure (all N/A)", b.get("text", ""))
            return
        w.text = f"{w.version} at line {first}"
        self.reading.windows.append(w)

    def feed(self, i: int, raw: str) -> None:
        s = raw.strip()
        if not s:
            return
        if BENCH_HEAD.match(s):
            self._close()
            self.block = {"kind": "bench", "line": i, "v": {}, "pos": {}, "text": s}
            return
        if EX["output"].match(s) or (EX["drafts"].match(s) and (self.block is None or self.block["kind"] != "ex")):
            self._close()
            self.block = {"kind": "ex", "line": i, "v": {}, "pos": {}, "text": s}
        b = self.block
        if b is None:
            return
        table = BENCH if b["kind"] == "bench" else EX
        cut = i == self.unterminated   # the file's last line, without its newline: maybe cut mid-number
        try:
            for key, r in table.items():
                m = r.match(s)
                if m:
                    if key in b["v"]:   # a second summary without its header line
                        self._close()
                        return self.feed(i, raw)
                    if cut and not _whole(key, m.group(1)):
                        self.skip(i, "truncated vLLM benchmark summary line (the file ends inside it)", raw)
                        return
                    b["v"][key] = _number_or_na(m.group(1))
                    return
            m = (BENCH_POS if b["kind"] == "bench" else EX_POS).match(raw if b["kind"] == "bench" else s)
            if m:
                if cut and not _whole("pos", m.group(2)):
                    self.skip(i, "truncated vLLM benchmark summary line (the file ends inside it)", raw)
                    b["pos_cut"] = True
                    return
                b["pos"][int(m.group(1))] = _number_or_na(m.group(2))
                return
            if b["kind"] == "bench" and BENCH_POS_HEAD.match(s):
                return
            if s.startswith("acceptance at token") or s.startswith("Position "):
                # a per-position line without its value: the list is incomplete
                self.skip(i, "truncated vLLM benchmark per-position line", raw)
                b["pos_cut"] = True
                return
        except ValueError:
            self.skip(i, "vLLM benchmark summary value that is not a finite number", raw)
            self.block = None
            return
        if s.startswith("---") and b["kind"] == "ex" and not b["pos"]:
            return   # the dashes between the counts and the per-position rates
        self._close()   # any other line ends the section

    def finish(self) -> Reading:
        self._close()
        return super().finish()

    def finalize(self, reading) -> None:
        reading.version = next((w.version for w in reading.windows if w.version), None)
