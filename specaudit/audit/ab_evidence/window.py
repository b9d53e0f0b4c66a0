"""A window of A/B evidence, and the vocabulary of its strata and metrics.

    EvWindow       one window of one side: its stratum values and its figures
    METRICS        the figures compared, higher being better for each
    KEYS           the stratum keys: OPERATIONAL (what a deployment's load and set-up
                   change) then DESIGN (what an experiment varies)
    concurrency_bin, value_order, value_text
                   a stratum value binned, sorted and shown

specaudit.audit.ab_evidence.sides makes the windows; the rest of the package reads them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

METRICS = ("accept_len", "accept_rate", "tokens_per_s", "commit_len_tput")
METRIC_LABEL = {"accept_len": "accept length", "accept_rate": "accept rate", "tokens_per_s": "tokens/s",
                "commit_len_tput": "commit length (throughput)"}
OPERATIONAL = ("concurrency", "cuda_graph", "rank")
DESIGN = ("k", "topk", "algo", "engine", "version", "model")
KEYS = OPERATIONAL + DESIGN
KEY_LABEL = {"concurrency": "concurrency", "cuda_graph": "cuda graph", "rank": "rank", "k": "k",
             "topk": "topk", "algo": "algo", "engine": "engine", "version": "version", "model": "model"}


@dataclass
class EvWindow:
    """One window of one side, with its stratum values and its figures."""

    side: str                        # "A" | "B"
    file: str
    ref: str                         # "line 12", "run r1 forwards 16-31"
    strata: dict = field(default_factory=dict)   # key -> value (None = unknown)
    accept_len: float | None = None
    accept_rate: float | None = None
    tokens_per_s: float | None = None
    commit_len_tput: float | None = None
    concurrency: float | None = None  # the raw running-request count (strata hold its bin)
    key: tuple = ()                  # its values of the matched keys (set by compare_windows)


def concurrency_bin(c: float, mode: str = "pow2"):
    """Running requests -> its bin: 1, 2, "3-4", "5-8", ... (pow2) or the integer (exact)."""
    n = max(1, int(round(c)))
    if mode == "exact" or n <= 2:
        return n
    hi = 1 << (n - 1).bit_length()
    return f"{hi // 2 + 1}-{hi}"


def value_order(v) -> float:
    """Sort key of a stratum value: the number (or a bin's lower bound) first, text last."""
    if isinstance(v, bool) or v is None:
        return math.inf
    m = re.fullmatch(r"(\d+)(?:-\d+)?", str(v))
    return float(m.group(1)) if m else math.inf


def value_text(key: str, v) -> str:
    """A stratum value as text."""
    if v is None:
        return "unknown"
    if key == "cuda_graph":
        return "on" if v else "off"
    return str(v)
