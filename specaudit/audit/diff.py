"""Align two trace runs of the same prompts and classify each request's first divergence.

    res = diff_runs("traces/run_id=chain-...", "traces/run_id=tree-...")
    res.counts          # {"draft": 0, "verify": 0, "metric": 0, "none": 4}
    res.requests[0]     # RequestDiff(request_id="0", cls="none", step=None, ...)

Requests are matched by prompt (the requests table's prompt_tokens), or by request_id when
both runs hold the same ids with the same prompts; steps are aligned by step index. Walking
a request's steps in order, the first step where anything differs is classified by what
differs first in the order the engine computes it:

    draft   node_tokens or parents differ: the drafter proposed something else
    verify  same drafts; positions, mask_hash, seq_len, target_argmax (or the target's
            top-1 margin beyond --margin-tol) differ: the target predicted something else
    metric  same drafts and predictions; the engine's bookkeeping differs: accepted_path,
            accepted_depth, commit_len, committed_tokens or finished
    none    identical to the end

A prefill that produced a different first token is a verify divergence at step -1.
Loading the two runs and matching their requests: audit/diff_sides.py.

Conventions (manifest `conventions`, as the checker reads them): step rows always mean what
the contract says (commit_len = tokens appended, bonus included); the conventions govern
the run's reported figures. diff re-derives each run's reported means from its rows under
the run's declared conventions (pooled or per-request means; accept length with or without
the bonus), says when a run's reported figure does not match its own rows, and compares A
with B in the contract's convention (pooled, bonus in the commit).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from specaudit.audit.compare import agrees
from specaudit.audit.defaults import DEFAULT_MARGIN_TOL
from specaudit.audit.diff_sides import Side, check_versions, load_side, match_requests, one_run
from specaudit.numfmt import fixed
from specaudit.trace.derived import MEANS, means
from specaudit.trace.schema import NODE_LIST_COLUMNS, discover

CLASSES = ("draft", "verify", "metric", "none")
EXPLAIN = {
    "draft": "the drafts differ (node tokens or tree shape): the drafter saw other input or "
             "state, e.g. a stale proposal reused, or another drafter",
    "verify": "same drafts, different target predictions: the verify input differs (positions, "
              "mask hash) or, when both agree, the target's KV cache or numerics do",
    "metric": "same drafts and target predictions, different bookkeeping: the engine's counters or "
              "its commit (e.g. a bonus counted as a draft, or a commit not cut at EOS) differ",
    "none": "identical to the end: same drafts, predictions, counters and commits",
}
BOOKKEEPING = ("accepted_path", "accepted_depth", "commit_len", "committed_tokens", "finished")


# -------------------------------------------------------------------- comparison


@dataclass
class RequestDiff:
    request_id: str                 # A's request id
    request_id_b: str
    cls: str                        # draft | verify | metric | none
    step: int | None                # first divergent step (-1: prefill; None: none)
    what: str                       # one line: what differs, with the numbers
    fields: list[str] = field(default_factory=list)  # the columns that differ at that step
    steps_compared: int = 0
    verify_kind: str | None = None  # verify: positions | mask | positions+mask | same-input
    truncated: bool = False         # one side's trace ends early (compared the common steps)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["class"] = d.pop("cls")
        return {k: v for k, v in d.items() if v is not None or k == "step"}


def _hex(v) -> str:
    """A mask hash as hex, or null (a row without one)."""
    return "null" if v is None else f"{int(v):#018x}"


def _first_diff(x, y) -> int | None:
    x, y = x or [], y or []
    for i, (u, v) in enumerate(zip(x, y)):
        if u != v:
            return i
    return None if len(x) == len(y) else min(len(x), len(y))


def _show(xs, i, w=3) -> str:
    xs = xs or []
    lo = max(0, i - 1)
    s = ",".join(map(str, xs[lo:lo + w]))
    return f"[{'...,' if lo else ''}{s}{',...' if lo + w < len(xs) else ''}]"


def compare_step(a: dict, b: dict, margin_tol: float):
    """Classify one aligned step pair. Returns (class, what, fields, verify_kind) or None."""
    # 1. draft: the proposal (root included: a different root is a different draft input)
    fields = [c for c in ("node_tokens", "parents") if a[c] != b[c]]
    if fields:
        na, nb = len(a["node_tokens"] or []), len(b["node_tokens"] or [])
        parts = []
        if na != nb:
            parts.append(f"{na} vs {nb} nodes")
        if "node_tokens" in fields:
            i = _first_diff(a["node_tokens"], b["node_tokens"])
            parts.append("root token differs" if i == 0 else f"node_tokens differ from node {i}: "
                         f"{_show(a['node_tokens'], i)} vs {_show(b['node_tokens'], i)}")
        if "parents" in fields:
            i = _first_diff(a["parents"], b["parents"])
            parts.append(f"tree shape differs from node {i}")
        return "draft", "; ".join(parts), fields, None
    # 2. verify: what the target was fed and what it predicted
    pos = a["positions"] != b["positions"] or a["seq_len"] != b["seq_len"]
    mask = a["mask_hash"] != b["mask_hash"]
    am, bm = a["target_argmax"] or [], b["target_argmax"] or []
    argmax_nodes = [i for i in range(max(len(am), len(bm)))
                    if i >= len(am) or i >= len(bm) or am[i] != bm[i]]
    ma, mb = a.get("target_margin"), b.get("target_margin")
    dmargin = 0.0
    if ma is not None and mb is not None and len(ma) == len(mb):
        diffs = [abs(u - v) for u, v in zip(ma, mb) if u is not None and v is not None]
        dmargin = max(diffs, default=0.0)
    margin_moved = dmargin > margin_tol and math.isfinite(margin_tol)
    if pos or mask or argmax_nodes or margin_moved:
        fields = ([c for c in ("seq_len", "positions") if a[c] != b[c]] + (["mask_hash"] if mask else [])
                  + (["target_argmax"] if argmax_nodes else []) + (["target_margin"] if margin_moved else []))
        kind = ("positions+mask" if pos and mask else "positions" if pos else "mask" if mask else "same-input")
        parts = []
        if a["seq_len"] != b["seq_len"]:
            parts.append(f"seq_len {a['seq_len']} vs {b['seq_len']}")
        if a["positions"] != b["positions"]:
            i = _first_diff(a["positions"], b["positions"])
            shift = {v - u for u, v in zip(a["positions"] or [], b["positions"] or [])}
            s = f" (B - A = {shift.pop():+d} on every node)" if len(shift) == 1 else ""
            parts.append(f"positions differ from node {i}: {_show(a['positions'], i)} vs "
                         f"{_show(b['positions'], i)}{s}")
        if mask:
            parts.append(f"mask hash {_hex(a['mask_hash'])} vs {_hex(b['mask_hash'])}")
        if not pos and not mask:
            parts.append("positions and mask hash agree")
        elif not pos:
            parts.append("positions agree")
        elif not mask:
            parts.append("mask hash agrees")
        if argmax_nodes:
            i = argmax_nodes[0]
            near = ""
            if ma is not None and mb is not None and i < len(ma) and i < len(mb):
                m = min(x for x in (ma[i], mb[i]) if x is not None) if (ma[i], mb[i]) != (None, None) else None
                if m is not None and m <= margin_tol * 10:
                    near = f", a near tie (top-1 margin {m:.2g})"
            parts.append(f"target_argmax differs at {len(argmax_nodes)}/{max(len(am), len(bm))} nodes "
                         f"(first node {i}: {am[i] if i < len(am) else '-'} vs {bm[i] if i < len(bm) else '-'}{near})")
        else:
            parts.append(f"argmax agrees but the target's top-1 margin moved by up to {dmargin:.3g} "
                         f"(logits differ; > --margin-tol {margin_tol:g})")
        return "verify", "; ".join(parts), fields, kind
    # 3. metric: same tensors, different bookkeeping
    fields = [c for c in BOOKKEEPING if a[c] != b[c]]
    if fields:
        parts = []
        if "accepted_path" in fields:
            parts.append(f"accepted_path {a['accepted_path']} vs {b['accepted_path']}")
        if "accepted_depth" in fields:
            parts.append(f"accepted_depth {a['accepted_depth']} vs {b['accepted_depth']}")
        if "commit_len" in fields:
            parts.append(f"commit_len {a['commit_len']} vs {b['commit_len']}")
        if "committed_tokens" in fields:
            la, lb = len(a["committed_tokens"] or []), len(b["committed_tokens"] or [])
            parts.append(f"committed {la} vs {lb} tokens (the outputs diverge here)")
        if "finished" in fields:
            parts.append(f"finished {a['finished']} vs {b['finished']}")
        return "metric", "; ".join(parts), fields, None
    return None


def _take(col, idx: np.ndarray) -> pa.Array:
    x = col.take(pa.array(idx, pa.int64()))
    return x.combine_chunks() if isinstance(x, pa.ChunkedArray) else x


def _ne_scalar(ca, cb, ia, ib) -> np.ndarray:
    """[M] bool: aligned scalar values differ (null differs from a value, equals null)."""
    x, y = _take(ca, ia), _take(cb, ib)
    ne = pc.fill_null(pc.not_equal(x, y), False).to_numpy(zero_copy_only=False)
    return ne | (pc.is_null(x).to_numpy(zero_copy_only=False) != pc.is_null(y).to_numpy(zero_copy_only=False))


def _list_pairs(ca, cb, ia, ib):
    """Aligned list cells: (lengths x, lengths y, rows of equal non-zero length, flat x, flat y,
    row index of each flat element)."""
    x, y = _take(ca, ia), _take(cb, ib)
    lx = pc.fill_null(pc.list_value_length(x), -1).to_numpy().astype(np.int64)
    ly = pc.fill_null(pc.list_value_length(y), -1).to_numpy().astype(np.int64)
    same = np.flatnonzero((lx == ly) & (lx > 0))
    if not same.size:
        return lx, ly, same, None, None, None
    xs, ys = x.take(pa.array(same)), y.take(pa.array(same))
    vx, vy = pc.list_flatten(xs), pc.list_flatten(ys)
    rows = np.repeat(np.arange(same.size), lx[same])
    return lx, ly, same, vx, vy, rows


def _ne_list(ca, cb, ia, ib) -> np.ndarray:
    """[M] bool: aligned list cells differ (length or any element)."""
    lx, ly, same, vx, vy, rows = _list_pairs(ca, cb, ia, ib)
    ne = lx != ly
    if vx is not None:
        bad = pc.fill_null(pc.not_equal(vx, vy), True).to_numpy(zero_copy_only=False)
        ne[same[np.unique(rows[bad])]] = True
    return ne


def _margin_moved(ca, cb, ia, ib, tol: float) -> np.ndarray:
    """[M] bool: the target's top-1 margin moved by more than tol at some node (nulls ignored)."""
    lx, _, same, vx, vy, rows = _list_pairs(ca, cb, ia, ib)
    out = np.zeros(len(lx), dtype=bool)
    if vx is not None and math.isfinite(tol):
        d = np.abs(vx.to_numpy(zero_copy_only=False).astype(np.float64)
                   - vy.to_numpy(zero_copy_only=False).astype(np.float64))
        with np.errstate(invalid="ignore"):
            out[same[np.unique(rows[d > tol])]] = True
    return out


def first_divergent_rows(a: Side, b: Side, pairs: list[tuple[str, str]], margin_tol: float):
    """Vectorised over all aligned step pairs: for each request pair, the index (within the
    request) of the first step where anything compare_step looks at differs, or -1.

    Aligned rows: the first min(n_a, n_b) steps of each request pair, in step order.
    Returns (first [P], row in A [P], row in B [P], n_common [P]).
    """
    P = len(pairs)
    sa = np.array([a.ranges.get(ra, (0, 0))[0] for ra, _ in pairs], dtype=np.int64)
    sb = np.array([b.ranges.get(rb, (0, 0))[0] for _, rb in pairs], dtype=np.int64)
    n = np.array([min(a.n_steps(ra), b.n_steps(rb)) for ra, rb in pairs], dtype=np.int64)
    first = np.full(P, -1, dtype=np.int64)
    if P == 0 or n.sum() == 0:
        return first, sa, sb, n
    pair_of = np.repeat(np.arange(P), n)                      # [M] aligned row -> request pair
    within = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)  # [M] step index within the request
    ia, ib = sa[pair_of] + within, sb[pair_of] + within
    ta, tb = a.table, b.table
    diff = np.zeros(len(ia), dtype=bool)
    for c in ("step", "seq_len", "mask_hash") + BOOKKEEPING:
        if c in ("accepted_path", "committed_tokens"):
            diff |= _ne_list(ta[c], tb[c], ia, ib)
        else:
            diff |= _ne_scalar(ta[c], tb[c], ia, ib)
    for c in NODE_LIST_COLUMNS:
        diff |= _ne_list(ta[c], tb[c], ia, ib)
    if "target_margin" in ta.column_names and "target_margin" in tb.column_names:
        diff |= _margin_moved(ta["target_margin"], tb["target_margin"], ia, ib, margin_tol)
    rows = np.flatnonzero(diff)
    pairs_hit, at = np.unique(pair_of[rows], return_index=True)  # rows ascend: first per pair
    first[pairs_hit] = within[rows[at]]
    return first, sa, sb, n


def diff_requests(a: Side, b: Side, pairs: list[tuple[str, str]], margin_tol: float) -> list[RequestDiff]:
    """Each request pair's first divergence (vectorised search, detail from compare_step)."""
    first, sa, sb, n = first_divergent_rows(a, b, pairs, margin_tol)
    hit = np.flatnonzero(first >= 0)
    rows_a = a.table.take(pa.array(sa[hit] + first[hit], pa.int64())).to_pylist() if hit.size else []
    rows_b = b.table.take(pa.array(sb[hit] + first[hit], pa.int64())).to_pylist() if hit.size else []
    detail = {int(p): (x, y) for p, x, y in zip(hit, rows_a, rows_b)}
    out = []
    for p, (ra, rb) in enumerate(pairs):
        out.append(_request_result(a, b, ra, rb, int(first[p]), int(n[p]), detail.get(p), margin_tol))
    return out


def _request_result(a: Side, b: Side, ra: str, rb: str, first: int, n: int, rows, margin_tol: float) -> RequestDiff:
    qa = (a.requests or {}).get(ra) or {}
    qb = (b.requests or {}).get(rb) or {}
    # the prefill's argmax is the first prediction of the target, before any draft
    fa, fb = qa.get("first_token"), qb.get("first_token")
    if fa is not None and fb is not None and fa != fb:
        return RequestDiff(ra, rb, "verify", -1, f"the prefill's first token differs ({fa} vs {fb}): "
                           "same prompt, different target prediction", ["first_token"], 0, "same-input")
    if rows is not None:
        x, y = rows
        if x["step"] != y["step"]:
            return RequestDiff(ra, rb, "metric", x["step"], f"step numbering differs at row {first}: "
                               f"step {x['step']} vs {y['step']}", ["step"], first)
        got = compare_step(x, y, margin_tol)
        assert got is not None, "vectorised and row comparison disagree"
        cls, what, fields, kind = got
        return RequestDiff(ra, rb, cls, x["step"], what, fields, first + 1, kind)
    la, lb = a.n_steps(ra), b.n_steps(rb)
    if la != lb:
        if la < lb:
            s_side, rid_s, short, lab_s, l_side, rid_l, long_, lab_l = a, ra, la, "A", b, rb, lb, "B"
        else:
            s_side, rid_s, short, lab_s, l_side, rid_l, long_, lab_l = b, rb, lb, "B", a, ra, la, "A"
        if short:
            last = s_side.table.slice(s_side.ranges[rid_s][0] + short - 1, 1).to_pylist()[0]
            if last["finished"]:
                nxt = l_side.table["step"][l_side.ranges[rid_l][0] + short].as_py()
                return RequestDiff(ra, rb, "metric", nxt,
                                   f"{lab_l} has {long_ - short} more step(s) after the request finished at step "
                                   f"{last['step']}", ["finished"], n)
        return RequestDiff(ra, rb, "none", None, f"identical over the {n} steps both hold; {lab_s}'s trace "
                           f"ends early ({short} vs {long_} steps)", [], n, truncated=True)
    # steps agree: the request-level record must agree too (server vs client)
    for c in ("output_tokens", "finish_reason"):
        if c in qa and c in qb and qa[c] is not None and qb[c] is not None and qa[c] != qb[c]:
            last = a.table["step"][a.ranges[ra][1] - 1].as_py() if la else None
            return RequestDiff(ra, rb, "metric", last, f"steps agree but the requests table's {c} differs", [c], n)
    return RequestDiff(ra, rb, "none", None, f"identical over {n} steps", [], n)


# ------------------------------------------------------------------------ result


@dataclass
class DiffResult:
    a: dict                          # path, run_id, config, requests, steps
    b: dict
    matched_by: str
    match_note: str
    unmatched_a: list[str]
    unmatched_b: list[str]
    settings_differ: dict            # config key -> [A value, B value]
    acceptance: dict                 # per side: rows-derived and reported means
    requests: list[RequestDiff]
    notes: list[str]
    margin_tol: float

    @property
    def counts(self) -> dict:
        c = dict.fromkeys(CLASSES, 0)
        for r in self.requests:
            c[r.cls] += 1
        return c

    @property
    def clean(self) -> bool:
        return all(r.cls == "none" for r in self.requests)

    def to_dict(self) -> dict:
        return {
            "a": self.a, "b": self.b, "matched_by": self.matched_by, "match_note": self.match_note,
            "overlap": {"matched": len(self.requests), "only_in_a": self.unmatched_a,
                        "only_in_b": self.unmatched_b,
                        "partial": bool(self.unmatched_a or self.unmatched_b)},
            "settings_differ": self.settings_differ, "acceptance": self.acceptance,
            "counts": self.counts, "explanations": EXPLAIN, "margin_tol": self.margin_tol,
            "requests": [r.to_dict() for r in self.requests], "notes": self.notes,
        }


REPORTED_MEANS = MEANS   # mean_accepted_depth, mean_commit_len, mean_accept_length


def rows_means(side: Side, rids: list[str], conventions: dict) -> dict:
    """The reported means re-derived from the rows of the given requests, under `conventions`
    (specaudit/trace/derived.py: the per-step definition and the conventions)."""
    rng = np.array([side.ranges[r] for r in rids if side.n_steps(r) > 0], dtype=np.int64).reshape(-1, 2)
    s, e = rng[:, 0], rng[:, 1]
    # [R] per-request step counts and sums
    return means(e - s, side.cum_depth[e] - side.cum_depth[s], side.cum_commit[e] - side.cum_commit[s], conventions)


def _acceptance(side: Side, rids: list[str]) -> dict:
    """The matched requests' acceptance in the contract's convention (A and B compare), and the
    run's reported means against its whole rows under its declared conventions."""
    rep = side.manifest.get("reported") or {}
    own = rows_means(side, side.request_ids(), side.conventions)
    reported = {k: rep[k] for k in REPORTED_MEANS if isinstance(rep.get(k), (int, float))}
    return {
        "matched_rows": rows_means(side, rids, {"mean": "pooled", "accept_length": "includes_bonus"}),
        "reported": reported, "conventions": side.conventions,
        "rows_in_declared_conventions": own,
        "reported_matches_rows": {k: agrees(v, own[k]) for k, v in reported.items() if own[k] is not None},
    }


def _describe(side: Side) -> dict:
    cfg = side.manifest.get("config") or {}
    return {"path": str(side.path), "run_id": side.run_id, "engine": side.manifest.get("engine"),
            "config": cfg, "requests": len(side.request_ids()),
            "steps": side.table.num_rows}


def diff_runs(a_path, b_path, margin_tol: float = DEFAULT_MARGIN_TOL) -> DiffResult:
    """Compare run A with run B (each a run folder or a dataset holding one run)."""
    runs_a, runs_b = discover([a_path]), discover([b_path])
    check_versions(runs_a, runs_b)
    a, b = load_side(one_run(runs_a, a_path, "A"), "A"), load_side(one_run(runs_b, b_path, "B"), "B")
    m = match_requests(a, b)
    reqs = diff_requests(a, b, m.pairs, margin_tol)
    notes = a.notes + b.notes
    if m.unmatched_a or m.unmatched_b:
        notes.append(f"partial overlap: compared the {len(m.pairs)} requests both hold; "
                     f"{len(m.unmatched_a)} only in A, {len(m.unmatched_b)} only in B")
    ca, cb = a.manifest.get("config") or {}, b.manifest.get("config") or {}
    skip = {"num_prompts"}  # a partial overlap already says so
    differ = {k: [ca.get(k), cb.get(k)] for k in sorted(set(ca) | set(cb))
              if k not in skip and ca.get(k) != cb.get(k)}
    ma_, mb_ = a.manifest.get("models") or {}, b.manifest.get("models") or {}
    for role in sorted(set(ma_) | set(mb_)):
        ha = (ma_.get(role) or {}).get("sha256") if isinstance(ma_.get(role), dict) else None
        hb = (mb_.get(role) or {}).get("sha256") if isinstance(mb_.get(role), dict) else None
        if ha and hb and ha != hb:
            notes.append(f"the {role} models differ (sha256 {ha[:12]} vs {hb[:12]}): divergence is expected")
    acc = {"A": _acceptance(a, [p[0] for p in m.pairs]), "B": _acceptance(b, [p[1] for p in m.pairs])}
    for lab, side in (("A", a), ("B", b)):
        for k, ok in acc[lab]["reported_matches_rows"].items():
            if not ok:
                notes.append(f"{lab}'s reported {k} {acc[lab]['reported'][k]:.3g} is not what its rows give under "
                             f"its declared conventions ({acc[lab]['rows_in_declared_conventions'][k]:.3g}): its "
                             f"metrics code is suspect; run `specaudit check {side.path}`")
    if a.conventions != b.conventions:
        notes.append(f"conventions differ (A {a.conventions}, B {b.conventions}): each run's reported figures "
                     "are read in its own; the rows compare in the contract's")
    return DiffResult(_describe(a), _describe(b), m.by, m.note, m.unmatched_a, m.unmatched_b, differ, acc,
                      reqs, notes, margin_tol)


# ------------------------------------------------------------------------- output


def format_text(res: DiffResult, examples: int = 5) -> str:
    out = []
    for lab, d in (("A", res.a), ("B", res.b)):
        c = d["config"]
        cfg = " ".join(f"{k}={c[k]}" for k in ("algo", "budget", "topk", "concurrency") if c.get(k) is not None)
        out.append(f"{lab}: {d['path']}  ({cfg}; {d['requests']} requests, {d['steps']} steps)")
    if res.settings_differ:
        out.append("settings that differ: " + ", ".join(f"{k} {a!r} -> {b!r}"
                                                         for k, (a, b) in res.settings_differ.items()))
    out.append(f"{res.match_note}: {len(res.requests)} requests compared")
    A, B = res.acceptance["A"], res.acceptance["B"]
    ra, rb = A["matched_rows"], B["matched_rows"]
    pa_, pb_ = A["reported"], B["reported"]
    # reported counts (ints) print as they are; a missing figure as '-'
    ra_d, rb_d, ra_c, rb_c, pa_d, pb_d, pa_c, pb_c = (
        fixed(x, missing="-", exact_ints=True) for x in (
            ra["mean_accepted_depth"], rb["mean_accepted_depth"], ra["mean_commit_len"], rb["mean_commit_len"],
            pa_.get("mean_accepted_depth"), pb_.get("mean_accepted_depth"), pa_.get("mean_commit_len"),
            pb_.get("mean_commit_len")))
    out.append(f"acceptance of the compared requests (rows, pooled): depth {ra_d} vs {rb_d}, commit {ra_c} vs "
               f"{rb_c}; reported by the runs: depth {pa_d} vs {pb_d}, commit {pa_c} vs {pb_c}"
               + (" (each in its declared conventions)" if A["conventions"] != B["conventions"] else ""))
    for n in res.notes:
        out.append(f"note: {n}")
    counts = res.counts
    out.append("first divergence: " + ", ".join(f"{k} {counts[k]}" for k in CLASSES))
    for cls in CLASSES:
        rows = [r for r in res.requests if r.cls == cls]
        if not rows:
            continue
        out.append("")
        out.append(f"{cls.upper()} ({len(rows)} request{'s' if len(rows) != 1 else ''}): {EXPLAIN[cls]}")
        w = max(7, max(len(_rid(r)) for r in rows[:examples]))
        out.append(f"  {'request':<{w}}  {'step':>5}  what differs")
        for r in rows[:examples]:
            step = "-" if r.step is None else "pre" if r.step == -1 else str(r.step)
            out.append(f"  {_rid(r):<{w}}  {step:>5}  {r.what}")
        if len(rows) > examples:
            out.append(f"  ... and {len(rows) - examples} more (--examples N, or --output-format json)")
    return "\n".join(out)


def _rid(r: RequestDiff) -> str:
    return r.request_id if r.request_id == r.request_id_b else f"{r.request_id}/{r.request_id_b}"
