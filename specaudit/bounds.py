"""Every number a user can type, bounded up front: one table, checked right after parsing.

    from specaudit.bounds import check_args
    check_args("calibrate", parser, args)     # ValueError: one line naming the flag and its range

Why up front: an absurd size (`calibrate --n-nodes 100000`, `ab --bootstrap 1000000000`,
`lossless --samples 1000000000`) used to run for minutes and then fail inside torch or
numpy (exit 3, an internal error) or exhaust memory, when the input was at fault (exit 2).
A bound here is a ceiling that no sensible run comes near; commands keep their own finer
checks (a budget that does not fit the model, a top-p outside (0, 1]).

Rules, for every option whose argparse type is int or float (and the comma-separated
integer grids of calibrate):
  * floats must be finite (nan, inf, 1e400 are refused);
  * a value must lie in BOUNDS[(command, dest)], else BOUNDS[dest], else the defaults
    (integers within int32; floats within +-1e12), inclusive;
  * `open_low` bounds exclude their low end (a flush interval of 0 s is no interval),
    `open_high` ones their high end (a "same" band of 100% of A is no band).
"""
from __future__ import annotations

import math

from specaudit.numfmt import typed

INT32 = 2**31 - 1
DEFAULT_INT = (-INT32, INT32)
DEFAULT_FLOAT = (-1e12, 1e12)

# dest -> (low, high[, "open_low" | "open_high"]); one row per flag name, shared by the commands that have it
BOUNDS: dict = {
    "concurrency": (1, 1024),          # requests in one batched forward / running at once
    "n_nodes": (1, 1024),              # verify nodes per step (draft budget + 1)
    "budget": (1, 1023),
    "topk": (1, 1024),
    "top_k": (1, 1 << 20),
    "max_new_tokens": (1, 1 << 20),
    "num_prompts": (1, 100_000),
    "repeats": (1, 1000),
    "samples": (1, 100_000),           # lossless: samples per prompt and arm
    "positions": (1, 256),             # lossless: output positions tested (the embedded context is 512)
    "prompt_len": (1, 256),
    "bootstrap": (1, 100_000),         # resamples: 2000 is the default, 100k is already slow
    "bootstrap_seed": (0, 2**32 - 1),
    "seed": (0, 2**32 - 1),
    "threads": (1, 1024),
    "examples": (0, 100_000),
    "max_per_code": (0, 10**8),
    "max_rows": (0, 10**9),
    "window_forwards": (2, 10**6),
    "min_windows": (1, 10**6),
    "port": (0, 65535),
    "max_queue": (0, 10**6),
    "flush_steps": (1, 10**8),
    "flush_seconds": (0.0, 86400.0, "open_low"),
    "drain_seconds": (0.0, 3600.0),
    "estimate_window": (0.0, 86400.0, "open_low"),
    "otel_sample_ratio": (0.0, 1.0),
    "baseline_tps": (1e-6, 1e9),       # tokens/s: 1e-320 or 1e308 are not a throughput
    "observed_tps": (1e-6, 1e9),
    "baseline_std": (0.0, 1e9),
    "observed_std": (0.0, 1e9),
    "cost_factor": (1e-6, 1e6),
    "cost_factor_std": (0.0, 1e6),
    "reported_commit_len": (0.0, 1e6, "open_low"),
    "reported_accept_depth": (0.0, 1e6, "open_low"),
    "tolerance": (0.0, 1e3),
    "alpha": (0.0, 1.0, "open_low"),
    "distortion": (0.0, 1.0),
    "same_within": (0.0, 1.0, "open_high"),   # a fraction of A: ab_verdict.check_same_within's [0, 1)
    "margin_tol": (0.0, 1e6),
    "temperature": (0.0, 100.0),
    "top_p": (0.0, 1.0),
    "eos_id": (0, INT32),
}
# (command, dest) -> bound where a command means something else by the same name
BOUNDS_BY_COMMAND: dict = {}
# string options holding comma-separated integer grids: (command, dest) -> BOUNDS key
INT_GRIDS = {("calibrate", "n_nodes"): "n_nodes", ("calibrate", "concurrency"): "concurrency"}


def bound_of(command: str | None, dest: str, kind: type):
    b = BOUNDS_BY_COMMAND.get((command, dest)) or BOUNDS.get(dest)
    if b is None:
        return (*(DEFAULT_INT if kind is int else DEFAULT_FLOAT), "")
    return (b[0], b[1], b[2] if len(b) > 2 else "")


def check_value(flag: str, v, lo, hi, mode: str = "") -> None:
    """ValueError (one line: the flag, the bound it broke, the other bound, the value) when v
    is not finite or out of bounds. `mode`: "" (both ends in), "open_low" or "open_high"."""
    open_low, open_high = mode == "open_low", mode == "open_high"
    finite = not (isinstance(v, float) and not math.isfinite(v))
    low = f"above {typed(lo)}" if open_low else f"at least {typed(lo)}"
    high = f"below {typed(hi)}" if open_high else f"at most {typed(hi)}"
    pos = "positive, " if lo > 0 or (open_low and lo == 0) else ""
    if not finite:
        raise ValueError(f"{flag} must be a finite number {low} and {high} (got {typed(v)})")
    if not (v > lo if open_low else v >= lo):
        raise ValueError(f"{flag} must be {low} ({pos}{high}; got {typed(v)})")
    if not (v < hi if open_high else v <= hi):
        raise ValueError(f"{flag} must be {high} ({low}; got {typed(v)})")


def _flag(action) -> str:
    longs = [o for o in action.option_strings if o.startswith("--")]
    return (longs or action.option_strings or [action.dest])[0]


def _aliases(parser) -> dict:
    """dest -> " (old spelling --x)" for the hidden aliases a renamed flag keeps for one release."""
    import argparse
    out: dict = {}
    for a in getattr(parser, "_actions", ()):
        if a.help == argparse.SUPPRESS and a.option_strings:
            out.setdefault(a.dest, []).extend(a.option_strings)
    return {d: f" (old spelling {', '.join(v)})" for d, v in out.items()}


def check_args(command: str | None, parser, args) -> None:
    """Check every numeric option of `parser` that `args` holds; ValueError for the first bad one."""
    import argparse
    values = vars(args)
    aliases = _aliases(parser)
    flag = lambda a: _flag(a) + ("" if a.help == argparse.SUPPRESS else aliases.get(a.dest, ""))
    for a in getattr(parser, "_actions", ()):
        if a.dest not in values:
            continue
        v = values[a.dest]
        grid = INT_GRIDS.get((command, a.dest))
        if grid is not None and isinstance(v, str):
            lo, hi, ol = bound_of(command, grid, int)
            for part in v.split(","):
                part = part.strip()
                if part.lstrip("-").isdigit():
                    check_value(flag(a), int(part), lo, hi, ol)
            continue
        if a.type not in (int, float) or v is None or isinstance(v, bool):
            continue
        for x in (v if isinstance(v, list) else [v]):
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                continue   # not this action's value (an alias's SUPPRESS default, a string grid)
            lo, hi, ol = bound_of(command, a.dest, a.type)
            check_value(flag(a), x, lo, hi, ol)
