"""The trace contract as code: docs/trace-contract.md (schema version 1) in words.

Every writer (tracer, Parquet sink) and every reader (check, estimate, diff, query, report)
imports its column names, Arrow types, manifest keys and the mask hash from here and
from nowhere else. Readers never import each other. Bad input is an InputError from
specaudit/trace/safe_io.py, with the bounded reads and atomic writes every reader and writer shares.

Words (as in the contract):
    step      one verify forward of the target for one request
    node      one token slot of the verify input; node 0 is the root (last committed
              token, not yet in the target's KV cache), nodes 1..N-1 are drafts
    accepted path   root-to-node path that greedy verification accepted
    bonus     the target's argmax at the last node of the accepted path
    commit    accepted draft tokens + bonus, cut at EOS or at the token limit
"""
from __future__ import annotations

import fnmatch
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from specaudit.trace.safe_io import (
    InputError,
    note_input,
    parse_json_bounded,
    read_limited,
    regular_file_and_size,
    regular_file_problem,
)

SCHEMA_VERSION = 1
MAX_NODES = 4096  # readers refuse N above this: a corrupt row, not a real tree

# ------------------------------------------------------------------------- tables

STEPS_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("request_id", pa.string()),
    ("step", pa.int32()),
    ("algo", pa.string()),
    ("budget", pa.int32()),
    ("topk", pa.int32()),
    ("batch_size", pa.int32()),
    ("seq_len", pa.int32()),
    ("node_tokens", pa.list_(pa.int32())),
    ("parents", pa.list_(pa.int32())),
    ("positions", pa.list_(pa.int32())),
    ("mask_hash", pa.uint64()),
    ("draft_logprob", pa.list_(pa.float32())),   # nullable
    ("target_argmax", pa.list_(pa.int32())),
    ("target_margin", pa.list_(pa.float32())),   # nullable
    ("accepted_path", pa.list_(pa.int32())),
    ("accepted_depth", pa.int32()),
    ("commit_len", pa.int32()),
    ("committed_tokens", pa.list_(pa.int32())),
    ("finished", pa.bool_()),
    ("t_start", pa.float64()),
    ("draft_s", pa.float64()),
    ("verify_s", pa.float64()),
    ("step_s", pa.float64()),
])
# Per-node list columns: each must have N entries (rule group 1).
NODE_LIST_COLUMNS = ("node_tokens", "parents", "positions", "target_argmax")
NULLABLE_NODE_LIST_COLUMNS = ("draft_logprob", "target_margin")

# Contract v2 (docs/trace-contract.md, "Version 2: speculative sampling"): additive
# columns a sampled run writes after the v1 columns; a v1 trace has none of them and
# reads as before. Per node (N entries; the root holds 1, 1, NaN):
#   draft_prob   q(x_i): the drafter's transformed probability of node i's token
#   target_prob  the target side of node i's test: p(x_i) at its parent, or for a later
#                sibling the running residual p'(x_i) (SpecInfer MSS)
#   accept_u     the uniform that decided node i (NaN: never tested); accepted iff u < p/q
# Per step: the token drawn after the last accepted node (the replacement from the
# residual, or the bonus from p), its probability under the distribution it was drawn
# from, the target side p' and q of it at that node (q NaN for a bonus), and its rank
# among the target's logits there (0 = argmax).
SAMPLING_SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (SCHEMA_VERSION, SAMPLING_SCHEMA_VERSION)
SAMPLING_NODE_LIST_COLUMNS = ("draft_prob", "target_prob", "accept_u")
SAMPLING_FIELDS = [
    pa.field("draft_prob", pa.list_(pa.float32())),
    pa.field("target_prob", pa.list_(pa.float32())),
    pa.field("accept_u", pa.list_(pa.float32())),
    pa.field("sampled_token", pa.int32()),
    pa.field("sampled_prob", pa.float32()),
    pa.field("sampled_target_prob", pa.float32()),
    pa.field("sampled_draft_prob", pa.float32()),
    pa.field("sampled_rank", pa.int32()),
]
SAMPLING_COLUMNS = tuple(f.name for f in SAMPLING_FIELDS)
STEPS_SCHEMA_V2 = pa.schema(list(STEPS_SCHEMA) + SAMPLING_FIELDS)

REQUESTS_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("request_id", pa.string()),
    ("prompt_tokens", pa.list_(pa.int32())),
    ("first_token", pa.int32()),
    ("output_tokens", pa.list_(pa.int32())),
    ("finish_reason", pa.string()),
    ("reference_tokens", pa.list_(pa.int32())),  # nullable
    ("ttft_s", pa.float64()),
    ("e2e_s", pa.float64()),
])
FINISH_REASONS = ("eos", "length", "abort")

# ----------------------------------------------------------------------- manifest

MANIFEST_REQUIRED = ("schema_version", "run_id", "engine", "models", "config", "host",
                     "started_at")
# Keys of manifest["reported"]: the engine's own aggregate counters, under audit.
REPORTED_KEYS = (
    "verify_steps",          # step rows
    "drafted_tokens",        # sum of draft nodes (N - 1) over steps
    "accepted_tokens",       # accepted draft tokens (bonus excluded)
    "committed_tokens",      # tokens appended by steps (prefill's first token excluded)
    "generated_tokens",      # output tokens of all requests: first tokens + commits
    "mean_accepted_depth",   # mean of accepted_depth
    "mean_commit_len",       # mean of commit_len
    "gen_throughput_tps",    # generated tokens / wall_s
    "wall_s",
)
# Conventions a producer may declare in manifest["conventions"] (defaults first).
CONVENTIONS = {
    # does the reported accept/commit length count the bonus token?
    "accept_length": ("includes_bonus", "excludes_bonus"),
    # is a reported mean pooled over steps or a mean of per-request means?
    "mean": ("pooled", "per_request"),
}
DEFAULT_CONVENTIONS = {k: v[0] for k, v in CONVENTIONS.items()}


def manifest_conventions(manifest: dict) -> dict:
    conv = dict(DEFAULT_CONVENTIONS)
    conv.update((manifest or {}).get("conventions") or {})
    return conv


# ---------------------------------------------------------------------- mask hash

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)


def ancestor_mask(parents: np.ndarray) -> np.ndarray:
    """Ancestor-or-self visibility of a batch of trees.

    parents: [B, N] int (parents[:, 0] = -1, 0 <= parents[:, i] < i; padding rows may
    use -1 beyond their own N, which makes a node see only itself).
    Returns V [B, N, N] bool with V[b, i, j] = j is i or an ancestor of i.
    Row i is row parents[i] plus self, built in one pass because parents precede children.
    """
    parents = np.asarray(parents)
    if parents.ndim == 1:
        return ancestor_mask(parents[None])[0]
    B, N = parents.shape
    V = np.zeros((B, N, N), dtype=bool)
    idx = np.arange(B)
    for i in range(N):
        p = parents[:, i]
        has = (p >= 0) & (p < i)
        if has.any():
            V[idx[has], i, :] = V[idx[has], p[has], :]
        V[:, i, i] = True
    return V


def _pack_rows(V: np.ndarray) -> np.ndarray:
    """[B, N, N] bool -> [B, N, W] uint64, bit (j mod 64) of word (j div 64) = V[..., j]."""
    B, N, _ = V.shape
    W = (N + 63) // 64
    # little-endian bit order inside each byte, bytes little-endian inside each word:
    # pack the bits first ([B, N, ceil(N/8)] bytes, the last byte zero-filled), then pad
    # bytes, not bits, up to whole words (8x less to copy than padding the bool mask)
    packed = np.packbits(V, axis=-1, bitorder="little")
    if packed.shape[-1] != W * 8:
        wide = np.zeros((B, N, W * 8), dtype=np.uint8)
        wide[:, :, :packed.shape[-1]] = packed
        packed = wide
    return np.ascontiguousarray(packed).view("<u8").reshape(B, N, W)


def mask_hash(V: np.ndarray) -> np.ndarray:
    """Contract mask hash (FNV-1a over packed rows) of masks V [B, N, N] (or [N, N]).

    All B masks share one N here; ragged batches call it once per N. Returns uint64 [B]
    (or a numpy uint64 scalar for a single mask).
    """
    V = np.asarray(V).astype(bool, copy=False)
    single = V.ndim == 2
    if single:
        V = V[None]
    B, N, _ = V.shape
    words = _pack_rows(V).reshape(B, -1)  # [B, N*W] in hashing order
    cols = np.ascontiguousarray(words.T)  # [N*W, B]: each step of the loop reads one row
    with np.errstate(over="ignore"):
        h = np.full(B, FNV_OFFSET, dtype=np.uint64)
        h = (h ^ np.uint64(N)) * FNV_PRIME
        for w in range(cols.shape[0]):    # in place: two ufunc calls a word, no temporaries
            np.bitwise_xor(h, cols[w], out=h)
            np.multiply(h, FNV_PRIME, out=h)
    return h[0] if single else h


def mask_hash_from_parents(parents) -> int:
    """Hash of the ancestor-or-self mask of one tree's parents list."""
    return int(mask_hash(ancestor_mask(np.asarray(parents, dtype=np.int64))))


def tree_depths_flat(gparents: np.ndarray, nmax: int | None = None) -> np.ndarray:
    """[T] parents as global node indices (-1 at a root or a broken link) -> [T] depths.

    Pointer jumping: ceil(log2 N) rounds of one gather each, whatever the tree shape (the
    per-node-index loop costs N rounds). A node whose own link is -1 has depth 0, so a
    caller marks broken links itself. `nmax` bounds the depth (the longest row).
    """
    g = np.asarray(gparents, dtype=np.int64)
    T = len(g)
    if T == 0:
        return np.zeros(0, dtype=np.int64)
    ar = np.arange(T, dtype=np.int64)
    jump = np.where(g >= 0, g, ar)
    dist = (g >= 0).astype(np.int64)
    rounds = max(1, int(np.ceil(np.log2(max(nmax or T, 2)))))
    for _ in range(rounds):
        dist = dist + np.where(jump != ar, dist[jump], 0)
        jump = jump[jump]
    return dist


def tree_depths(parents: np.ndarray, n: np.ndarray | None = None) -> np.ndarray:
    """[B, N] padded parents (n [B] real nodes per row, default N) -> [B, N] depths.

    Root 0. -1 on padding, and on a node whose parent is not one of 0..i-1 and on every
    descendant of such a node (a broken row: the checker's tree rules report it).
    The one depth function of the readers and sinks (flat form: tree_depths_flat). The
    runtime's verifier and the per-row oracle (audit/reference.py) compute depths on
    their own on purpose: they are the code under audit and its independent witness.
    """
    P = np.asarray(parents, dtype=np.int64)
    B, N = P.shape
    n = np.full(B, N, dtype=np.int64) if n is None else np.asarray(n, dtype=np.int64)
    i = np.arange(N, dtype=np.int64)[None, :]
    real = i < n[:, None]                                      # [B, N]
    ok = real & (((i == 0) & (P == -1)) | ((P >= 0) & (P < i)))
    ok[:, 0] = real[:, 0]                                      # the root's own entry is not a link
    g = np.where((i > 0) & ok, P + (np.arange(B, dtype=np.int64) * N)[:, None], -1).ravel()
    d = tree_depths_flat(g, N).reshape(B, N)
    # a broken link poisons its subtree: propagate "bad" down by parents (parents precede children)
    bad = (real & ~ok).ravel()
    if bad.any():
        g_all = np.where(i > 0, np.clip(P, 0, N - 1) + (np.arange(B) * N)[:, None], -1).ravel()
        for _ in range(N):
            nb = bad | (np.where(g_all >= 0, bad[np.maximum(g_all, 0)], False) & real.ravel())
            if (nb == bad).all():
                break
            bad = nb
    d = np.where(real & ~bad.reshape(B, N), d, -1)
    return d.astype(np.int32 if n is None else np.int64)
# ------------------------------------------------------------------ dataset layout


@dataclass
class RunFiles:
    """One run's partition: its manifest and the files it holds."""

    run_dir: Path
    run_id: str
    manifest: dict | None = None
    step_files: list[Path] = field(default_factory=list)
    requests_file: Path | None = None
    problems: list[InputError] = field(default_factory=list)
    duplicate_of: Path | None = None   # an earlier folder holding the same run id
    request_parts: list[Path] = field(default_factory=list)   # requests-<seq>.parquet (a run not closed)
    real_dir: str | None = None   # the folder after symlinks (discover: a folder reached twice is one run)
    sizes: dict = field(default_factory=dict, repr=False)   # str(file) -> bytes, as listing saw them

    @property
    def request_files(self) -> list[Path]:
        """The requests table's files: requests.parquet when present (the whole table,
        written at close), else the parts a run appends while it runs (docs/trace-contract.md)."""
        return [self.requests_file] if self.requests_file is not None else list(self.request_parts)

    @property
    def complete(self) -> bool:
        """A run that ended normally: finished_at written and requests table present."""
        return bool(self.manifest and self.manifest.get("finished_at")) and bool(self.request_files)


MAX_MANIFEST_BYTES = 4 << 20   # a run.json is a few KB; more is not a manifest
INT32_MAX = 2**31 - 1
# config keys read as integers (the trace's columns are int32)
CONFIG_INT_KEYS = ("eos_id", "max_new_tokens", "budget", "topk", "concurrency", "block_size", "seed",
                   "threads")


def declared_size_problem(md) -> str | None:
    """From a Parquet footer alone (pyarrow FileMetaData), before any value is read: None, or
    why a row group is refused. Every list column of a trace holds at most one entry per
    node (committed_tokens one more), so a row group whose list column declares more values
    than rows x (MAX_NODES + 1) holds a row above MAX_NODES: a 7.7 KB file can declare a
    20M-node row (run-length encoded) that takes GBs once materialised."""
    cap = MAX_NODES + 1
    schema = md.schema
    lists = [i for i in range(md.num_columns) if schema.column(i).max_repetition_level > 0]
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        for i in lists:
            n = rg.column(i).num_values
            if n > rg.num_rows * cap:
                name = schema.column(i).path.split(".", 1)[0]
                return (f"row group {g} declares {n} {name} values over {rg.num_rows} rows: a row above "
                        f"{MAX_NODES} nodes; refused before reading it")
    return None


def _finite(v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return abs(v) < 2**63
    return isinstance(v, float) and math.isfinite(v)


def validate_manifest(m: dict) -> str | None:
    """None when a parsed manifest has the contract's types; else the first problem.

    Readers index config, conventions and reported freely once this passed: objects
    are objects, the config's integer keys are int32 integers (or null), conventions
    name known values, reported holds finite numbers (or lists of them, or null)."""
    if not isinstance(m.get("run_id"), str) or not m["run_id"]:
        return "run_id is not a non-empty string"
    for k in ("config", "conventions", "reported", "models", "engine", "host"):
        if m.get(k) is not None and not isinstance(m[k], dict):
            return f"{k} is {type(m[k]).__name__}, expected an object"
    cfg = m.get("config") or {}
    for k in CONFIG_INT_KEYS:
        v = cfg.get(k)
        if v is None:
            continue
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not -INT32_MAX <= v <= INT32_MAX:
            return f"config.{k} = {str(v)[:40]!r}: expected an integer within int32"
    for k in ("algo",):
        if cfg.get(k) is not None and not isinstance(cfg[k], str):
            return f"config.{k} is not a string"
    # unknown convention names or values are SA601's (a finding about the run, not a
    # file that cannot be read); only their type is settled here
    for k, v in (m.get("reported") or {}).items():
        if v is None:
            continue
        vals = v if isinstance(v, list) else [v]
        if isinstance(v, list) and len(v) > MAX_NODES:
            return f"reported.{k} holds {len(v)} entries; at most {MAX_NODES}"
        if not all(x is None or _finite(x) for x in vals):
            return f"reported.{k} = {str(v)[:40]}: expected a finite number"
    for k in ("started_at", "finished_at"):
        v = m.get(k)
        if v is not None and not _finite(v):
            return f"{k} = {str(v)[:40]!r}: expected a number (seconds since the epoch)"
    return None


def read_manifest(path: Path) -> dict:
    """A run.json, parsed and validated (InputError naming the file otherwise)."""
    note_input(path)
    return manifest_from_bytes(read_limited(path, MAX_MANIFEST_BYTES), path)


def manifest_from_bytes(data: bytes, path) -> dict:
    """A run.json's bytes (read by any means: a file, Spark, an object store), parsed
    and validated as read_manifest does (InputError naming `path` otherwise)."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise InputError(path, f"larger than {MAX_MANIFEST_BYTES} bytes; refused")
    m = parse_json_bounded(data, path)
    if not isinstance(m, dict):
        raise InputError(path, "not a JSON object")
    missing = [k for k in MANIFEST_REQUIRED if k not in m]
    if missing:
        raise InputError(path, f"manifest lacks {', '.join(missing)}")
    v = m.get("schema_version")
    if v not in READABLE_SCHEMA_VERSIONS:
        raise InputError(path, f"unknown schema_version {repr(v)[:40]}: this specaudit reads versions "
                               f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}; "
                               "upgrade specaudit or convert the trace")
    why = validate_manifest(m)
    if why:
        raise InputError(path, f"bad manifest: {why}")
    return m


def step_file_key(p: Path):
    return _step_name_key(p.name)


def _step_name_key(name: str):
    """(sequence number, name) of steps-<seq>.parquet / requests-<seq>.parquet: files in
    the order they were written (a name without a number last)."""
    stem = name.rsplit(".", 1)[0].split("-", 1)[-1]
    return (int(stem) if stem.isdigit() else 1 << 62, name)


def _trace_dirs(root: Path):
    """(folder, its real path, names of its trace files, names of all its files) under
    root, top-down in name order, following symlinked folders once (a folder reached
    twice, or a symlink loop, is visited once). The real path of a folder reached by no
    symlink is its parent's plus its name: no per-folder realpath (a lstat per part)."""
    seen = set()
    stack = [(os.fspath(root), os.path.realpath(root))]
    while stack:
        top, real = stack.pop()
        try:
            st = os.stat(top)
            with os.scandir(top) as it:
                entries = list(it)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            continue
        seen.add(key)
        dirs, files = [], []
        for e in entries:
            try:
                is_dir = e.is_dir()   # (after symlinks, as os.walk(followlinks=True))
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(e)
        yield Path(top), real, [e.name for e in files if _trace_name(e.name)], [e.name for e in files]
        dirs.sort(key=lambda e: e.name, reverse=True)   # popped in name order
        for e in dirs:
            try:
                link = e.is_symlink()
            except OSError:
                link = True
            stack.append((e.path, os.path.realpath(e.path) if link else os.path.join(real, e.name)))


def _trace_name(f: str) -> bool:
    """A file name a run folder's trace files have."""
    return (f in ("run.json", "requests.parquet") or fnmatch.fnmatchcase(f, "steps-*.parquet")
            or fnmatch.fnmatchcase(f, "requests-*.parquet"))


def discover(paths) -> list[RunFiles]:
    """Find run partitions under the given paths (dataset folders, run folders, or files).

    A run folder is one holding run.json or steps-*.parquet; hive naming
    (`run_id=<id>`) is used for the id when the manifest is missing. Symlinked folders
    are followed (each real folder once). A trace file that is not a regular file
    (FIFO, device, socket, or a symlink to one) is refused as a problem of its run,
    never opened. Two folders holding the same run id: the later one gets a problem
    and `duplicate_of` (readers that sum over runs leave it out). Raises InputError
    when a path does not exist or holds no run at all.
    """
    runs: dict[str, RunFiles] = {}
    listed: dict[str, tuple] = {}   # folder -> (its real path, its trace files' names), as the walk saw them
    real_seen: set = set()
    by_id: dict[str, Path] = {}
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise InputError(p, "no such file or folder")
        if not p.is_dir():
            why = regular_file_problem(p)
            if why:
                raise InputError(p, why)
            if not (_trace_name(p.name) or p.suffix == ".parquet"):
                # a log, a binary, a scrape: not its folder's run (that answered "./run.json: missing")
                raise InputError(p, "not a trace file; give a dataset or run folder, a run.json or a "
                                    "steps/requests Parquet file (engine logs and scrapes go to `specaudit check`)")
            dirs = [p.parent]
        else:
            dirs, n_stray = [], 0
            for d, real, names, filenames in _trace_dirs(p):
                if names:
                    dirs.append(d)
                    listed[str(d)] = (real, names)
                else:
                    n_stray += sum(1 for f in filenames if not f.startswith("."))
            if not dirs:
                what = f"{n_stray} files, none a trace" if n_stray else "empty folder"
                raise InputError(p, f"no trace runs found ({what}; expected run_id=<id>/run.json "
                                    "and steps-*.parquet)")
        for d in dirs:
            ds = str(d)
            real, names = listed.get(ds) or (None, None)
            if ds in runs:
                continue
            if real is None:
                real = os.path.realpath(d)
            if real in real_seen:
                continue
            real_seen.add(real)
            rid = d.name.split("=", 1)[1] if d.name.startswith("run_id=") else d.name
            rf = RunFiles(run_dir=d, run_id=rid, real_dir=real)
            if names is None:   # a file's folder: list it (the walk saw only folders given)
                names = [f for f in os.listdir(d) if _trace_name(f)]
            mpath = os.path.join(ds, "run.json")
            if "run.json" in names or os.path.lexists(mpath):
                try:
                    rf.manifest = read_manifest(mpath)
                    rf.run_id = str(rf.manifest.get("run_id", rid))
                except InputError as e:
                    rf.problems.append(e)
            else:
                rf.problems.append(InputError(mpath, "missing run.json (manifest)"))

            # a device or FIFO is a problem, not data
            def regular(f: Path, problems=rf.problems, sizes=rf.sizes) -> bool:
                why, size = regular_file_and_size(f)
                if why:
                    problems.append(InputError(f, why))
                else:
                    sizes[str(f)] = size
                return not why
            named = lambda pat, d=d, names=names: [d / f for f in sorted(
                (f for f in names if fnmatch.fnmatchcase(f, pat)), key=_step_name_key)]
            rf.step_files += [f for f in named("steps-*.parquet") if regular(f)]
            rq = d / "requests.parquet"
            if "requests.parquet" in names and os.path.lexists(rq) and regular(rq):
                rf.requests_file = rq
            rf.request_parts += [f for f in named("requests-*.parquet") if regular(f)]
            first = by_id.setdefault(rf.run_id, d)
            if first != d:
                rf.duplicate_of = first
            runs[ds] = rf
    return list(runs.values())


def check_table_schema(path, schema: pa.Schema, expected: pa.Schema, optional=()) -> None:
    """Raise InputError when a required column is missing, appears twice, or has the
    wrong type, or when an `optional` field (e.g. SAMPLING_FIELDS) is present with the
    wrong type."""
    names = list(schema.names)
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise InputError(path, f"column {twice[0]!r} appears {names.count(twice[0])} times")
    for f in expected:
        if f.name not in schema.names:
            raise InputError(path, f"missing required column {f.name!r}")
        got = schema.field(f.name).type
        if not _type_compatible(got, f.type):
            raise InputError(path, f"column {f.name!r} has type {got}, expected {f.type}")
    for f in optional:
        if f.name in schema.names and not _type_compatible(schema.field(f.name).type, f.type):
            raise InputError(path, f"column {f.name!r} has type {schema.field(f.name).type}, expected {f.type}")


def _type_compatible(got: pa.DataType, want: pa.DataType) -> bool:
    if got == want:
        return True
    if pa.types.is_list(want) or pa.types.is_large_list(want):
        return ((pa.types.is_list(got) or pa.types.is_large_list(got))
                and _type_compatible(got.value_type, want.value_type))
    if pa.types.is_integer(want):
        return pa.types.is_integer(got)
    if pa.types.is_floating(want):
        return pa.types.is_floating(got)
    if pa.types.is_string(want):
        return pa.types.is_string(got) or pa.types.is_large_string(got)
    return False


