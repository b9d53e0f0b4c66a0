"""The trace contract as code: docs/trace-contract.md (schema version 1) in words.

Every writer (tracer, Parquet sink) and every reader (check, estimate, diff, query, report)
imports its column names, Arrow types, manifest keys and the mask hash from here and
from nowhere else. Readers never import each other.

Words (as in the contract):
    step      one verify forward of the target for one request
    node      one token slot of the verify input; node 0 is the root (last committed
              token, not yet in the target's KV cache), nodes 1..N-1 are drafts
    accepted path   root-to-node path that greedy verification accepted
    bonus     the target's argmax at the last node of the accepted path
    commit    accepted draft tokens + bonus, cut at EOS or at the token limit
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

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
    pad = np.zeros((B, N, W * 64), dtype=np.uint8)
    pad[:, :, :N] = V
    # little-endian bit order inside each byte, bytes little-endian inside each word
    packed = np.packbits(pad.reshape(B, N, W * 8, 8), axis=-1, bitorder="little")
    return packed.reshape(B, N, W * 8).view("<u8").reshape(B, N, W)


def mask_hash(V: np.ndarray) -> np.ndarray:
    """Contract mask hash (FNV-1a over packed rows) of masks V [B, N, N] (or [N, N]).

    All B masks share one N here; ragged batches call it once per N. Returns uint64 [B]
    (or a numpy uint64 scalar for a single mask).
    """
    V = np.asarray(V).astype(bool)
    single = V.ndim == 2
    if single:
        V = V[None]
    B, N, _ = V.shape
    words = _pack_rows(V).reshape(B, -1)  # [B, N*W] in hashing order
    with np.errstate(over="ignore"):
        h = np.full(B, FNV_OFFSET, dtype=np.uint64)
        h = (h ^ np.uint64(N)) * FNV_PRIME
        for w in range(words.shape[1]):
            h = (h ^ words[:, w]) * FNV_PRIME
    return h[0] if single else h


def mask_hash_from_parents(parents) -> int:
    """Hash of the ancestor-or-self mask of one tree's parents list."""
    return int(mask_hash(ancestor_mask(np.asarray(parents, dtype=np.int64))))


def tree_depths(parents: np.ndarray) -> np.ndarray:
    """[B, N] parents -> [B, N] depth (root 0). Assumes parents[i] < i."""
    parents = np.asarray(parents)
    B, N = parents.shape
    d = np.zeros((B, N), dtype=np.int32)
    idx = np.arange(B)
    for i in range(1, N):
        p = np.clip(parents[:, i], 0, N - 1)
        d[:, i] = d[idx, p] + 1
    return d


# ------------------------------------------------------------------ dataset layout


class InputError(Exception):
    """Bad input a user can fix: carries the file and a one-line reason."""

    def __init__(self, path, reason: str):
        self.path = str(path) if path is not None else None
        self.reason = reason
        super().__init__(f"{self.path}: {reason}" if self.path else reason)


@dataclass
class RunFiles:
    """One run's partition: its manifest and the files it holds."""

    run_dir: Path
    run_id: str
    manifest: dict | None = None
    step_files: list[Path] = field(default_factory=list)
    requests_file: Path | None = None
    problems: list[InputError] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """A run that ended normally: finished_at written and requests table present."""
        return bool(self.manifest and self.manifest.get("finished_at")) and self.requests_file is not None


def read_manifest(path: Path) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror or e}") from None
    try:
        m = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(path, f"not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(m, dict):
        raise InputError(path, "not a JSON object")
    missing = [k for k in MANIFEST_REQUIRED if k not in m]
    if missing:
        raise InputError(path, f"manifest lacks {', '.join(missing)}")
    v = m.get("schema_version")
    if v != SCHEMA_VERSION:
        raise InputError(path, f"unknown schema_version {v!r}: this specaudit reads version "
                               f"{SCHEMA_VERSION}; upgrade specaudit or convert the trace")
    return m


def step_file_key(p: Path):
    stem = p.stem.split("-", 1)[-1]
    return (int(stem) if stem.isdigit() else 1 << 62, p.name)


def discover(paths) -> list[RunFiles]:
    """Find run partitions under the given paths (dataset folders, run folders, or files).

    A run folder is one holding run.json or steps-*.parquet; hive naming
    (`run_id=<id>`) is used for the id when the manifest is missing. Raises InputError
    when a path does not exist or holds no run at all.
    """
    runs: dict[Path, RunFiles] = {}
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise InputError(p, "no such file or folder")
        if p.is_file():
            dirs = [p.parent]
        else:
            dirs = sorted({f.parent for f in p.rglob("run.json")} |
                          {f.parent for f in p.rglob("steps-*.parquet")} |
                          {f.parent for f in p.rglob("requests.parquet")})
            if not dirs:
                stray = [f for f in p.rglob("*") if f.is_file() and not f.name.startswith(".")]
                what = f"{len(stray)} files, none a trace" if stray else "empty folder"
                raise InputError(p, f"no trace runs found ({what}; expected run_id=<id>/run.json "
                                    "and steps-*.parquet)")
        for d in dirs:
            if d in runs:
                continue
            rid = d.name.split("=", 1)[1] if d.name.startswith("run_id=") else d.name
            rf = RunFiles(run_dir=d, run_id=rid)
            mpath = d / "run.json"
            if mpath.exists():
                try:
                    rf.manifest = read_manifest(mpath)
                    rf.run_id = str(rf.manifest.get("run_id", rid))
                except InputError as e:
                    rf.problems.append(e)
            else:
                rf.problems.append(InputError(mpath, "missing run.json (manifest)"))
            rf.step_files = sorted(d.glob("steps-*.parquet"), key=step_file_key)
            rq = d / "requests.parquet"
            rf.requests_file = rq if rq.exists() else None
            runs[d] = rf
    return list(runs.values())


def check_table_schema(path, schema: pa.Schema, expected: pa.Schema) -> None:
    """Raise InputError when a required column is missing or has the wrong type."""
    for f in expected:
        if f.name not in schema.names:
            raise InputError(path, f"missing required column {f.name!r}")
        got = schema.field(f.name).type
        if not _type_compatible(got, f.type):
            raise InputError(path, f"column {f.name!r} has type {got}, expected {f.type}")


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


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary name then rename: readers see nothing or the whole file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
