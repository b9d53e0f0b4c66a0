"""The requests table's per-request facts (request_facts), and FactStore, where they
wait for the join with the steps' carry (RequestFrame).

    store = request_facts(request_batches, carry, eos_id, FactStore(carry.spill, PAGE_SLOTS))
    store.chunk(lo, hi)     # the facts of carry slots [lo, hi): {"idx": slots, column: values}

A store holds every row in memory (one growing array per fact) up to SPILL_SLOTS rows
(invariants/carry.py, the same limit as the carry's), then writes them to files by
range of `part` slots in the run's SpillDir (facts-<k>-<seq>.npz: one uncompressed
npz per batch and range, rows in table order, loaded with allow_pickle=False: a string
fact goes as a str array and a None mask, never pickled), so a run with millions
of requests holds one batch of facts, and the join reads back one range at a time: the
same rows, in the same order.

The facts of each row's tokens (_token_facts: numpy, the definition) have a compiled
twin for big batches, facts_kernels.py (C), used when invariants/compiled.py can build it.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from specaudit.invariants import carry as carry_mod
from specaudit.invariants import compiled
from specaudit.invariants.arrow import list_local_index
from specaudit.invariants.carry import Carry, token_mix
from specaudit.invariants.frame import list_lengths, list_parts, list_values, to_np
from specaudit.invariants.request_ids import arrow_encoded
from specaudit.invariants.spill import SpillDir

REQUEST_BATCH_ROWS = 8192   # request rows per batch: each holds whole outputs
# Optional client-side per-request columns a requests table may carry; SA410 compares
# them with what the request's steps add up to.
CLIENT_COLUMNS = ("completion_tokens", "verify_steps", "accept_length")


def request_facts(batches, carry: Carry, eos_id: int, store: FactStore | None = None):
    """Per-request facts from the requests table, streamed by batch.

    Without `store`: a dict of arrays keyed like RequestFrame's (idx = carry index of
    each row); with one: the store, every batch's facts added to it."""
    into = store if store is not None else FactStore()
    for b in batches:
        into.add(batch_facts(b, carry, eos_id))
    return store if store is not None else into.arrays()


def batch_facts(b, carry: Carry, eos_id: int) -> dict:
    """One requests batch's facts (idx: the carry slot of each row, new ids get new ones)."""
    out: dict[str, np.ndarray] = {}

    def put(k, v):
        # int32 is enough for every per-request fact (lengths, tokens, indices)
        if isinstance(v, np.ndarray) and v.dtype == np.int64 and k not in ("idx",):
            v = v.astype(np.int32)
        out[k] = v

    names = b.schema.names
    col = {n: b.column(i) for i, n in enumerate(names)}
    rid = col["request_id"]
    rid = rid.combine_chunks() if isinstance(rid, pa.ChunkedArray) else rid
    enc = arrow_encoded(rid)      # a plain string column: its bytes, no str made per id
    idx = carry.index(_request_id_strings(rid) if enc is None else None, enc)
    put("idx", idx)
    R = b.num_rows
    plen = list_lengths(col["prompt_tokens"])
    put("prompt_len", plen)
    ft = to_np(col["first_token"], -1).astype(np.int64)
    put("first_token", ft)
    off, vals, olen = list_parts(col["output_tokens"])
    put("output_len", olen)
    ref = list_parts(col["reference_tokens"]) if "reference_tokens" in col else None
    kern = _kernels(R, vals, ref, eos_id)
    tok = _token_facts(R, off, vals, olen, ref, eos_id) if kern is None else \
        _token_facts_compiled(kern, off, vals, olen, ref, eos_id)
    for k, v in tok.items():
        put(k, v)
    fr = col["finish_reason"]
    fr = fr if pa.types.is_dictionary(fr.type) else fr.dictionary_encode()
    reasons = np.asarray(fr.dictionary.to_pylist() + [None], dtype=object)
    put("finish_reason", reasons[to_np(fr.indices, -1)])
    for c in CLIENT_COLUMNS:
        if c in col:
            try:
                put("extra:" + c, to_np(col[c].cast(pa.float64()), np.nan))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
    return out


def _token_facts(R, off, vals, olen, ref, eos_id) -> dict:
    """The facts of each row's output tokens (and of its reference_tokens, `ref` as
    list_parts gives them, None without the column): numpy, the definition."""
    # fingerprint of output_tokens[1:] at positions 1.., as the commits' fingerprint
    ln = np.maximum(olen, 0)
    start = np.cumsum(ln) - ln
    # the row of flat entries j (only the few that are looked up: no per-token row array)
    row_of = lambda j, ends=start + ln: np.searchsorted(ends, j, side="right")
    k = list_local_index(ln)                   # each token's index in its output
    flat = list_values(off, vals, olen)
    h = np.zeros(R, dtype=np.uint64)
    has = ln > 0
    if len(flat):
        mix = token_mix(flat, k)
        mix[k == 0] = 0                       # the first token is compared on its own
        h[has] = np.add.reduceat(mix, start[has])
    last = np.full(R, -1, dtype=np.int64)
    if len(flat):
        last[has] = flat[start[has] + ln[has] - 1]
    fst = np.full(R, -1, dtype=np.int64)
    if len(flat):
        fst[has] = flat[start[has]]
    eos_in = np.full(R, -1, dtype=np.int64)
    if len(flat):
        e = np.flatnonzero(flat == eos_id)           # few: the row test on those only
        e = e[k[e] < ln[row_of(e)] - 1][::-1]
        eos_in[row_of(e)] = k[e]
    # lossless: reference_tokens, when present
    req_eq = np.full(R, -1, dtype=np.int64)
    first_diff = np.full(R, -1, dtype=np.int64)
    rlen = np.full(R, -1, dtype=np.int64)
    if ref is not None:
        roff, rvals, rl = ref
        rlen = rl
        present = rl >= 0
        if present.any():
            rln = np.maximum(rl, 0)
            rflat = list_values(roff, rvals, rl)
            rstart = np.cumsum(rln) - rln
            m = np.minimum(ln, rln)
            if np.array_equal(ln, rln):   # same lengths: the flat values line up as they are
                d = np.flatnonzero(flat != rflat)[::-1]
                first_diff[row_of(d)] = k[d]
            else:
                mrows = np.repeat(np.arange(R), m)
                mk = list_local_index(m)
                a = flat[start[mrows] + mk] if len(flat) else np.zeros(0, np.int64)
                bb = rflat[rstart[mrows] + mk] if len(rflat) else np.zeros(0, np.int64)
                d = np.flatnonzero(a != bb)[::-1]
                first_diff[mrows[d]] = mk[d]
            lendiff = (first_diff < 0) & (ln != rln)
            first_diff[lendiff] = m[lendiff]
            req_eq = np.where(present, (first_diff < 0).astype(np.int64), -1)
            first_diff = np.where(present, first_diff, -1)
    return {"output_hash": h, "output_last": last, "output_first": fst, "eos_inside": eos_in,
            "reference_equal": req_eq, "reference_first_diff": first_diff, "reference_len": rlen}


def _kernels(R: int, vals, ref, eos_id: int):
    """facts_kernels for a batch of R rows whose token values it takes (ints of at most
    64 bits, uint64 excepted: numpy compares those by value), or None: numpy."""
    ok = lambda v: v.dtype.kind in "iu" and v.dtype != np.uint64
    if not (ok(vals) and (ref is None or ok(ref[1])) and -(1 << 63) <= eos_id < (1 << 63)):
        return None
    return compiled.kernels("specaudit.audit.check.facts_kernels", rows=R)


def _token_facts_compiled(kern, off, vals, olen, ref, eos_id) -> dict:
    """_token_facts' values in one compiled pass per column (facts_kernels)."""
    h, fst, last, eos_in = kern.output_facts(off, vals, olen, eos_id)
    if ref is None:
        none = np.full(len(olen), -1, dtype=np.int64)
        eq, diff, rlen = none, none.copy(), none.copy()
    else:
        (eq, diff), rlen = kern.reference_facts(off, vals, olen, *ref), ref[2]
    return {"output_hash": h, "output_last": last, "output_first": fst, "eos_inside": eos_in,
            "reference_equal": eq, "reference_first_diff": diff, "reference_len": rlen}


def facts_in(facts: dict | None, lo: int, hi: int) -> dict | None:
    """The requests rows of carry slots [lo, hi) among `facts` (`idx`: each row's slot)."""
    if facts is None or "idx" not in facts:
        return facts
    keep = (facts["idx"] >= lo) & (facts["idx"] < hi)
    return {k: v[keep] for k, v in facts.items()}


class FactStore:
    """The facts of a requests table, by carry slot: in memory, or past SPILL_SLOTS rows
    (with a spill folder) in files by range of `part` slots. See the module docstring."""

    def __init__(self, spill: SpillDir | None = None, part: int = 1 << 62):
        self.spill, self.part = spill, part
        self.cols: dict[str, _Column] = {}
        self.n = 0                    # rows added
        self.spilled = False
        self._all: dict | None = None   # arrays(), once asked (the store is read from then on)
        self.written: dict[int, int] = {}   # range -> files written for it (spilled)

    def add(self, facts: dict) -> None:
        self.n += len(facts["idx"])
        if self.spilled:
            self._write(facts)
            return
        for k, v in facts.items():
            if k not in self.cols:
                self.cols[k] = _Column(v.dtype)
            self.cols[k].append(v)
        if self.spill is not None and self.n > carry_mod.SPILL_SLOTS:
            self.spilled = True
            self._write({k: v.array() for k, v in self.cols.items()})
            self.cols = {}

    def arrays(self) -> dict:
        """Every row (a store that did not spill), once all are added."""
        if self._all is None:
            self._all = {k: v.array() for k, v in self.cols.items()}
            self.cols = {}
        return self._all

    def chunk(self, lo: int, hi: int) -> dict:
        """The rows of carry slots [lo, hi), in table order (a spilled store: one range
        of `part` slots at a time)."""
        if not self.spilled:
            t = self.arrays()
            idx = t.get("idx")
            if idx is None or (lo == 0 and not (idx >= hi).any()):
                return t
            return facts_in(t, lo, hi)
        if lo % self.part or hi - lo > self.part:
            raise ValueError(f"spilled facts are read by range of {self.part} slots, not [{lo}, {hi})")
        parts: dict[str, list] = {}
        for seq in range(self.written.get(lo // self.part, 0)):   # no file: no requests row in this range
            with np.load(self.spill.file(f"facts-{lo // self.part}-{seq}.npz"), allow_pickle=False) as z:
                for k, v in _unpacked(z).items():
                    parts.setdefault(k, []).append(v)
        return {k: np.concatenate(v) for k, v in parts.items()}

    def _write(self, facts: dict) -> None:
        """Write the rows to their ranges' files (a batch's rows: one range or two, usually)."""
        rng = facts["idx"] // self.part
        for k in np.unique(rng).tolist():
            sel = rng == k
            seq = self.written.get(k, 0)
            with open(self.spill.file(f"facts-{k}-{seq}.npz"), "wb") as fh:
                np.savez(fh, **_packed({c: v[sel] for c, v in facts.items()}))
            self.written[k] = seq + 1


def _packed(facts: dict) -> dict:
    """Facts as arrays npz stores without pickle: a number column as it is ("a:<name>"),
    a string column (object: str or None) as str values ("s:<name>") and a None mask
    ("n:<name>")."""
    out = {}
    for c, v in facts.items():
        if v.dtype == object:
            out["n:" + c] = np.fromiter((x is None for x in v), dtype=bool, count=len(v))
            out["s:" + c] = np.asarray(["" if x is None else x for x in v], dtype=str)
        else:
            out["a:" + c] = v
    return out


def _unpacked(z) -> dict:
    """_packed's arrays back as the facts they were written from."""
    out = {}
    for name in z.files:
        kind, c = name[:2], name[2:]
        if kind == "a:":
            out[c] = z[name]
        elif kind == "s:":
            v = z[name].astype(object)
            v[z["n:" + c]] = None
            out[c] = v
    return out


class _Column:
    """One request fact, appended batch by batch into one growing array. (A list of
    per-batch arrays concatenated at the end would hold the facts twice at the end, and
    its many small long-lived blocks, interleaved with each batch's temporaries, keep
    the heap from shrinking: with a million requests that is hundreds of MB of RSS.)"""

    def __init__(self, dtype):
        self.a = np.empty(REQUEST_BATCH_ROWS, dtype=dtype)
        self.n = 0

    def append(self, v: np.ndarray) -> None:
        need = self.n + len(v)
        if need > len(self.a):
            b = np.empty(max(need, len(self.a) * 3 // 2), dtype=self.a.dtype)
            b[: self.n] = self.a[: self.n]
            self.a = b
        self.a[self.n: need] = v
        self.n = need

    def array(self) -> np.ndarray:
        """The values (a copy when over a quarter of the buffer is spare: it is kept all run)."""
        return self.a[: self.n].copy() if self.n < len(self.a) * 3 // 4 else self.a[: self.n]


def _request_id_strings(arr) -> list:
    """Request ids as Python strings (a null id as "None", as str() of it gives)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type.value_type if pa.types.is_dictionary(arr.type) else arr.type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return [str(x) for x in arr.to_pylist()]
    out = arr.to_pylist()
    if arr.null_count:
        out = ["None" if x is None else x for x in out]
    return out


