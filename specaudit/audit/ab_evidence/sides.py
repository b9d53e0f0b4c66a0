"""Reading an A/B side into windows.

    windows, facts = read_side("a-dp0.log,a-dp1.log", "A")    # [EvWindow], {"files", "engine", "notes"}

A side as typed (a path, comma-separated paths, quoted globs, Prometheus URLs) -> its
inputs (expand_side) -> windows. Engine logs, scrapes and per-request outputs are read by
specaudit.audit.sources into a Reading and cut at its windows (windows_from_reading;
cumulative windows differenced into intervals); a Prometheus server's range is read over
HTTP (read_url); trace datasets are cut here from their step rows (windows_from_traces).
The same evidence twice on a side (a copied log, a run listed twice) counts once, and one
side holds one engine.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np

from specaudit.audit.ab_evidence.window import EvWindow, concurrency_bin
from specaudit.audit.defaults import WINDOW_FORWARDS
from specaudit.trace.safe_io import InputError

TRACE_SUFFIXES = (".parquet",)


def _rank(r) -> str:
    """'DP1 TP0' / 'engine 1' / 'dp_rank 1' -> '1'; None (the only rank) -> '0'."""
    if r is None:
        return "0"
    m = re.search(r"(?:DP|engine|dp_rank)\s*(\d+)", str(r))
    if m:
        return str(int(m.group(1)))
    m = re.search(r"\d+", str(r))
    return str(int(m.group(0))) if m else str(r)


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
