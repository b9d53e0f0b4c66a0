"""What the SA8xx rules see of a batch's contract v2 (speculative sampling) columns.

Built once per StepFrame (`f.sampling`), vectorised like the frame: the per-node lists
flat and aligned on node_tokens, the per-step scalars per sorted row.

Words (docs/trace-contract.md, version 2):
    tested    a node with a recorded uniform (accept_u not NaN); the root never is
    ratio     target_prob / draft_prob of a tested node: accepted iff u < ratio
    unknown   run.json config.sampling.unknown names values the engine does not expose
              (transformers: its uniforms, and the drawn token a cut step discards):
              `accept_u` all NaN on a row means "not exposed" instead of "never tested",
              and the tested nodes follow from the path (`derived_tested`);
              `sampled_token` -1 means the drawn token is unknown (its probabilities NaN)
    residual row   a row whose last accepted node has tested children: the token after
              the path was drawn from the residual norm(max(0, p' - q)), not from p
"""
from __future__ import annotations

import numpy as np

from specaudit.trace.schema import SAMPLING_NODE_LIST_COLUMNS

from .arrow import _scalar, list_parts

SAMPLING_SUM_KEYS = ("sampling_tests", "sampling_accepts", "sampling_expected", "sampling_var")

I64 = np.int64
# A decision is wrong only when u lies on the wrong side of p/q by more than float32
# rounding of the three recorded numbers can explain.
REL_TOL = 1e-5
ABS_TOL = 1e-6


class SamplingView:
    @classmethod
    def of(cls, f):
        if "accept_u" not in f.columns and "sampled_token" not in f.columns:
            return None
        return cls(f)

    def __init__(self, f):
        self.f = f
        R, col = f.R, f.columns
        n0 = f.n[f.inv]                                   # batch-order N per row
        rows0 = np.repeat(np.arange(R, dtype=I64), n0)
        s0 = np.cumsum(n0) - n0
        self.lens = {}
        flat = {}
        for name in SAMPLING_NODE_LIST_COLUMNS:
            if name in col:
                off, v, lens = list_parts(col[name])
                self.lens[name] = lens[f.order]
                a = f._aligned((off, v, lens), n0, rows0, s0).astype(np.float64)
                # rows whose list is null or short: NaN (the -1 fill is a legal-looking value)
                a[(lens != n0)[rows0]] = np.nan
                flat[name] = a
            else:
                self.lens[name] = np.full(R, -1, dtype=I64)
                flat[name] = np.full(f.T, np.nan)
        self.draft_prob, self.target_prob, self.u = flat["draft_prob"], flat["target_prob"], flat["accept_u"]
        sc = {}
        self.nulls = {}
        for name, fill, dt in (("sampled_token", -1, I64), ("sampled_prob", np.nan, np.float64),
                               ("sampled_target_prob", np.nan, np.float64),
                               ("sampled_draft_prob", np.nan, np.float64), ("sampled_rank", -1, I64)):
            if name in col:
                v, nl = _scalar(col[name], fill=fill, dtype=dt)
                sc[name] = v[f.order]
                self.nulls[name] = nl[f.order] if nl is not None else np.zeros(R, dtype=bool)
            else:
                sc[name] = np.full(R, fill, dtype=dt)
                self.nulls[name] = np.ones(R, dtype=bool)
        self.token = sc["sampled_token"]
        self.token_prob = sc["sampled_prob"]
        self.token_target_prob = sc["sampled_target_prob"]
        self.token_draft_prob = sc["sampled_draft_prob"]
        self.rank = sc["sampled_rank"]
        # a sampled row: it carries the v2 record (the uniforms or the drawn token)
        self.rows = (self.lens["accept_u"] >= 0) | ~self.nulls["sampled_token"]
        sp = ((f.manifest or {}).get("config") or {}).get("sampling") or {}
        unknown = sp.get("unknown") or () if isinstance(sp, dict) else ()
        n_u = np.bincount(f.node_row[~np.isnan(self.u)], minlength=R) if f.T else np.zeros(R, dtype=I64)
        # rows whose uniforms the engine does not expose / whose drawn token it cut away
        self.u_unknown = self.rows & ("accept_u" in unknown) & (n_u == 0)
        self.token_unknown = self.rows & ("sampled_token" in unknown) & (self.token == -1)

    # ------------------------------------------------------------ input values
    def bad_values(self) -> tuple[np.ndarray, np.ndarray]:
        """(bool [R], reason per row) for sampled rows whose v2 values are unusable."""
        f, R = self.f, self.f.R
        why = np.full(R, "", dtype=object)
        bad = np.zeros(R, dtype=bool)

        def mark(rows_bad, text):
            new = rows_bad & ~bad & self.rows
            why[new] = text if isinstance(text, str) else text[new]
            bad[:] |= new

        for name in SAMPLING_NODE_LIST_COLUMNS:
            mark(self.lens[name] != f.n, f"{name} does not hold one entry per node")
        for name, a in (("draft_prob", self.draft_prob), ("target_prob", self.target_prob)):
            b = np.isnan(a) | (a < 0) | (a > 1)
            mark(f.row_any(b), f"{name} holds a value outside [0, 1] or NaN")
        u = self.u
        mark(f.row_any(~np.isnan(u) & ((u < 0) | (u >= 1))), "accept_u holds a value outside [0, 1)")
        mark(f.row_any((f.node_i > 0) & ~np.isnan(u) & (self.draft_prob <= 0)),
             "a tested node has draft_prob 0: a draft drawn from q has q > 0")
        mark(self.nulls["sampled_token"] | ((self.token < 0) & ~self.token_unknown), "sampled_token is missing")
        for name, a in (("sampled_prob", self.token_prob), ("sampled_target_prob", self.token_target_prob)):
            mark((np.isnan(a) & ~self.token_unknown) | (a < 0) | (a > 1), f"{name} is outside [0, 1] or NaN")
        d = self.token_draft_prob
        mark(~np.isnan(d) & ((d < 0) | (d > 1)), "sampled_draft_prob is outside [0, 1]")
        return bad, why

    @property
    def usable(self) -> np.ndarray:
        """Sampled rows the SA801-SA804 rules may trust (tree ok, v2 values in range)."""
        if not hasattr(self, "_usable"):
            bad, _ = self.bad_values()
            self._usable = self.rows & ~bad & self.f.path_ok
        return self._usable

    # --------------------------------------------------------------- decisions
    @property
    def tested(self) -> np.ndarray:
        """Flat: nodes with a recorded uniform (the root excluded); on rows whose uniforms
        are unknown, the nodes the path says were tested (derived_tested)."""
        f = self.f
        unk = self.u_unknown[f.node_row]
        return (f.node_i > 0) & np.where(unk, self.derived_tested, ~np.isnan(self.u))

    @property
    def derived_tested(self) -> np.ndarray:
        """Flat: the nodes a chain (Leviathan) or SpecInfer tree tested, read off the
        path: the children of each accepted node up to the accepted child in node order,
        and every child of the last accepted node when the drawn token is known (a cut
        step may have accepted past the commit: its children stay unknown)."""
        f = self.f
        if not hasattr(self, "_derived"):
            nxt = np.full(f.T, -2, dtype=I64)   # per node on the path: the accepted child; -1: last
            if len(f.path):
                ok = f.path_in_range & self.usable[f.path_row]
                g = f.path_glob
                last = f.path_last_k
                nxt[g[ok & last]] = -1
                sel = np.flatnonzero(ok & ~last)
                nxt[g[sel]] = g[sel + 1]
            par = f.parent_flat
            pn = np.where(par >= 0, nxt[np.maximum(par, 0)], -2)
            idx = np.arange(f.T, dtype=I64)
            known = ~self.token_unknown[f.node_row]
            self._derived = (par >= 0) & (((pn >= 0) & (idx <= pn)) | ((pn == -1) & known))
        return self._derived

    @property
    def on_path(self) -> np.ndarray:
        """Flat: accepted nodes (path entries after the root) of usable rows."""
        f = self.f
        out = np.zeros(f.T, dtype=bool)
        if len(f.path):
            k = f.path_k
            sel = (k > 0) & f.path_in_range & self.usable[f.path_row]
            out[f.path_glob[sel]] = True
        return out

    @property
    def ratio(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.draft_prob > 0, self.target_prob / self.draft_prob, np.inf)

    def decisions(self):
        """Flat (passes clearly, fails clearly) of every tested node under u < p/q. Where
        the uniform is unknown, only what holds for every u in [0, 1): p/q >= 1 passes,
        p = 0 fails."""
        r, u = self.ratio, self.u
        slack = REL_TOL * np.minimum(r, 1.0) + ABS_TOL
        unk = self.u_unknown[self.f.node_row]
        with np.errstate(invalid="ignore"):
            return (np.where(unk, r >= 1.0 + slack, u < r - slack),
                    np.where(unk, self.target_prob <= 0, u >= r + slack))

    @property
    def residual_rows(self) -> np.ndarray:
        """Rows whose last accepted node has tested children."""
        f = self.f
        last = f.last_node[f.node_row]
        return f.row_any(self.tested & (f.parent_flat == last)) & self.usable

    # ----------------------------------------------------------------- run sums
    def sums(self) -> dict:
        """Tests, acceptances, expected acceptances sum(min(1, p/q)) and its variance."""
        f = self.f
        t = self.tested & self.usable[f.node_row]
        a = np.clip(self.ratio[t], 0.0, 1.0)
        acc = self.on_path[t]
        return dict(zip(SAMPLING_SUM_KEYS, (int(t.sum()), int(acc.sum()), float(a.sum()),
                                            float((a * (1 - a)).sum()))))
