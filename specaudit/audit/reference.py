"""The catalog's step and request rules as plain per-row Python: an oracle, a baseline.

Reads rows as Python dicts, one at a time, with a dict of per-request state: the
obvious implementation of docs/trace-contract.md's rules 1-8. tests/test_check_props.py
checks that the vectorised engine (specaudit.check) flags exactly the same
(code, request, step) as this does; scripts/bench_check.py times it as the
baseline. Aggregates (rule 9) are summed here row by row and handed to the same
run-scope rules, which only compare a few numbers.

Rows of a request are taken in step order (the engine sorts within a read batch;
the oracle is run on datasets that fit in one batch).
"""
from __future__ import annotations

from collections import Counter

from specaudit.audit.compare import agrees
from specaudit.trace.derived import bonus
from specaudit.trace.schema import MAX_NODES, manifest_conventions, mask_hash_from_parents

# The catalog codes this oracle computes (invariants/homes.py reads it): every step and
# request rule of the greedy contract. tests/test_rule_homes.py runs each one's own catalog
# fixtures through check_rows and fails on a code flagged here but not listed.
RULES_IMPLEMENTED = frozenset((
    "SA101", "SA102", "SA103", "SA104", "SA105", "SA106", "SA107", "SA108", "SA109", "SA201", "SA202",
    "SA301", "SA302", "SA303", "SA304", "SA305", "SA306", "SA307", "SA308", "SA309", "SA310", "SA311",
    "SA401", "SA402", "SA403", "SA404", "SA405", "SA406", "SA407", "SA408", "SA409", "SA410"))

NODE_LISTS = ("parents", "positions", "target_argmax")
NULLABLE_LISTS = ("draft_logprob", "target_margin")
REQUIRED_SCALARS = ("step", "request_id", "budget", "topk", "batch_size", "seq_len", "accepted_depth",
                    "commit_len", "mask_hash", "finished")


def _diag_bad(values, in_range) -> bool:
    """SA109: a null, NaN, infinite or out-of-range value inside a diagnostic list."""
    if values is None:
        return False
    return any(x is None or x != x or x in (float("inf"), float("-inf")) or not in_range(x) for x in values)


def _depths(p):
    d = [0] * len(p)
    for i in range(1, len(p)):
        d[i] = d[p[i]] + 1
    return d


class _Req:
    __slots__ = ("last_step", "seq_end", "last_tok", "fin", "out_len", "contig", "n_steps", "first_seq",
                 "first_root", "first_ok", "commits", "sum_depth", "sum_commit_n")

    def __init__(self):
        self.last_step = -1
        self.seq_end = self.last_tok = -1
        self.fin = False
        self.out_len = 1
        self.contig = True
        self.n_steps = 0
        self.first_seq = self.first_root = None
        self.first_ok = True
        self.commits = []
        self.sum_depth = 0
        self.sum_commit_n = 0


def check_step_rows(rows, *, run_id: str, eos_id: int = 0, max_new_tokens=None, hits=None, state=None):
    """Check step rows (dicts of one run, each request's rows in step order).

    Returns (hits: Counter of (code, request_id, step), state: request_id -> _Req)."""
    hits = Counter() if hits is None else hits
    state = {} if state is None else state
    for r in rows:
        rid, step = r.get("request_id"), r.get("step")
        rid = "<null>" if rid is None else str(rid)
        key = (rid, -1 if step is None else step)

        def hit(code, key=key):
            hits[(code,) + key] += 1

        tokens = r["node_tokens"] or []
        n = len(tokens) if r["node_tokens"] is not None else 0
        p = list(r["parents"] or [])
        p = (p + [-1] * n)[:n]
        budget, topk = r["budget"], r["topk"]
        # SA1: shapes and tree (every row)
        shapes_ok = n >= 1
        bad_len = False
        for c in NODE_LISTS:
            ln = len(r[c]) if r[c] is not None else -1
            if ln != n:
                bad_len = True
        for c in NULLABLE_LISTS:
            if r.get(c) is not None and len(r[c]) != n:
                bad_len = True
        if bad_len and r["node_tokens"] is not None:
            hit("SA101")
        shapes_ok &= not bad_len
        if n < 1 or (budget is not None and n > budget + 1) or n > MAX_NODES:
            hit("SA102")
        shapes_ok &= n <= MAX_NODES
        shapes_ok &= r["accepted_path"] is not None and len(r["accepted_path"]) >= 1
        shapes_ok &= r["committed_tokens"] is not None
        root_bad = n < 1 or p[0] != -1
        if root_bad and n > 0:
            hit("SA103")
        order_bad = any(not (0 <= p[i] < i) for i in range(1, n))
        if order_bad and shapes_ok:
            hit("SA104")
        nulls = any(r.get(c) is None for c in REQUIRED_SCALARS)
        nulls |= any(r.get(c) is None for c in ("accepted_path", "committed_tokens", "node_tokens") + NODE_LISTS)
        if nulls or r.get("algo") not in ("chain", "tree"):
            hit("SA107")
        if r.get("run_id") != run_id:
            hit("SA108")
        if _diag_bad(r.get("target_margin"), lambda x: x >= 0) or _diag_bad(r.get("draft_logprob"), lambda x: x <= 0):
            hit("SA109")
        ok = shapes_ok and not root_bad and not order_bad and not nulls
        commit = list(r["committed_tokens"] or [])
        path = list(r["accepted_path"] or [])
        ad, cl, fin, seq = r["accepted_depth"], r["commit_len"], r["finished"], r["seq_len"]
        st = state.setdefault(rid, _Req())
        has_prev = st.n_steps > 0
        expect = st.last_step + 1 if has_prev else 0
        in_order = step == expect
        contiguous = st.contig and in_order
        out_before = st.out_len
        prev_seq_end, prev_last, prev_fin = st.seq_end, st.last_tok, st.fin
        # --- rules on rows whose structure is sound
        if ok:
            kids = Counter(p[1:])
            if kids and max(kids.values()) > topk:
                hit("SA105")
            if (r["algo"] == "chain" or topk == 1) and any(p[i] != i - 1 for i in range(1, n)):
                hit("SA106")
            depth = _depths(p)
            if any(r["positions"][i] != seq + depth[i] for i in range(n)):
                hit("SA201")
            if r["mask_hash"] != mask_hash_from_parents(p):
                hit("SA202")
            if (not fin and cl != ad + 1) or (fin and cl > ad + 1):
                hit("SA301")
            if len(path) >= 1 and ad != len(path) - 1:
                hit("SA302")
            path_ok = (len(path) >= 1 and path[0] == 0 and all(0 <= x < n for x in path)
                       and all(p[path[k]] == path[k - 1] for k in range(1, len(path))))
            if not path_ok:
                hit("SA303")
            am, tok = r["target_argmax"], tokens
            if path_ok:
                if any(am[path[k - 1]] != tok[path[k]] for k in range(1, len(path))):
                    hit("SA304")
                last = path[-1]
                if any(p[c] == last and tok[c] == am[last] for c in range(1, n)):
                    hit("SA305")
                exp = [tok[x] for x in path[1:]] + [am[last]]
                mism = any(k >= len(exp) or commit[k] != exp[k] for k in range(len(commit)))
                if mism or (not fin and len(commit) < len(exp)):
                    hit("SA307")
            if cl != len(commit):
                hit("SA306")
            if eos_id in commit:
                k = commit.index(eos_id)
                if k < len(commit) - 1:
                    hit("SA308")
                if not fin:
                    hit("SA309")
            if ad < 0 or cl < 1 or len(commit) < 1:
                hit("SA310")
            if max_new_tokens is not None and contiguous and path_ok:
                out = out_before + len(commit)
                ends_eos = bool(commit) and commit[-1] == eos_id
                if (fin and not ends_eos and out != max_new_tokens) or out > max_new_tokens or \
                        (not fin and out >= max_new_tokens):
                    hit("SA311")
            # SA4: continuity
            if step != expect:
                hit("SA401")
            if has_prev and step == st.last_step + 1:
                if seq != prev_seq_end:
                    hit("SA402")
                if n > 0 and tokens[0] != prev_last:
                    hit("SA403")
            if has_prev and prev_fin:
                hit("SA404")
        # --- fold the row into the request's state (every row)
        if st.n_steps == 0:   # the request's first row (its seq_len may be null: then refused)
            st.first_seq, st.first_root = seq, (tokens[0] if n else -1)
            st.first_ok = ok
        st.contig = contiguous
        st.last_step = step if step is not None else -1
        st.seq_end = (seq if seq is not None else -1) + len(commit)
        st.last_tok = commit[-1] if commit else -1
        st.fin = st.fin or bool(fin)
        st.out_len += len(commit)
        st.n_steps += 1
        st.commits.extend(commit)
        st.sum_depth += len(path) - 1 if path else -1
        st.sum_commit_n += len(commit)
    return hits, state


def check_request_rows(requests, state, *, eos_id=0, max_new_tokens=None, complete=True,
                       last_finished=None, hits=None, conventions=None):
    """Requests-table rules (SA405-SA410) against the per-request state of the steps."""
    hits = Counter() if hits is None else hits
    seen = Counter(str(q["request_id"]) for q in requests)
    rows = {str(q["request_id"]): q for q in requests}
    for rid, q in rows.items():
        st = state.get(rid)
        out = q["output_tokens"] or []
        reason = q["finish_reason"]
        if st is not None:
            if st.first_ok and (st.first_seq != len(q["prompt_tokens"] or []) or st.first_root != q["first_token"]):
                hits[("SA405", rid, -1)] += 1
            if st.contig and ([q["first_token"]] + st.commits != list(out)):
                hits[("SA406", rid, -1)] += 1
        ref = q.get("reference_tokens")
        if ref is not None and list(ref) != list(out):
            hits[("SA407", rid, -1)] += 1
        bad = reason not in ("eos", "length", "abort")
        bad |= reason == "eos" and (not out or out[-1] != eos_id)
        bad |= reason == "length" and max_new_tokens is not None and len(out) != max_new_tokens
        bad |= eos_id in out[:-1]
        if complete and st is not None and reason != "abort" and not (last_finished or {}).get(rid, False):
            bad = True
        if complete and st is None and reason != "abort" and len(out) != 1:
            bad = True
        if bad:
            hits[("SA408", rid, -1)] += 1
        if complete and seen[rid] > 1:
            hits[("SA409", rid, -1)] += 1
        n = st.n_steps if st is not None else 0
        want = {"completion_tokens": len(out), "verify_steps": n}
        if n:
            want["accept_length"] = st.sum_depth / n + bonus(conventions)   # trace/derived.py's convention
        for col, w in want.items():
            v = q.get(col)
            if v is not None and v == v and agrees(float(v), float(w)) is False:
                hits[("SA410", rid, -1)] += 1
                break
    if complete:
        for rid in state:
            if rid not in rows and rid != "<null>":
                hits[("SA409", rid, -1)] += 1
    return hits


def check_rows(step_rows, request_rows, manifest, *, run_id=None):
    """The whole oracle for one run held as row dicts -> Counter of (code, request, step).

    Step rows are sorted by (request, step) first (stable), like one engine batch."""
    cfg = (manifest or {}).get("config") or {}
    eos = cfg.get("eos_id", 0) or 0
    mnt = cfg.get("max_new_tokens")
    run_id = run_id or (manifest or {}).get("run_id")
    def order(r):
        return str(r.get("request_id")), (r.get("step") if r.get("step") is not None else -1)
    rows = sorted(step_rows, key=order)
    last_fin = {}
    for r in rows:
        last_fin[str(r.get("request_id"))] = bool(r.get("finished"))
    hits, state = check_step_rows(rows, run_id=run_id, eos_id=eos, max_new_tokens=mnt)
    if request_rows is not None:
        complete = bool(manifest and manifest.get("finished_at"))
        check_request_rows(request_rows, state, eos_id=eos, max_new_tokens=mnt, complete=complete,
                           last_finished=last_fin, hits=hits, conventions=manifest_conventions(manifest))
    return hits
