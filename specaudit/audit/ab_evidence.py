"""A/B from evidence: compare two engines' logs, scrapes or trace datasets fairly.

    from specaudit.audit.ab_evidence import compare_sides, format_text
    res = compare_sides(["linear.log"], ["ddtree.log"])
    res["conclusion"]   # "the pooled gap in accept length 3.45 vs 2.00 is concurrency: ..."

Nothing is rerun. Each side (one or several files of one engine) is cut into windows:

    window     one interval over which the engine reported its figures: one SGLang
               `Decode batch` line, one vLLM `SpecDecoding metrics` line, one Prometheus
               scrape interval (read by specaudit.audit.sources), or, for a trace dataset,
               up to --window-forwards consecutive verify forwards of one run at the same
               batch size (the run's first window is dropped as warm-up when it has 3+)
    stratum    the window's values of what changes acceptance or speed on its own:
               concurrency (running requests, binned 1, 2, 3-4, 5-8, ...; exact with
               concurrency_bins="exact"), cuda graph on/off, data-parallel rank, draft
               tokens per step k, topk, algorithm, engine, engine version, model

Per window, higher is better for every metric:
    accept_len       tokens per verify step, bonus included: the engine's figure for logs
                     (+1 when the source excludes the bonus); for traces re-derived from
                     the rows (committed tokens / steps), never the commit_len counter
    accept_rate      accepted drafts / drafted tokens, from the window's counts, else
                     (accept_len - 1) / k; never the printed rate, whose formula changed
                     between engine versions (SGLang counted the bonus until ~v0.5.11), so
                     two versions' printed rates are not the same quantity; traces: from
                     accepted_path and node_tokens
    tokens_per_s     generation throughput of all running requests; traces: committed
                     tokens / the forwards' step seconds (steady state)
    commit_len_tput  throughput-derived commit length (specaudit.audit.estimate), only
                     with a baseline and a cost factor: (tokens_per_s / c) / baseline(c) * r

Keys are split in two. Matched keys must be equal for two windows to be compared; a
stratum is one combination of their values. Varied keys are what the A/B compares: by
default the design keys (k, topk, algo, engine, version, model) that differ between the
sides throughout; `vary` names them explicitly (an operational key named there is
compared across, and said to be confounded). A key unknown on a side is not matched.

For each stratum with enough windows on both sides, per metric: A's and B's mean over
windows with a 95% interval made by a method fit for the windows' number, named in the
output (specaudit.audit.ab_stats: below 20 windows Student's t with n - 1 df, their
autocorrelation being impossible to estimate from so few; from 20 a moving-block
bootstrap, blocks of about n^(1/3) or the correlation time of neighbouring windows,
since a burst of load spans several; numpy, seeded), the permutation test of B - A
over windows, B - A with its interval, and a verdict from specaudit.audit.ab.verdict (the project's one A/B
decision: same / A better / B better / undecided). Strata on one side only are listed,
never compared. `matched` pools the compared strata with precision weights
nA*nB/(nA+nB); `pooled` is every window of each side, stratum ignored (its interval
resamples within strata, holding each side's mix as observed). When the two
disagree (Simpson's paradox when they point opposite ways) it is said first.

The confounder report names every key whose distribution over windows differs between A
and B and how much of the pooled gap G = pooled B - pooled A it explains: with G_k the
gap left after standardising on that key alone (per-value differences over the values
both sides hold, weighted by their windows), explains = (G - G_k) / G. A key whose
values the sides never share is inseparable: no window can say what it does.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specaudit.audit.ab_stats import METHOD_T, METHOD_TEXT, method_for, more_windows, permutation_p, t_reps
from specaudit.numfmt import signed as _num
from specaudit.stats import percentile_ci as _ci
from specaudit.trace.schema import InputError

KIND = "specaudit-ab-evidence"
VERSION = 1
METRICS = ("accept_len", "accept_rate", "tokens_per_s", "commit_len_tput")
METRIC_LABEL = {"accept_len": "accept length", "accept_rate": "accept rate", "tokens_per_s": "tokens/s",
                "commit_len_tput": "commit length (throughput)"}
OPERATIONAL = ("concurrency", "cuda_graph", "rank")
DESIGN = ("k", "topk", "algo", "engine", "version", "model")
KEYS = OPERATIONAL + DESIGN
KEY_LABEL = {"concurrency": "concurrency", "cuda_graph": "cuda graph", "rank": "rank", "k": "k",
             "topk": "topk", "algo": "algo", "engine": "engine", "version": "version", "model": "model"}
WINDOW_FORWARDS = 16       # trace windows: consecutive verify forwards at one batch size
MIN_WINDOWS = 3            # a stratum is compared only with this many windows on each side
TRACE_SUFFIXES = (".parquet",)


class NoOverlap(ValueError):
    """The sides share no stratum: nothing can be compared fairly."""


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


# ------------------------------------------------------------------ verdicts

def decide(diff_ci, base: float, same_within: float) -> str:
    """The one place a same / A better / B better / undecided verdict is made here."""
    from specaudit.audit.ab import verdict
    return verdict(list(diff_ci), base, same_within)


# ------------------------------------------------------------------ strata

def concurrency_bin(c: float, mode: str = "pow2"):
    """Running requests -> its bin: 1, 2, "3-4", "5-8", ... (pow2) or the integer (exact)."""
    n = max(1, int(round(c)))
    if mode == "exact" or n <= 2:
        return n
    hi = 1 << (n - 1).bit_length()
    return f"{hi // 2 + 1}-{hi}"


def _bin_lo(v) -> float:
    """Sort key of a stratum value: the number (or a bin's lower bound) first, text last."""
    if isinstance(v, bool) or v is None:
        return math.inf
    m = re.fullmatch(r"(\d+)(?:-\d+)?", str(v))
    return float(m.group(1)) if m else math.inf


def show(key: str, v) -> str:
    """A stratum value as text."""
    if v is None:
        return "unknown"
    if key == "cuda_graph":
        return "on" if v else "off"
    return str(v)


def _rank(r) -> str:
    """'DP1 TP0' / 'engine 1' / 'dp_rank 1' -> '1'; None (the only rank) -> '0'."""
    if r is None:
        return "0"
    m = re.search(r"(?:DP|engine|dp_rank)\s*(\d+)", str(r))
    if m:
        return str(int(m.group(1)))
    m = re.search(r"\d+", str(r))
    return str(int(m.group(0))) if m else str(r)


# ------------------------------------------------------------------ reading sides

def is_trace_path(p: Path) -> bool:
    return p.is_dir() or p.suffix in TRACE_SUFFIXES or p.name == "run.json"


def _split(text: str) -> list[str]:
    """Split a side on commas outside braces and quotes (a Prometheus matcher keeps its own)."""
    out, cur, depth, quote = [], [], 0, None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur))
    return [x.strip() for x in out if x.strip()]


def is_url(part) -> bool:
    return str(part).startswith(("http://", "https://"))


def expand_side(spec) -> list:
    """A side as typed -> its inputs: paths (a path, comma-separated paths, quoted glob
    patterns) and Prometheus URLs (kept as text)."""
    import glob
    items = spec if isinstance(spec, (list, tuple)) else [spec]
    out: list = []
    for item in items:
        for part in _split(str(item)):
            if is_url(part):
                out.append(part)
            elif any(ch in part for ch in "*?["):
                hits = sorted(glob.glob(part))
                if not hits:
                    raise InputError(part, "the pattern matches no file")
                out += [Path(h) for h in hits]
            else:
                out.append(Path(part))
    return out


def read_url(url: str) -> list:
    """A Prometheus server as a side: URL[?match={job="a"}&range=6h&step=30s&timeout=30s] -> Readings
    (specaudit.audit.sources.prom_http; every interval between samples a window)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    from specaudit.audit.sources.prom_http import parse_duration, read_prometheus
    u = urlsplit(url)
    ours = {"match": [], "range": "6h", "step": "30s", "timeout": "30s"}
    rest = []
    for k, v in parse_qsl(u.query, keep_blank_values=True):
        if k == "match":
            ours["match"].append(v)
        elif k in ("range", "step", "timeout"):
            ours[k] = v
        else:
            rest.append((k, v))
    base = urlunsplit((u.scheme, u.netloc, u.path, urlencode(rest), ""))
    try:
        rng, step = parse_duration(ours["range"], "range"), parse_duration(ours["step"], "step")
        timeout = parse_duration(ours["timeout"], "timeout")   # the whole of each request, not one read
    except ValueError as e:
        raise InputError(url, str(e)) from None
    return read_prometheus(base, range_s=rng, step_s=step, match=ours["match"], timeout=max(timeout, 0.1))


def _config_k(reading) -> tuple:
    """(k drafted tokens per step, topk, algo) from a Reading's config, None when unknown."""
    cfg = reading.config or {}
    k = None
    if cfg.get("num_draft_tokens") is not None:        # SGLang: verify nodes, root included
        k = int(cfg["num_draft_tokens"]) - 1
    elif cfg.get("num_spec_tokens") is not None:       # vLLM: drafted tokens per step
        k = int(cfg["num_spec_tokens"])
    for name in ("k", "draft_tokens_per_step", "max_draft_len"):
        if k is None and cfg.get(name) is not None:
            k = int(cfg[name])
    topk = cfg.get("topk")
    algo = cfg.get("speculative_algorithm") or cfg.get("method") or cfg.get("algo")
    return k, (int(topk) if isinstance(topk, (int, float)) else topk), (str(algo) if algo else None)


def _reading_meta(reading) -> dict:
    cfg = reading.config or {}
    version = getattr(reading, "version", None) or cfg.get("version") or cfg.get("engine_version")
    model = (getattr(reading, "model", None) or cfg.get("model") or cfg.get("model_path")
             or cfg.get("served_model_name") or cfg.get("model_name"))
    return {"engine": getattr(reading, "engine", None), "version": str(version) if version else None,
            "model": str(model) if model else None}


def _interval_windows(windows) -> tuple[list, int]:
    """Cumulative windows (figures since start-up) -> per-interval windows by differencing
    consecutive counts of one rank; gauges and interval windows pass through. Returns
    (windows, cumulative windows that could not be differenced and were left out)."""
    from dataclasses import replace
    out, dropped, last = [], 0, {}
    for w in windows:
        if getattr(w, "kind", "interval") != "cumulative":
            out.append(w)
            continue
        prev = last.get(w.rank)
        last[w.rank] = w
        have = all(getattr(w, f) is not None for f in ("drafts", "accepted_tokens"))
        if prev is None or not have:
            dropped += prev is not None or not have
            continue
        dd = w.drafts - (prev.drafts or 0)
        da = w.accepted_tokens - (prev.accepted_tokens or 0)
        if dd <= 0 or da < 0:
            dropped += 1
            continue
        dt = (w.draft_tokens - prev.draft_tokens) if (w.draft_tokens is not None and prev.draft_tokens is not None) \
            else None
        out.append(replace(w, kind="interval", drafts=dd, accepted_tokens=da, draft_tokens=dt,
                           accept_len=1.0 + da / dd, accept_rate=None))
    return out, dropped


def windows_from_reading(reading, side: str, bins: str = "pow2") -> tuple[list[EvWindow], int]:
    """An engine Reading -> (EvWindows with stratum values and figures, cumulative windows
    left out). Reads the sources' shared vocabulary (Window.engine/version/k when the
    reader fills them, else the Reading's and its config's)."""
    k0, topk, algo = _config_k(reading)
    meta = _reading_meta(reading)
    bonus = 0.0 if getattr(reading, "includes_bonus", True) else 1.0
    wins, dropped = _interval_windows(reading.windows)
    out = []
    for w in wins:
        k = getattr(w, "k", None) or k0
        L = None
        if w.accept_len is not None and math.isfinite(w.accept_len):
            L = w.accept_len + bonus
        elif w.accepted_tokens is not None and w.drafts:
            L = 1.0 + w.accepted_tokens / w.drafts
        rate = None
        if w.accepted_tokens is not None and w.draft_tokens:
            rate = w.accepted_tokens / w.draft_tokens
        elif L is not None and k:
            rate = (L - 1.0) / k
        c = w.concurrency if (w.concurrency is not None and math.isfinite(w.concurrency)
                              and w.concurrency > 0) else None
        tps = w.gen_tps if (w.gen_tps is not None and math.isfinite(w.gen_tps) and w.gen_tps > 0) else None
        ref = f"line {w.line}" if w.line is not None else (w.time or "window")
        version = getattr(w, "version", None) or meta["version"]
        out.append(EvWindow(
            side=side, file=reading.path, ref=ref, accept_len=L, accept_rate=rate, tokens_per_s=tps,
            concurrency=c,
            strata={"concurrency": concurrency_bin(c, bins) if c is not None else None,
                    "cuda_graph": w.cuda_graph, "rank": _rank(w.rank), "k": int(k) if k else None, "topk": topk,
                    "algo": algo, "engine": getattr(w, "engine", None) or meta["engine"],
                    "version": str(version) if version else None, "model": meta["model"]}))
    return out, dropped


def windows_from_traces(path, side: str, bins: str = "pow2", window_forwards: int = WINDOW_FORWARDS,
                        seen_runs: dict | None = None, notes: list | None = None) -> list:
    """A trace dataset (or run folder / file) -> EvWindows from its step rows.

    A verify forward is the rows of one run sharing t_start (one row per request in the
    batch). Windows are up to `window_forwards` consecutive forwards at one batch size;
    shorter ones (a batch draining) need a quarter of that (at least 2) to count.
    Figures come from the tensors: committed tokens, accepted paths, node counts.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from specaudit.trace.schema import discover

    runs = discover([path])
    cols = ["t_start", "step_s", "node_tokens", "accepted_path", "committed_tokens", "algo", "budget", "topk"]
    out: list[EvWindow] = []
    min_fw = max(2, window_forwards // 4)
    for rf in runs:
        if not rf.step_files:
            continue
        if seen_runs is not None:   # a run listed twice on a side (a copy, the same folder) counts once
            first = seen_runs.get(rf.run_id) or (str(rf.duplicate_of) if rf.duplicate_of else None)
            if first is not None:
                if notes is not None:
                    notes.append(f"{side}: {rf.run_dir}: run {rf.run_id} is already counted from {first}; "
                                 "counted once")
                continue
            seen_runs[rf.run_id] = str(rf.run_dir)
        man = rf.manifest or {}
        eng = man.get("engine") or {}
        engine = eng.get("name") if isinstance(eng, dict) else str(eng)
        version = eng.get("version") if isinstance(eng, dict) else None
        tgt = ((man.get("models") or {}).get("target") or {})
        model = tgt.get("name") if isinstance(tgt, dict) else None
        cfg = man.get("config") or {}
        acc = {k: [] for k in ("ts", "n_nodes", "path_len", "commit", "step_s", "algo", "budget", "topk")}
        try:
            for f in rf.step_files:
                for rb in pq.ParquetFile(f).iter_batches(columns=cols, batch_size=65536):
                    # one row group at a time: the list columns are reduced to their lengths at once
                    acc["ts"].append(rb.column("t_start").to_numpy(zero_copy_only=False))
                    acc["n_nodes"].append(pc.list_value_length(rb.column("node_tokens")).to_numpy(zero_copy_only=False))
                    acc["path_len"].append(pc.list_value_length(rb.column("accepted_path"))
                                           .to_numpy(zero_copy_only=False))
                    acc["commit"].append(pc.list_value_length(rb.column("committed_tokens"))
                                         .to_numpy(zero_copy_only=False))
                    acc["step_s"].append(rb.column("step_s").to_numpy(zero_copy_only=False))
                    acc["algo"].append(rb.column("algo").to_numpy(zero_copy_only=False))
                    acc["budget"].append(rb.column("budget").to_numpy(zero_copy_only=False))
                    acc["topk"].append(rb.column("topk").to_numpy(zero_copy_only=False))
        except Exception as e:
            raise InputError(rf.run_dir, f"cannot read the step rows: {str(e).splitlines()[0][:200]}") from None
        if not acc["ts"] or sum(len(x) for x in acc["ts"]) == 0:
            continue
        cat = {k: np.concatenate(v) for k, v in acc.items()}
        ts = cat["ts"].astype(np.float64)
        order = np.argsort(ts, kind="stable")
        ts = ts[order]
        n_nodes = cat["n_nodes"][order].astype(np.float64)        # [S] nodes per step row
        path_len = cat["path_len"][order].astype(np.float64)      # [S] accepted path incl. root
        commit = cat["commit"][order].astype(np.float64)          # [S] tokens committed
        step_s = cat["step_s"][order].astype(np.float64)
        algo, budget, topk = cat["algo"][order], cat["budget"][order], cat["topk"][order]
        # forwards: runs of equal t_start
        starts = np.flatnonzero(np.r_[True, ts[1:] != ts[:-1]])            # [F]
        rows = np.diff(np.r_[starts, len(ts)])                                # [F] rows per forward
        f_commit = np.add.reduceat(commit, starts)                           # [F]
        f_acc = np.add.reduceat(path_len - 1.0, starts)                      # [F] accepted drafts
        f_draft = np.add.reduceat(n_nodes - 1.0, starts)                     # [F] drafted tokens
        f_s = np.maximum.reduceat(step_s, starts)                            # [F] one forward's seconds
        f_batch = rows.astype(np.float64)                                    # requests actually in it
        F = len(starts)
        wins = []  # (first, last+1)
        i = 0
        while i < F:
            j = i + 1
            while j < F and j - i < window_forwards and f_batch[j] == f_batch[i]:
                j += 1
            wins.append((i, j))
            i = j
        if len(wins) >= 3:
            wins = wins[1:]  # warm-up
        for a, b in wins:
            if b - a < min_fw:
                continue
            steps = rows[a:b].sum()
            secs = f_s[a:b].sum()
            c = float(f_batch[a])
            r0 = starts[a]
            k = int(budget[r0])
            drafted = f_draft[a:b].sum()
            out.append(EvWindow(
                side=side, file=str(rf.run_dir), ref=f"run {rf.run_id} forwards {a}-{b - 1}",
                accept_len=float(f_commit[a:b].sum() / steps),
                accept_rate=float(f_acc[a:b].sum() / drafted) if drafted > 0 else None,
                tokens_per_s=float(f_commit[a:b].sum() / secs) if secs > 0 else None,
                concurrency=c,
                strata={"concurrency": concurrency_bin(c, bins), "cuda_graph": cfg.get("cuda_graph"),
                        "rank": _rank(cfg.get("rank")), "k": k, "topk": int(topk[r0]), "algo": str(algo[r0]),
                        "engine": engine, "version": str(version) if version is not None else None,
                        "model": model}))
    return out


def _content_id(p) -> str | None:
    """A digest of a regular file's bytes (two copies of one log are one piece of evidence);
    None for a folder or anything unreadable (its reader reports it)."""
    import hashlib

    from specaudit.inputs import open_input
    if Path(p).is_dir():
        return None
    h = hashlib.sha256()
    try:
        with open_input(p) as f:
            for b in iter(lambda: f.read(1 << 20), b""):
                h.update(b)
    except (InputError, OSError):
        return None
    return "sha256:" + h.hexdigest()


def read_side(spec, side: str, *, source: str | None = None, bins: str = "pow2",
              window_forwards: int = WINDOW_FORWARDS) -> tuple[list[EvWindow], dict]:
    """One side's files -> (windows, facts about the side). InputError for bad input."""
    from specaudit.audit.sources import read_source
    paths = expand_side(spec)
    if not paths:
        raise InputError(None, f"side {side} names no file")
    windows: list[EvWindow] = []
    files, notes = [], []
    engines: dict = {}
    seen_runs: dict = {}    # run id -> the folder it was first read from
    seen_files: dict = {}   # content digest (or URL) -> the input it was first read from
    sizes: dict = {}        # only files whose size another input shares are hashed
    for p in paths:
        if not is_url(p):
            try:
                sizes.setdefault(os.stat(p).st_size, []).append(str(p))
            except OSError:
                pass
    for p in paths:
        if is_url(p):
            ident = str(p)
        else:
            try:
                shared = len(sizes.get(os.stat(p).st_size, ())) > 1
            except OSError:
                shared = False
            ident = _content_id(p) if shared else None
        if ident is not None and ident in seen_files:
            # the same log twice (or a copy of it) would double the windows and narrow the intervals
            notes.append(f"{side}: {p}: the same evidence as {seen_files[ident]}; counted once")
            continue
        if ident is not None:
            seen_files[ident] = str(p)
        if is_url(p):
            rs = read_url(p)
            ws = []
            for r in rs:
                ws += windows_from_reading(r, side, bins)[0]
            if not ws:
                raise InputError(p, f"side {side}: no interval windows in the range (a longer range=)")
            for e in {w.strata.get("engine") for w in ws}:
                engines.setdefault(e, set()).add(str(p))
            files.append({"path": str(p), "kind": "prometheus", "windows": len(ws)})
            windows += ws
            continue
        if source is None and p.exists() and is_trace_path(p):
            n0 = len(notes)
            ws = windows_from_traces(p, side, bins, window_forwards, seen_runs, notes)
            if not ws and len(notes) > n0:
                continue   # its runs were copies of runs already counted
            if not ws:
                raise InputError(p, f"side {side}: no trace windows of {max(2, window_forwards // 4)}+ "
                                    "verify forwards at one batch size in it (too few step rows)")
            kind = "trace"
        else:
            if not p.exists():
                raise InputError(p, "no such file or folder")
            from specaudit.audit.sources import llamacpp_responses as LR
            if source in (None, LR.SOURCE) and (source == LR.SOURCE or LR.looks_like(p)):
                r = LR.read_responses(p)    # per-request timings: tokens/s on both sides
                if r.config["speculation"] != "on":
                    notes.append(f"{side}: {p}: llama-server responses without draft_n (speculation off"
                                 f"{' in some' if r.config['speculation'] == 'mixed' else ''}): tokens/s only, "
                                 "no acceptance figures on this side")
            else:
                r = read_source(p, source)
            ws, n_cum = windows_from_reading(r, side, bins)
            kind = r.source
            if n_cum:
                notes.append(f"{side}: {p}: {n_cum} cumulative windows (figures since start-up) could not be "
                             "turned into intervals and were left out")
            if not ws:
                raise InputError(p, f"side {side}: no interval windows in it (only cumulative figures since "
                                    "start-up; several scrapes or log intervals are needed)")
        for e in {w.strata.get("engine") for w in ws}:
            engines.setdefault(e, set()).add(str(p))
        files.append({"path": str(p), "kind": kind, "windows": len(ws)})
        windows += ws
    if len(engines) > 1:
        desc = "; ".join(f"{e or 'unknown'}: {', '.join(sorted(fs))}" for e, fs in engines.items())
        raise InputError(None, f"side {side} mixes engines ({desc}); put one engine on each side")
    return windows, {"files": files, "engine": next(iter(engines), None), "notes": notes}


# ------------------------------------------------------------------ statistics

BOOT_EXACT_MAX = 5000       # more windows than this: the bootstrap mean is drawn from its normal limit


def _boot_means(rng, x: np.ndarray, n_boot: int) -> np.ndarray:
    """[n_boot] replicates of the mean of windows x [n] (in time order).

    Fewer than BLOCK_MIN_WINDOWS: drawn from the t distribution with n - 1 df
    (specaudit.audit.ab_stats: their correlation cannot be estimated from so few).
    Otherwise moving-block bootstrap resamples:
    Up to BOOT_EXACT_MAX windows the resamples are drawn (blocks of block_len(n)
    neighbouring windows, [n_boot, n] indices); above, the resampled mean is drawn from
    its normal limit N(mean, sd' / sqrt(n)), sd' widened for neighbour correlation (the
    central limit theorem is exact enough there, and a 1 GB log's million windows would
    need n_boot x 10^6 draws)."""
    n = len(x)
    if method_for(n) == METHOD_T:
        return t_reps(rng, x, n_boot)        # too few windows to see their correlation
    if n > BOOT_EXACT_MAX:
        return rng.normal(x.mean(), _block_sd(x) / math.sqrt(n), size=n_boot)
    r = _lag1(x)
    L = block_len(n, r)
    nb = -(-n // L)                                                   # blocks per resample
    starts = rng.integers(0, n - L + 1, size=(n_boot, nb))            # [n_boot, nb]
    idx = (starts[:, :, None] + np.arange(L)[None, None, :]).reshape(n_boot, nb * L)[:, :n]
    reps = x[idx].mean(axis=1)                                        # [n_boot]
    # few blocks under-cover: never narrower than the effective-sample-size t interval
    n_eff = max(n * (1 - r) / (1 + r), 2.0)
    want = _t975(n_eff - 1) * _block_sd(x) / math.sqrt(n)             # half-width it must reach
    have = Z95 * float(reps.std())
    if have > 0 and want > have:
        reps = x.mean() + (reps - reps.mean()) * (want / have)
    return reps


Z95 = 1.959963984540054


def _t975(df: float) -> float:
    """Student's t 97.5% quantile (Cornish-Fisher expansion in 1/df; df >= 1), no scipy."""
    z = Z95
    df = max(float(df), 1.0)
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def block_len(n: int, r: float = 0.0) -> int:
    """Moving-block length for n windows in time order: n^(1/3), or the windows' AR(1)
    correlation time (1 + r) / (1 - r) when longer (r: lag-1 correlation), at most n / 2.
    Neighbouring log windows share their load (a burst spans several): resampling single
    windows would read correlated windows as independent evidence and narrow the interval."""
    tau = (1 + r) / (1 - r)
    return int(max(1, min(max(round(n ** (1 / 3)), round(tau)), n // 2)))


def _lag1(x: np.ndarray) -> float:
    """Lag-1 correlation of neighbouring windows, clipped to [0, 0.95] (0 when undefined)."""
    if len(x) < 3 or float(x.std()) == 0:
        return 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        r = float(np.corrcoef(x[:-1], x[1:])[0, 1])
    return min(max(r if math.isfinite(r) else 0.0, 0.0), 0.95)


def _block_sd(x: np.ndarray) -> float:
    """Standard deviation for the mean's normal limit, inflated for neighbour correlation
    (the AR(1) factor sqrt((1 + r) / (1 - r)))."""
    r = _lag1(x)
    return float(x.std()) * math.sqrt((1 + r) / (1 - r))


def _vals(ws: list[EvWindow], m: str) -> np.ndarray:
    return np.array([getattr(w, m) for w in ws if getattr(w, m) is not None], dtype=np.float64)


def _compare(xa: np.ndarray, xb: np.ndarray, rng, n_boot: int, same_within: float) -> dict | None:
    """Means, intervals, difference and verdict of two samples of windows (None if empty)."""
    if len(xa) == 0 or len(xb) == 0:
        return None
    ra, rb = _boot_means(rng, xa, n_boot), _boot_means(rng, xb, n_boot)
    a, b = float(xa.mean()), float(xb.mean())
    dci = _ci(rb - ra)
    v = decide(dci, a, same_within)
    out = {"a": {"mean": a, "ci95": _ci(ra), "n": int(len(xa)), "method": method_for(len(xa))},
           "b": {"mean": b, "ci95": _ci(rb), "n": int(len(xb)), "method": method_for(len(xb))},
           "diff_b_minus_a": {"mean": b - a, "ci95": dci},
           "permutation_p": permutation_p(xa, xb, rng),
           "verdict": v, "_reps": (ra, rb)}
    if v == "undecided":
        out["more_windows"] = more_windows(len(xa), len(xb), dci, b - a, a, same_within)
    return out


def _pooled_reps(ws: list, m: str, key, rng, n_boot: int):
    """(mean, [n_boot] replicates) of a side's pooled mean, stratified: each stratum's
    windows are resampled on their own and weighted by their share of the side, so the
    mix of conditions is held as observed (a series that jumps between strata is not
    read as one correlated series). None when no window has the metric."""
    groups: dict = {}
    for w in ws:
        v = getattr(w, m)
        if v is not None:
            groups.setdefault(key(w), []).append(v)
    n = sum(len(v) for v in groups.values())
    if n == 0:
        return None
    reps = np.zeros(n_boot)
    mean = 0.0
    for vals in groups.values():
        x = np.asarray(vals, dtype=np.float64)
        reps += len(x) / n * _boot_means(rng, x, n_boot)
        mean += len(x) / n * float(x.mean())
    return mean, reps, n


def _pooled(wa, wb, m, key, rng, n_boot, same_within) -> dict | None:
    pa, pb = _pooled_reps(wa, m, key, rng, n_boot), _pooled_reps(wb, m, key, rng, n_boot)
    if pa is None or pb is None:
        return None
    (a, ra, na), (b, rb, nb) = pa, pb
    dci = _ci(rb - ra)
    return {"a": {"mean": a, "ci95": _ci(ra), "n": na}, "b": {"mean": b, "ci95": _ci(rb), "n": nb},
            "diff_b_minus_a": {"mean": b - a, "ci95": dci}, "verdict": decide(dci, a, same_within)}


def _strip(d: dict | None) -> dict | None:
    if d is None:
        return None
    return {k: v for k, v in d.items() if not k.startswith("_")}


def _label(key_vals: dict) -> str:
    return ", ".join(f"{KEY_LABEL[k]} {show(k, v)}" for k, v in key_vals.items()) or "all windows"


def _parse_per_c(text, what: str):
    """'98' -> 98.0 (every concurrency); '1=98,8=90' -> {1: 98.0, 8: 90.0}."""
    if text is None:
        return None
    if isinstance(text, (int, float, dict)):
        return text
    s = str(text).strip()
    try:
        if "=" not in s:
            v = float(s)
            if not (math.isfinite(v) and v > 0):
                raise ValueError
            return v
        out = {}
        for part in s.split(","):
            c, _, v = part.partition("=")
            out[int(c)] = float(v)
            if not (math.isfinite(out[int(c)]) and out[int(c)] > 0):
                raise ValueError
        return out
    except ValueError:
        raise ValueError(f"{what} {text!r}: give one positive number or CONCURRENCY=VALUE pairs, "
                         "comma-separated (e.g. 1=98,8=90)") from None


def _parse_cost(text):
    if text is None:
        return None
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        vals = []
    if len(vals) not in (1, 2) or not all(math.isfinite(v) and v > 0 for v in vals):
        raise ValueError(f"--cost-factor {text!r}: one positive factor for both sides, or two (A,B)")
    return {"A": vals[0], "B": vals[-1]}


def add_throughput_commit(windows: list[EvWindow], baseline, cost) -> int:
    """Fill commit_len_tput where the window's concurrency has a baseline; count them."""
    from specaudit.audit.estimate_model import estimate_commit_length
    n = 0
    for w in windows:
        if w.tokens_per_s is None or w.concurrency is None:
            continue
        base = baseline if isinstance(baseline, float) else baseline.get(int(round(w.concurrency)))
        if base is None:
            continue
        w.commit_len_tput = estimate_commit_length(w.tokens_per_s / w.concurrency, base, cost[w.side]).value
        n += 1
    return n


# ------------------------------------------------------------------ the comparison

def compare_windows(wa: list[EvWindow], wb: list[EvWindow], *, vary=None, same_within: float = 0.02,
                    n_boot: int = 2000, seed: int = 0, primary: str = "accept_len",
                    min_windows: int = MIN_WINDOWS, side_facts: dict | None = None) -> dict:
    """The A/B of two sides' windows (see the module docstring). NoOverlap / ValueError on bad input."""
    if primary not in METRICS:
        raise ValueError(f"--primary for evidence must be one of {', '.join(METRICS)}")
    bad = [v for v in vary or [] if v not in KEYS]
    if bad:
        raise ValueError(f"--vary {','.join(bad)}: not a stratum key; keys are {', '.join(KEYS)}")
    warnings: list[str] = []
    # windows without a running-request count cannot be stratified by concurrency; only a
    # user who names concurrency in --vary (compare across it) may keep them
    across = bool(vary) and "concurrency" in vary
    for lab, ws in (("A", wa), ("B", wb)):
        if not ws:
            raise InputError(None, f"side {lab} has no windows")
        miss = [w for w in ws if w.concurrency is None]
        if across:
            continue
        if len(miss) == len(ws):
            raise InputError(miss[0].file, f"side {lab}: none of its {len(ws)} windows says how many requests were "
                                           "running, so they cannot be matched by concurrency (log the scheduler's "
                                           "running-request count, e.g. vLLM's 'Running: N reqs' engine line; or, "
                                           "knowing both ran the same load, --vary concurrency)")
        if miss:
            warnings.append(f"{lab}: {len(miss)} of {len(ws)} windows have no (or a zero) running-request count "
                            f"(first: {miss[0].file} {miss[0].ref}); left out")
    if not across:
        wa = [w for w in wa if w.concurrency is not None]
        wb = [w for w in wb if w.concurrency is not None]

    def values(ws, k):
        return {w.strata.get(k) for w in ws}

    unknown, varied, matched = {}, {}, []
    explicit = list(vary) if vary else None
    for k in KEYS:
        va, vb = values(wa, k), values(wb, k)
        if va == {None} or vb == {None}:
            if va != vb or (explicit and k in explicit):
                unknown[k] = [lab for lab, v in (("A", va), ("B", vb)) if v == {None}]
            continue
        if explicit is not None:
            if k in explicit:
                varied[k] = {"a": sorted(map(str, va)), "b": sorted(map(str, vb))}
            else:
                matched.append(k)
        elif k in DESIGN and not (va & vb):
            varied[k] = {"a": sorted(map(str, va)), "b": sorted(map(str, vb))}
        else:
            matched.append(k)
    for k, labs in unknown.items():
        warnings.append(f"{KEY_LABEL[k]} is not reported by {' and '.join(labs)}: not matched "
                        "(a difference in it would go unseen)")
    if explicit is not None:
        for k in explicit:
            if k in matched or (k not in varied and k not in unknown):
                warnings.append(f"--vary {k}: A and B have the same {KEY_LABEL[k]}")
        op = [k for k in varied if k in OPERATIONAL]
        if op:
            warnings.append(f"compared across {', '.join(KEY_LABEL[k] for k in op)} (--vary): it changes "
                            "acceptance or speed on its own, so the verdicts include its effect")
    if len(varied) > 1:
        warnings.append("A and B differ throughout in " + ", ".join(KEY_LABEL[k] for k in varied)
                        + ": a difference cannot be pinned on one of them")

    for w in wa + wb:
        w.key = tuple(w.strata.get(k) for k in matched)

    def skey(w):
        return w.key

    groups: dict = {}
    for w in wa + wb:
        groups.setdefault(skey(w), {"A": [], "B": []})[w.side].append(w)
    # keys that take one value in every window are stated once, not in each stratum label
    shown = [k for k in matched if len(values(wa + wb, k)) > 1]
    common = {k: next(iter(values(wa + wb, k))) for k in matched if k not in shown}

    def label(key):
        return {k: v for k, v in zip(matched, key) if k in shown}

    def order(key):
        return tuple((_bin_lo(v), str(v)) for v in key)

    rng = np.random.default_rng(seed)
    strata, one_sided, thin = [], [], []
    for key in sorted(groups, key=order):
        g = groups[key]
        lab = label(key)
        if not g["A"] or not g["B"]:
            side = "A" if g["A"] else "B"
            one_sided.append({"stratum": {k: show(k, v) for k, v in lab.items()}, "label": _label(lab),
                              "side": side, "windows": len(g[side])})
            continue
        if len(g["A"]) < min_windows or len(g["B"]) < min_windows:
            thin.append({"stratum": {k: show(k, v) for k, v in lab.items()}, "label": _label(lab),
                         "windows_a": len(g["A"]), "windows_b": len(g["B"])})
            continue
        mets = {}
        for m in METRICS:
            r = _compare(_vals(g["A"], m), _vals(g["B"], m), rng, n_boot, same_within)
            if r is not None:
                mets[m] = r
        strata.append({"stratum": {k: show(k, v) for k, v in lab.items()}, "label": _label(lab),
                       "windows_a": len(g["A"]), "windows_b": len(g["B"]), "metrics": mets})
    if not strata:
        raise NoOverlap(_no_overlap_reason(wa, wb, matched, one_sided, thin, min_windows))

    # matched: the compared strata pooled with precision weights; pooled: every window
    matched_res, pooled_res = {}, {}
    for m in METRICS:
        have = [s for s in strata if m in s["metrics"]]
        if have:
            wts = np.array([s["windows_a"] * s["windows_b"] / (s["windows_a"] + s["windows_b"]) for s in have])
            wts = wts / wts.sum()
            a = float(sum(wt * s["metrics"][m]["a"]["mean"] for wt, s in zip(wts, have)))
            b = float(sum(wt * s["metrics"][m]["b"]["mean"] for wt, s in zip(wts, have)))
            ra = sum(wt * s["metrics"][m]["_reps"][0] for wt, s in zip(wts, have))
            rb = sum(wt * s["metrics"][m]["_reps"][1] for wt, s in zip(wts, have))
            dci = _ci(rb - ra)
            matched_res[m] = {"a": {"mean": a, "ci95": _ci(ra)}, "b": {"mean": b, "ci95": _ci(rb)},
                              "diff_b_minus_a": {"mean": b - a, "ci95": dci},
                              "verdict": decide(dci, a, same_within), "strata": len(have)}
        p = _pooled(wa, wb, m, skey, rng, n_boot, same_within)
        if p is not None:
            pooled_res[m] = p
    for s in strata:
        s["metrics"] = {m: _strip(v) for m, v in s["metrics"].items()}

    paradox = []
    for m in METRICS:
        p, q = pooled_res.get(m), matched_res.get(m)
        if not p or not q or p["verdict"] == "undecided" or p["verdict"] == q["verdict"]:
            continue
        reversal = {p["verdict"], q["verdict"]} == {"A better", "B better"}
        paradox.append({
            "metric": m, "pooled_verdict": p["verdict"], "matched_verdict": q["verdict"], "reversal": reversal,
            "message": (f"pooled {METRIC_LABEL[m]} says {p['verdict']} "
                        f"({_num(p['a']['mean'])} vs {_num(p['b']['mean'])}) "
                        f"but the matched strata say {q['verdict']} ({_num(q['a']['mean'])} vs {_num(q['b']['mean'])})"
                        + (": Simpson's paradox, the pooled figures point the wrong way" if reversal else
                           ": the pooled figures compare different conditions"))})

    confounders = confounder_report(wa, wb, primary, matched, varied, pooled_res, matched_res, same_within)
    res = {
        "kind": KIND, "version": VERSION,
        "sides": {lab: {**((side_facts or {}).get(lab) or {}), "windows": len(ws)}
                  for lab, ws in (("A", wa), ("B", wb))},
        "matched_keys": matched, "common": {k: show(k, v) for k, v in common.items()},
        "varied": varied, "unknown_keys": unknown,
        "primary": primary, "same_within": same_within, "bootstrap": n_boot, "seed": seed,
        "min_windows": min_windows,
        "paradox": paradox, "pooled": pooled_res, "matched": matched_res,
        "strata": strata, "one_sided": one_sided, "too_few_windows": thin,
        "confounders": confounders, "warnings": warnings,
    }
    res["verdict"] = matched_res.get(primary, {}).get("verdict", "undecided")
    res["conclusion"] = conclusion(res)
    return res


def _no_overlap_reason(wa, wb, matched, one_sided, thin, min_windows) -> str:
    if thin:
        t = thin[0]
        return (f"A and B share strata but none with {min_windows}+ windows on each side ({t['label']}: "
                f"A {t['windows_a']}, B {t['windows_b']}); longer logs (more windows) there would make them comparable")
    parts, fixes = [], []
    for k in matched:
        va = sorted({w.strata.get(k) for w in wa}, key=lambda v: (_bin_lo(v), str(v)))
        vb = sorted({w.strata.get(k) for w in wb}, key=lambda v: (_bin_lo(v), str(v)))
        if set(va) & set(vb):
            continue
        sa = "/".join(show(k, v) for v in va)
        sb = "/".join(show(k, v) for v in vb)
        parts.append(f"A has {KEY_LABEL[k]} {sa}, B {sb}")
        fixes.append(f"windows of B at {KEY_LABEL[k]} {sa} or of A at {sb}")
    if not parts:
        parts.append("their windows never agree on " + ", ".join(KEY_LABEL[k] for k in matched) + " together")
        fixes.append(f"windows of both sides in one condition (e.g. B at {one_sided[0]['label']})"
                     if one_sided else "windows of both sides in one condition")
    return ("A and B share no stratum: " + "; ".join(parts) + ". To compare them fairly collect "
            + "; ".join(fixes) + " (or name the key with --vary to compare across it, confounded)")


class _Side:
    """One side's windows as arrays: per key an integer code per window, per metric a
    float per window (nan = missing). The confounder report groups with bincount."""

    def __init__(self, ws: list):
        self.n = len(ws)
        self.codes = {}                       # key -> (values in first-seen order, [n] codes)
        for k in KEYS:
            idx: dict = {}
            inv = np.fromiter((idx.setdefault(w.strata.get(k), len(idx)) for w in ws), np.int64, self.n)
            self.codes[k] = (list(idx), inv)
        self.metric = {m: np.fromiter((np.nan if getattr(w, m) is None else getattr(w, m) for w in ws),
                                      np.float64, self.n) for m in METRICS}

    def groups(self, k: str, m: str) -> dict:
        """value -> (mean, windows) of metric m over the windows with that value of k."""
        vals, inv = self.codes[k]
        x = self.metric[m]
        ok = ~np.isnan(x)
        cnt = np.bincount(inv[ok], minlength=len(vals))
        tot = np.bincount(inv[ok], weights=x[ok], minlength=len(vals))
        return {v: (tot[i] / cnt[i], int(cnt[i])) for i, v in enumerate(vals) if cnt[i] > 0}

    def shares(self, k: str) -> dict:
        vals, inv = self.codes[k]
        cnt = np.bincount(inv, minlength=len(vals))
        n = max(self.n, 1)
        out = {show(k, v): c / n for v, c in zip(vals, cnt.tolist())}
        return dict(sorted(out.items(), key=lambda kv: (_bin_lo(kv[0]), kv[0])))

    def same_partition(self, k1: str, k2: str) -> bool:
        """k1 and k2 split this side's windows the same way (they moved together)."""
        (v1, c1), (v2, c2) = self.codes[k1], self.codes[k2]
        if len(v1) != len(v2):
            return False
        return len(np.unique(c1 * len(v2) + c2)) == len(v1)


def _gap_within(A: _Side, B: _Side, key: str, m: str):
    """The gap B - A after standardising on `key` alone, and the shared values (None if none)."""
    ga, gb = A.groups(key, m), B.groups(key, m)
    shared = [v for v in ga if v in gb]
    if not shared:
        return None, []
    tot = sum(ga[v][1] + gb[v][1] for v in shared)
    g = sum((ga[v][1] + gb[v][1]) / tot * (gb[v][0] - ga[v][0]) for v in shared)
    return float(g), shared


def confounder_report(wa, wb, primary, matched, varied, pooled, matched_res,
                      same_within: float = 0.02) -> list[dict]:
    """Every key whose window distribution differs between A and B, with its share of the gap.
    A pooled gap within `same_within` of A (the verdicts' "same" band) has nothing to explain."""
    A, B = _Side(wa), _Side(wb)
    out = []
    p = pooled.get(primary)
    G = p["diff_b_minus_a"]["mean"] if p else None
    small = G is None or abs(G) <= 1e-9 or (p and abs(G) <= same_within * abs(p["a"]["mean"]))
    for k in KEYS:
        sa, sb = A.shares(k), B.shares(k)
        if sa == sb:
            continue
        tv = 0.5 * sum(abs(sa.get(v, 0) - sb.get(v, 0)) for v in set(sa) | set(sb))
        if tv < 1e-9:
            continue
        gk, _shared = _gap_within(A, B, k, primary)
        entry = {"key": k, "a": sa, "b": sb, "distance": round(tv, 4),
                 "role": "varied" if k in varied else ("matched" if k in matched else "unmatched"),
                 "gap_within": gk, "explains": None, "explains_by_metric": {}}
        for m, pm in pooled.items():
            g_m = pm["diff_b_minus_a"]["mean"]
            gk_m, _ = _gap_within(A, B, k, m)
            if gk_m is not None and abs(g_m) > same_within * abs(pm["a"]["mean"]) and abs(g_m) > 1e-9:
                entry["explains_by_metric"][m] = (g_m - gk_m) / g_m
        if gk is None:
            entry["note"] = "inseparable: the sides share no value of it, no window can say what it does"
        elif small:
            entry["note"] = "the pooled figures already agree"
        else:
            entry["explains"] = (G - gk) / G
        out.append(entry)
    # keys that moved together on a side (the same partition of its windows) cannot be told apart
    for S in (A, B):
        ks = [e["key"] for e in out]
        for i, k1 in enumerate(ks):
            for k2 in ks[i + 1:]:
                if len(S.codes[k1][0]) > 1 and S.same_partition(k1, k2):
                    for e in out:
                        if e["key"] in (k1, k2):
                            other = k2 if e["key"] == k1 else k1
                            e.setdefault("moves_with", [])
                            if other not in e["moves_with"]:
                                e["moves_with"].append(other)
    out.sort(key=lambda e: (-(e["explains"] if e["explains"] is not None else -1), -e["distance"]))
    if out and p and matched_res.get(primary) and not small:
        gm = matched_res[primary]["diff_b_minus_a"]["mean"]
        out.append({"key": "all matched keys", "explains": (G - gm) / G, "gap_within": gm,
                    "role": "matched", "a": {}, "b": {}, "distance": None})
    return out


def _cell(v: dict | None, sign: bool = False) -> str:
    if not v:
        return "n/a"
    lo, hi = v["ci95"]
    return f"{_num(v['mean'], sign)} [{_num(lo, sign)}, {_num(hi, sign)}]"


def _where(common: dict, stratum: dict) -> str:
    """'at 1 running request with cuda graph on' from a stratum's shown values."""
    c = stratum.get("concurrency", common.get("concurrency"))
    parts = []
    if c is not None:
        parts.append(f"at {c} running request{'' if c == '1' else 's'}")
    rest = [f"{KEY_LABEL[k]} {v}" for k, v in stratum.items() if k != "concurrency"]
    if rest:
        parts.append(("with " if parts else "at ") + ", ".join(rest))
    return " ".join(parts) or "in the windows both sides share"


def conclusion(res: dict) -> str:
    """One sentence a person can act on."""
    m = res["primary"]
    lab = METRIC_LABEL[m]
    pooled, matched = res["pooled"].get(m), res["matched"].get(m)
    if not matched:
        return f"no matched stratum has {lab} on both sides; compare another --primary"
    # the stratum to quote: the one with most windows on the smaller side
    with_m = [s for s in res["strata"] if m in s["metrics"]]
    best = max(with_m, key=lambda s: (min(s["windows_a"], s["windows_b"]), s["windows_a"] + s["windows_b"]))
    x = best["metrics"][m]
    where = _where(res["common"], best["stratum"])
    v = x["verdict"]
    d = x["diff_b_minus_a"]
    gap = (f" by {_num(abs(d['mean']))} ({abs(d['mean']) / abs(x['a']['mean']):.0%} of A; B - A "
           f"{_cell(d, True)})" if x["a"]["mean"] else f" (B - A {_cell(d, True)})")
    mw = x.get("more_windows")
    undecided = ("undecided: these windows cannot tell; about " + f"{mw} more windows per side at this spread "
                 "would decide it" if mw else "undecided: these windows cannot tell, and more of them at this "
                 "spread would not (the gap is nil; set --same-within to ask for 'same')")
    vtxt = {"same": "the same", "undecided": undecided,
            "A better": "A is better" + gap, "B better": "B is better" + gap}[v]
    quote = f"{where} A gives {_cell(x['a'])} and B {_cell(x['b'])}, {vtxt}"
    n = len(with_m)
    if n > 1:
        agree = sum(1 for s in with_m if s["metrics"][m]["verdict"] == matched["verdict"])
        quote += f"; over all {n} matched strata: {matched['verdict']} ({agree} of {n} strata say so)"
    para = next((p for p in res["paradox"] if p["metric"] == m), None)
    top = [e for e in res["confounders"] if e.get("explains") is not None and e["key"] != "all matched keys"
           and e["explains"] >= 0.5]
    why = None
    if top:
        names = [KEY_LABEL[top[0]["key"]]] + [KEY_LABEL[k] for k in top[0].get("moves_with", [])]
        why = " and ".join(dict.fromkeys(names))
        if len(names) > 1:
            why += " (they moved together, these windows cannot tell which)"
    tail = ""
    insep = [KEY_LABEL[k] for k in res["varied"]]
    if len(insep) > 1:
        tail = (f"; A and B also differ throughout in {', '.join(insep)}, which these windows cannot separate: "
                "rerun one side with the other's settings to tell them apart")
    gap = f"the pooled gap in {lab} {_num(pooled['a']['mean'])} vs {_num(pooled['b']['mean'])}" if pooled else ""
    if para:
        return f"{gap} is {why or 'the mix of conditions on each side'}: {quote}{tail}."
    if why and pooled:
        tail += f" ({gap} is mostly {why}: explains {top[0]['explains']:.0%})"
    return f"{lab}: {quote}{tail}."


# ------------------------------------------------------------------ entry point

def one_sided_metrics(wa, wb) -> dict:
    """Metrics with figures on one side only (e.g. acceptance on the speculative side of an
    off-vs-on A/B): {metric: {"side", "mean", "windows"}}, stated rather than compared."""
    out = {}
    for m in METRICS:
        xa = [getattr(w, m) for w in wa if getattr(w, m) is not None]
        xb = [getattr(w, m) for w in wb if getattr(w, m) is not None]
        if bool(xa) != bool(xb):
            lab, xs = ("A", xa) if xa else ("B", xb)
            out[m] = {"side": lab, "mean": float(sum(xs) / len(xs)), "windows": len(xs)}
    return out


def compare_sides(side_a, side_b, *, source: str | None = None, vary=None, same_within: float = 0.02,
                  n_boot: int = 2000, seed: int = 0, primary: str = "accept_len", bins: str = "pow2",
                  window_forwards: int = WINDOW_FORWARDS, min_windows: int = MIN_WINDOWS,
                  baseline_tps=None, cost_factor=None) -> dict:
    """Read both sides and compare them. InputError / ValueError (one line) on bad input."""
    if bins not in ("pow2", "exact"):
        raise ValueError(f"--concurrency-bins must be pow2 or exact (got {bins!r})")
    if n_boot < 100:
        raise ValueError(f"--bootstrap must be at least 100 (got {n_boot})")
    if not 0 <= same_within < 1:
        raise ValueError(f"--same-within must be a fraction in [0, 1) (got {same_within})")
    if window_forwards < 2:
        raise ValueError(f"--window-forwards must be at least 2 (got {window_forwards})")
    if min_windows < 2:
        raise ValueError(f"--min-windows must be at least 2 (got {min_windows})")
    base = _parse_per_c(baseline_tps, "--baseline-tps")
    cost = _parse_cost(cost_factor)
    if (base is None) != (cost is None):
        raise ValueError("the throughput-derived commit length needs both --baseline-tps (plain decoding, "
                         "tokens/s per request) and --cost-factor (step cost / plain step)")
    if primary == "commit_len_tput" and base is None:
        raise ValueError("--primary commit_len_tput needs --baseline-tps and --cost-factor")
    wa, fa = read_side(side_a, "A", source=source, bins=bins, window_forwards=window_forwards)
    wb, fb = read_side(side_b, "B", source=source, bins=bins, window_forwards=window_forwards)
    extra = []
    if base is not None:
        n = add_throughput_commit(wa + wb, base, cost)
        if n == 0:
            raise ValueError("--baseline-tps gives no baseline at the concurrencies of these windows")
        if isinstance(base, float):
            extra.append("one --baseline-tps for every concurrency: the throughput-derived commit length "
                         "ignores how the batch slows a plain step")
    res = compare_windows(wa, wb, vary=vary, same_within=same_within, n_boot=n_boot, seed=seed,
                          primary=primary, min_windows=min_windows, side_facts={"A": fa, "B": fb})
    res["warnings"] += fa["notes"] + fb["notes"] + extra
    res["one_sided_metrics"] = one_sided_metrics(wa, wb)
    for m, d in res["one_sided_metrics"].items():
        res["warnings"].append(f"{METRIC_LABEL[m]} exists on side {d['side']} only ({d['mean']:.4g}, mean of "
                               f"{d['windows']} windows): not compared (the other side has no such figure)")
    if base is not None:
        res["baseline_tps"] = base if isinstance(base, float) else {str(k): v for k, v in base.items()}
        res["cost_factor"] = cost
    return res


# ------------------------------------------------------------------ output

def format_text(res: dict) -> str:
    L = []
    for p in res["paradox"]:
        L.append(f"WARNING: {p['message']}")
    for lab in ("A", "B"):
        s = res["sides"][lab]
        files = s.get("files") or []
        kinds = sorted({f["kind"] for f in files})
        L.append(f"{lab}: {', '.join(f['path'] for f in files)} ({', '.join(kinds)}, engine "
                 f"{s.get('engine') or 'unknown'}): {s['windows']} windows")
    if res["varied"]:
        L.append("compared (differs throughout): " + "; ".join(
            f"{KEY_LABEL[k]} {'/'.join(v['a'])} vs {'/'.join(v['b'])}" for k, v in res["varied"].items()))
    L.append("matched on: " + (", ".join(KEY_LABEL[k] for k in res["matched_keys"]) or "nothing")
             + (" (every window: " + ", ".join(f"{KEY_LABEL[k]} {v}" for k, v in res["common"].items()) + ")"
                if res["common"] else ""))
    for w in res["warnings"]:
        L.append(f"WARNING: {w}")
    L.append("")
    hdr = f"{'metric':<27} {'A [95% CI]':<25} {'B [95% CI]':<25} {'B - A [95% CI]':<27} verdict"
    for s in res["strata"]:
        L.append(f"stratum {s['label']} ({s['windows_a']} A windows, {s['windows_b']} B windows)")
        L.append("  " + hdr)
        for m, x in s["metrics"].items():
            L.append(f"  {METRIC_LABEL[m]:<27} {_cell(x['a']):<25} {_cell(x['b']):<25} "
                     f"{_cell(x['diff_b_minus_a'], True):<27} {x['verdict']}"
                     + (f" ({x['more_windows']} more windows per side would decide)"
                        if x.get("more_windows") else ""))
        L.append("  " + _method_line(s))
    for name, block in (("matched (compared strata, weighted)", res["matched"]),
                        ("pooled (every window, strata ignored)", res["pooled"])):
        L.append(name)
        L.append("  " + hdr)
        for m, x in block.items():
            L.append(f"  {METRIC_LABEL[m]:<27} {_cell(x['a']):<25} {_cell(x['b']):<25} "
                     f"{_cell(x['diff_b_minus_a'], True):<27} {x['verdict']}")
    if res["one_sided"]:
        L.append("on one side only (not compared):")
        for o in res["one_sided"]:
            L.append(f"  {o['label']}: {o['side']} only, {o['windows']} windows")
    if res["too_few_windows"]:
        L.append(f"too few windows to compare (< {res['min_windows']} on a side):")
        for o in res["too_few_windows"]:
            L.append(f"  {o['label']}: A {o['windows_a']}, B {o['windows_b']}")
    if res["confounders"]:
        L.append(f"what differs between A and B (share of the pooled {METRIC_LABEL[res['primary']]} gap it explains):")
        for e in res["confounders"]:
            if e["key"] == "all matched keys":
                L.append(f"  all matched keys together: explains {e['explains']:.0%}")
                continue
            dist = lambda d: ", ".join(f"{v} {s:.0%}" for v, s in d.items())
            ex = f"explains {e['explains']:.0%}" if e["explains"] is not None else e.get("note", "")
            mv = (f"; moved together with {', '.join(KEY_LABEL[k] for k in e['moves_with'])}"
                  if e.get("moves_with") else "")
            L.append(f"  {KEY_LABEL[e['key']]} ({e['role']}): A {dist(e['a'])}; B {dist(e['b'])} -> {ex}{mv}")
    L.append("")
    L.append(f"verdict ({METRIC_LABEL[res['primary']]}, matched): {res['verdict']}")
    L.append(res["conclusion"])
    return "\n".join(L)


def _method_line(s: dict) -> str:
    """How a stratum's intervals were made, and the permutation test of its primary metrics."""
    x = next(iter(s["metrics"].values()), None)
    if x is None:
        return ""
    ms = {x["a"]["method"], x["b"]["method"]}
    how = "; ".join(f"{side} {METHOD_TEXT[x[side.lower()]['method']]}" for side in ("A", "B")) \
        if len(ms) > 1 else METHOD_TEXT[ms.pop()]
    ps = ", ".join(f"{METRIC_LABEL[m]} p={v['permutation_p']:.3g}" for m, v in s["metrics"].items()
                   if v.get("permutation_p") is not None)
    return f"intervals: {how}; permutation test of B - A over windows: {ps}"


def to_json(res: dict) -> str:
    import json

    def clean(o):
        if isinstance(o, float):
            return o if math.isfinite(o) else None
        if isinstance(o, dict):
            return {str(k): clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        if isinstance(o, (np.floating, np.integer)):
            return clean(o.item())
        return o
    return json.dumps(clean(res), indent=1) + "\n"
