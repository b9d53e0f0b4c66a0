"""Observed throughput: the tokens/s the estimator divides, from any input it takes.

One Observation per figure: from --observed-tps, a `scripts/load.py` output, a trace
dataset (steady-state decode from its timestamps) or an engine log / scrape (its windows,
split in two when they disagree at the same throughput: SA708's split_by_step_rate);
`gather` picks the reader for what the user gave.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from specaudit.audit.cost_profile import MAX_PROFILE_BYTES
from specaudit.stats import mean_se
from specaudit.trace.safe_io import InputError

STALL_FACTOR = 4.0        # trace forwards slower than this x the median are stalls, set apart


@dataclass
class Observation:
    """One observed throughput figure with what the estimator needs beside it."""

    source: str                       # traces | load | sglang-log | vllm-log | prom-text | cli
    tps: float                        # tokens/s
    tps_std: float = 0.0              # standard error of tps
    concurrency: int | None = None
    n_nodes: int | None = None        # N = root + drafts (budget + 1)
    reported_commit_len: float | None = None
    reported_accept_depth: float | None = None   # mean accepted depth (drafts only), when the input has it
    label: str = ""                   # run id, window, file
    samples: int = 1
    extra: dict = field(default_factory=dict)


def observation_from_load_json(path) -> Observation:
    """The last JSON line of `scripts/load.py` output: client-side tokens/s.

    Uses tokens_per_s (aggregate, client-measured); when per_request_tokens_per_s is a
    list, its spread gives the standard error (relative, applied to the aggregate)."""
    from specaudit.inputs import read_input_text
    p = Path(path)
    lines = [ln for ln in read_input_text(p, MAX_PROFILE_BYTES, "--load", errors="replace").splitlines()
             if ln.strip()]
    obj = None
    for ln in reversed(lines):
        try:
            obj = json.loads(ln)
        except (ValueError, RecursionError):   # not JSON, or nested past the decoder's depth
            continue
        if isinstance(obj, dict):
            break
        obj = None
    if obj is None:
        raise InputError(p, "no JSON object line (expected scripts/load.py output: its last line)")
    if "tokens_per_s" not in obj:
        raise InputError(p, "load output lacks tokens_per_s")
    tps = obj["tokens_per_s"]
    if not isinstance(tps, (int, float)) or isinstance(tps, bool) or not math.isfinite(tps) or tps <= 0:
        raise InputError(p, f"tokens_per_s must be positive, got {tps!r}")
    from specaudit.bounds import BOUNDS, check_value
    try:   # the bounds --observed-tps has: 1e308 or 1e-320 tokens/s is no throughput
        check_value("tokens_per_s", float(tps), *BOUNDS["observed_tps"])
    except ValueError as e:
        raise InputError(p, str(e)) from None
    per = obj.get("per_request_tokens_per_s")
    se = 0.0
    n = int(obj.get("requests") or 1)
    if isinstance(per, list) and len(per) > 1:
        m, s, k = mean_se(per)
        if k > 1 and m > 0:
            se = tps * s / m
            n = k
    elif isinstance(per, dict) and per.get("mean") and per.get("std") is not None:
        k = int(per.get("n") or obj.get("requests") or 1)
        se = tps * float(per["std"]) / float(per["mean"]) / math.sqrt(max(k, 1))
    conc = obj.get("concurrency")
    rep = None
    for key in ("spec_accept_length", "mean_commit_len", "accept_length"):
        if isinstance(obj.get(key), (int, float)):
            rep = float(obj[key])
            break
    return Observation(source="load", tps=float(tps), tps_std=se,
                       concurrency=int(conc) if isinstance(conc, (int, float)) else None,
                       reported_commit_len=rep, label=p.name, samples=n,
                       extra={k: obj[k] for k in ("requests", "completion_tokens", "wall_s") if k in obj})


def observations_from_traces(path) -> list[Observation]:
    """One Observation per run of a trace dataset: steady-state decode throughput from
    its timestamps.

    A batched forward is the rows sharing one t_start; its tokens are the tokens it
    appended (len(committed_tokens): the output clients received, never the commit_len
    counter under audit) and its time is step_s. Only forwards that ran the full
    concurrency c count (the steady state of a long run: not the drain of a finite queue,
    whose half-empty batches cost almost a full step), stalls (a forward over
    STALL_FACTOR x the median step) are set apart, and prefill is outside the steps:
        tps = sum(tokens) / sum(step_s)   over full forwards (all forwards if none is full)
    with the ratio estimator's standard error. The whole run's tokens / wall is kept in
    `extra["run_tps"]`. N = budget + 1; reported = run.json reported.mean_commit_len
    (always bonus-included), else reported.mean_accept_length made bonus-included when the
    manifest declares excludes_bonus (the checker's reading of the conventions)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from specaudit.trace.schema import discover, manifest_conventions

    out = []
    for rf in discover([path]):
        if not rf.step_files:
            raise InputError(rf.run_dir, "run has no steps-*.parquet: nothing to time")
        cols = ["request_id", "committed_tokens", "t_start", "step_s", "budget", "batch_size"]
        try:
            t = pa.concat_tables([pq.read_table(f, columns=cols) for f in rf.step_files])
        except Exception as e:  # pyarrow raises many kinds for broken files
            raise InputError(rf.run_dir, f"cannot read step files: {e}") from None
        if t.num_rows == 0:
            raise InputError(rf.run_dir, "no step rows: nothing to time")
        d = t.to_pydict()
        man = rf.manifest or {}
        cfg = man.get("config") or {}
        conc = int(cfg.get("concurrency") or max((b for b in d["batch_size"] if b is not None), default=1))
        fw: dict[float, list] = {}  # t_start -> [tokens, step_s, rows]
        for ts, toks, ss in zip(d["t_start"], d["committed_tokens"], d["step_s"]):
            if not (isinstance(ts, float) and isinstance(ss, float) and math.isfinite(ts)
                    and math.isfinite(ss) and ss >= 0):
                continue  # a row without its timing (null, NaN, negative) times nothing
            e = fw.setdefault(ts, [0, ss, 0])
            e[0] += len(toks or ())
            e[2] += 1
        if not fw:
            raise InputError(rf.run_dir, "no step row has t_start and step_s: nothing to time")
        full = [e for e in fw.values() if e[2] >= conc]
        used = full if len(full) >= 3 else list(fw.values())
        # stalls: a forward over STALL_FACTOR x the median step (a preemption, the
        # allocator, the garbage collector) is the machine's, not the step's; in a short
        # run one of them moves the rate by tens of percent
        med = sorted(e[1] for e in used)[len(used) // 2]
        stalls = [e for e in used if e[1] > STALL_FACTOR * med]
        if len(stalls) < len(used) // 4:
            used = [e for e in used if e[1] <= STALL_FACTOR * med]
        else:
            stalls = []
        tok = [e[0] for e in used]
        dt = [e[1] for e in used]
        T = sum(dt)
        if T <= 0:
            raise InputError(rf.run_dir, "step times sum to zero: cannot derive a throughput")
        tps = sum(tok) / T
        n = len(used)
        se = 0.0
        if n > 1:  # ratio estimator: var(R) = sum((tok_i - R dt_i)^2) / (n (n - 1) mean(dt)^2)
            mdt = T / n
            se = math.sqrt(sum((a - tps * b) ** 2 for a, b in zip(tok, dt)) / (n * (n - 1))) / mdt
        span = max(a + b for a, b in zip(d["t_start"], d["step_s"])) - min(d["t_start"])
        tokens = sum(len(x or ()) for x in d["committed_tokens"])
        # the pooled mean commit length re-derived from the raw tensors (committed tokens
        # per (request, step) row), never the counter under audit: the judge's alternative
        rows = sum(x is not None for x in d["committed_tokens"])
        # mean_commit_len always counts the bonus (the contract's word); an engine's own
        # "accept length" figure follows its declared convention, as the checker reads it
        reported = man.get("reported") or {}
        rep = reported.get("mean_commit_len")
        if rep is None and reported.get("mean_accept_length") is not None:
            rep = reported["mean_accept_length"]
            if manifest_conventions(man).get("accept_length") == "excludes_bonus":
                rep = rep + 1
        budget = cfg.get("budget", d["budget"][0] if d["budget"] else None)
        depth = reported.get("mean_accepted_depth")
        out.append(Observation(source="traces", tps=tps, tps_std=se, concurrency=conc,
                               n_nodes=(int(budget) + 1) if budget is not None else None,
                               reported_commit_len=rep, label=rf.run_id, samples=n,
                               reported_accept_depth=depth if isinstance(depth, (int, float)) else None,
                               extra={"forwards": len(fw), "full_forwards": len(full), "stalls": len(stalls),
                                      "steady": len(full) >= 3, "tokens": tokens,
                                      "run_tps": tokens / span if span > 0 else None,
                                      "derived_commit_len": tokens / rows if rows else None,
                                      "algo": cfg.get("algo")}))
    return out


STEP_RATE_FACTOR = 1.5   # implied step rates further apart than this: two groups of windows
MIN_WINDOWS = 4          # windows of one (rank, concurrency, graph mode) group before a split is judged


def _median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def split_by_step_rate(ws):
    """Two groups of windows whose implied step rates (gen tps / (c * accept len)) sit apart
    by more than STEP_RATE_FACTOR at their widest gap, out of at least MIN_WINDOWS windows:
    (low_rate, high_rate, factor) in file order, or None. low_rate are the windows whose
    accept len claims more tokens per step at the same throughput. Neither side is
    presumed right, however many windows it has."""
    rs = sorted(ws, key=lambda w: w.step_rate)
    if len(rs) < MIN_WINDOWS:
        return None
    best, at = 1.0, None
    for i in range(1, len(rs)):
        g = rs[i].step_rate / rs[i - 1].step_rate if rs[i - 1].step_rate > 0 else math.inf
        if g > best:
            best, at = g, i
    if at is None or best <= STEP_RATE_FACTOR:
        return None
    lo, hi = rs[:at], rs[at:]
    factor = _median([w.step_rate for w in hi]) / _median([w.step_rate for w in lo])
    return (sorted(lo, key=lambda w: w.line or 0), sorted(hi, key=lambda w: w.line or 0), factor)


def lines(ws) -> str:
    ls = [str(w.line) for w in ws if w.line is not None]
    return ("line " if len(ls) == 1 else "lines ") + (", ".join(ls) if len(ls) <= 6 else
                                                     f"{', '.join(ls[:5])}, ... ({len(ls)} windows)")


def observations_from_reading(reading, concurrency=None) -> list[Observation]:
    """Observations from an engine log or scrape: mean throughput over its windows.

    When the windows fall into two groups whose accept len disagree at the same throughput
    (SA708's split_by_step_rate), each group is one Observation, so a baseline judges each
    group's counter on its own instead of their average."""
    ws = [w for w in reading.windows if w.gen_tps is not None and w.gen_tps > 0 and not w.extra.get("counter_reset")]
    if concurrency is not None:
        ws = [w for w in ws if w.concurrency is not None and round(w.concurrency) == concurrency]
    if not ws:
        why = f" at concurrency {concurrency}" if concurrency is not None else ""
        raise InputError(reading.path, f"no window with a positive generation throughput{why} (a single "
                                       "Prometheus scrape has no rate: append a second one)")
    rated = [w for w in ws if w.step_rate is not None]
    from specaudit.invariants.sa7xx_spans import at_request_end, spans
    judged = spans(rated) if at_request_end(reading) else rated   # llama.cpp: request-end counters
    sp = split_by_step_rate(judged) if len(rated) == len(ws) else None
    if sp is None:
        return [_observation(reading, ws, Path(reading.path).name)]
    lo, hi, _ = sp
    return [_observation(reading, g, f"{Path(reading.path).name} {lines(g)}") for g in sorted(
        (lo, hi), key=lambda g: g[0].line or 0)]


def _observation(reading, ws, label: str) -> Observation:
    m, se, n = mean_se([w.gen_tps for w in ws])
    cs = [w.concurrency for w in ws if w.concurrency is not None]
    ls = [w.accept_len for w in ws if w.accept_len is not None]
    cfg = reading.config
    n_nodes = cfg.get("num_draft_tokens") or ((cfg["num_spec_tokens"] + 1) if cfg.get("num_spec_tokens") else None)
    extra = {}
    if cs and (max(cs) - min(cs)) / max(max(cs), 1) > 0.25:
        extra["confounder"] = (f"concurrency varies {min(cs):g}..{max(cs):g} across the windows; "
                               "pass --concurrency to use one level")
    conc = round(sum(cs) / len(cs)) if cs else None
    rep = sum(ls) / len(ls) if ls else None
    if rep is not None and not reading.includes_bonus:
        rep += 1
    return Observation(source=reading.source, tps=m, tps_std=se, concurrency=conc, n_nodes=n_nodes,
                       reported_commit_len=rep, label=label, samples=n, extra=extra)


def _is_load_json(path: Path) -> bool:
    from specaudit.inputs import open_input
    try:
        with open_input(path) as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 65536))
            tail = f.read().decode("utf-8", errors="replace")
    except (OSError, InputError):
        return False
    for ln in reversed([x for x in tail.splitlines() if x.strip()]):
        try:
            obj = json.loads(ln)
        except (ValueError, RecursionError):
            return False
        return isinstance(obj, dict) and "tokens_per_s" in obj
    return False


def gather(input=None, *, observed_tps=None, observed_std=0.0, load=None, source=None, concurrency=None,
           n_nodes=None) -> list[Observation]:
    """The observed throughput(s): --observed-tps, a load.py output, a trace dataset, or an
    engine log / scrape (read through specaudit.audit.sources)."""
    if load:
        if input:
            raise ValueError("give either INPUT or --load FILE, not both")
        return [observation_from_load_json(load)]
    if observed_tps is not None and input:
        raise ValueError("give either INPUT or --observed-tps, not both")
    if observed_tps is not None:
        return [Observation(source="cli", tps=observed_tps, tps_std=observed_std or 0.0,
                            concurrency=concurrency, n_nodes=n_nodes, label="--observed-tps")]
    if not input:
        raise ValueError("no observed throughput: give --observed-tps or an INPUT file/folder")
    p = Path(input)
    if not p.exists():
        raise InputError(p, "no such file or folder")
    if p.is_dir():
        return observations_from_traces(p)
    if source is None and _is_load_json(p):
        return [observation_from_load_json(p)]
    from specaudit.audit.sources import read_source
    return observations_from_reading(read_source(p, source), concurrency)
