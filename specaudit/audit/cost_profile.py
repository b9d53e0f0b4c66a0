"""Cost profiles: the step cost factor r(N, c) that turns a throughput ratio into tokens per step.

Cost profiles (written by `specaudit calibrate`) give r and its spread for a grid of
(N, c); `CostProfile.lookup(n_nodes, concurrency)` interpolates inside the grid and
refuses outside it. `CostProfile.manual(r)` is a factor given by hand; `profile_t_ar` reads the plain decode
step time a measured profile holds (a baseline without --baseline-tps).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specaudit.audit.estimate_model import finite_nonneg, finite_positive
from specaudit.trace.safe_io import InputError

# A cost factor typed by hand is one number for every context length and batch shape;
# measured profiles of the reference runtime spread by about this much over a run's
# context lengths, so a hand-given r without its own spread is taken as +-10% (1 sd).
HAND_COST_FACTOR_REL_STD = 0.10
PROFILE_KIND = "specaudit-cost-profile"
PROFILE_VERSION = 1
MAX_PROFILE_BYTES = 16 << 20   # a cost profile or a load.py output: KBs; more is not one


@dataclass
class CostEntry:
    """r at one grid point. n_nodes / concurrency None means "any" (a hand profile)."""

    r: float
    r_std: float = 0.0
    n_nodes: int | None = None       # N = root + drafts
    concurrency: int | None = None   # c
    t_ar_s: float | None = None      # plain decode step at c
    t_draft_s: float | None = None
    t_verify_s: float | None = None
    samples: int | None = None


@dataclass
class CostProfile:
    """Step cost factors r(N, c). Lookup interpolates linearly inside the grid."""

    entries: list[CostEntry]
    source: str = "manual"           # measured | manual | trace
    meta: dict = field(default_factory=dict)
    path: str | None = None

    @classmethod
    def manual(cls, r: float, r_std: float | None = None) -> CostProfile:
        r = finite_positive("--cost-factor", r)
        sd = HAND_COST_FACTOR_REL_STD * r if r_std is None else finite_nonneg("--cost-factor-std", r_std)
        return cls([CostEntry(r=r, r_std=sd)], source="manual",
                   meta={"note": "given by hand" + ("" if r_std is not None else
                                                    f"; spread taken as {HAND_COST_FACTOR_REL_STD:.0%} of r")})

    def to_dict(self) -> dict:
        return {"kind": PROFILE_KIND, "version": PROFILE_VERSION, "source": self.source,
                "meta": self.meta,
                "entries": [{k: v for k, v in asdict(e).items() if v is not None} for e in self.entries]}

    def save(self, path) -> None:
        from specaudit.trace.safe_io import atomic_write_bytes
        self.meta.setdefault("created_at", time.time())
        atomic_write_bytes(Path(path), (json.dumps(self.to_dict(), indent=1) + "\n").encode())

    @classmethod
    def load(cls, path) -> CostProfile:
        from specaudit.inputs import read_input_bytes
        from specaudit.trace.safe_io import parse_json_bounded
        p = Path(path)
        if not os.path.lexists(p):
            raise InputError(p, "cost profile not found (make one with `specaudit calibrate`)")
        data = read_input_bytes(p, MAX_PROFILE_BYTES, "--profile")   # a FIFO or a device: refused
        try:
            d = parse_json_bounded(data, p)
        except InputError as e:
            raise InputError(p, f"cost profile is {e.reason}") from None
        if not isinstance(d, dict) or d.get("kind") != PROFILE_KIND:
            raise InputError(p, f"not a cost profile (expected \"kind\": \"{PROFILE_KIND}\")")
        if d.get("version") != PROFILE_VERSION:
            raise InputError(p, f"unknown cost profile version {d.get('version')!r} (this specaudit reads "
                                f"{PROFILE_VERSION})")
        raw = d.get("entries")
        if not isinstance(raw, list) or not raw:
            raise InputError(p, "cost profile has no entries")
        entries = []
        for i, e in enumerate(raw):
            try:
                r = finite_positive("r", e.get("r"))
                sd = finite_nonneg("r_std", e.get("r_std", 0.0))
                n = e.get("n_nodes")
                c = e.get("concurrency")
                n = None if n is None else int(n)
                c = None if c is None else int(c)
            except (ValueError, TypeError, AttributeError) as err:
                raise InputError(p, f"entry {i}: {err}") from None
            if (n is not None and n < 1) or (c is not None and c < 1):
                raise InputError(p, f"entry {i}: n_nodes and concurrency must be >= 1")
            entries.append(CostEntry(r=r, r_std=sd, n_nodes=n, concurrency=c,
                                     t_ar_s=e.get("t_ar_s"), t_draft_s=e.get("t_draft_s"),
                                     t_verify_s=e.get("t_verify_s"), samples=e.get("samples")))
        return cls(entries, source=str(d.get("source", "measured")), meta=d.get("meta") or {}, path=str(p))

    def coverage(self) -> str:
        ns = sorted({e.n_nodes for e in self.entries if e.n_nodes is not None})
        cs = sorted({e.concurrency for e in self.entries if e.concurrency is not None})
        part = lambda xs: "any" if not xs else (f"{xs[0]}..{xs[-1]}" if len(xs) > 1 else str(xs[0]))
        return f"N {part(ns)}, c {part(cs)}"

    def lookup(self, n_nodes: int | None = None, concurrency: int | None = None) -> tuple[float, float]:
        """(r, r_std) at (N, c). Wildcard entries match anything; a grid is interpolated
        linearly in N then in c between the nearest grid points. Outside the grid (or
        when the profile needs N or c and it is unknown): InputError."""
        where = self.path
        for e in self.entries:  # exact or wildcard match first
            if (e.n_nodes in (None, n_nodes)) and (e.concurrency in (None, concurrency)):
                return e.r, e.r_std
        if n_nodes is None or concurrency is None:
            raise InputError(where, f"the cost profile is per N and c ({self.coverage()}) but the input does not "
                                    f"say its {'N (nodes per step)' if n_nodes is None else 'concurrency'}; "
                                    "give --n-nodes / --concurrency")
        cs = sorted({e.concurrency for e in self.entries if e.concurrency is not None})
        if not cs or not (cs[0] <= concurrency <= cs[-1]):
            raise InputError(where, f"the cost profile does not cover concurrency {concurrency} ({self.coverage()}); "
                                    "calibrate for it")

        def at_c(c: int) -> tuple[float, float]:
            pts = sorted((e.n_nodes, e.r, e.r_std) for e in self.entries
                         if e.concurrency == c and e.n_nodes is not None)
            wild = [e for e in self.entries if e.concurrency == c and e.n_nodes is None]
            if wild:
                return wild[0].r, wild[0].r_std
            if not pts or not (pts[0][0] <= n_nodes <= pts[-1][0]):
                raise InputError(where, f"the cost profile does not cover N={n_nodes} nodes at concurrency {c} "
                                        f"({self.coverage()}); calibrate for it")
            return _interp(pts, n_nodes)

        lo = max(c for c in cs if c <= concurrency)
        hi = min(c for c in cs if c >= concurrency)
        r_lo, s_lo = at_c(lo)
        if hi == lo:
            return r_lo, s_lo
        r_hi, s_hi = at_c(hi)
        w = (concurrency - lo) / (hi - lo)
        return r_lo + w * (r_hi - r_lo), s_lo + w * (s_hi - s_lo)


def profile_t_ar(profile: CostProfile, concurrency: int) -> float:
    """The plain decode step time at concurrency c from a measured profile (mean over its
    N entries at c, linear between grid points). InputError when it has none there."""
    by_c: dict[int, list] = {}
    for e in profile.entries:
        if e.t_ar_s and e.concurrency is not None:
            by_c.setdefault(e.concurrency, []).append(e.t_ar_s)
    cs = sorted(by_c)
    if not cs or concurrency is None or not (cs[0] <= concurrency <= cs[-1]):
        raise InputError(profile.path, f"the profile has no plain step time at concurrency {concurrency} "
                                       "(give --baseline-tps)")
    lo = max(c for c in cs if c <= concurrency)
    hi = min(c for c in cs if c >= concurrency)
    t_lo, t_hi = (sum(by_c[x]) / len(by_c[x]) for x in (lo, hi))
    return t_lo if hi == lo else t_lo + (concurrency - lo) / (hi - lo) * (t_hi - t_lo)


def _interp(pts: list[tuple[int, float, float]], x: int) -> tuple[float, float]:
    for (x0, r0, s0), (x1, r1, s1) in zip(pts, pts[1:] + pts[-1:]):
        if x0 == x:
            return r0, s0
        if x0 < x <= x1:
            w = (x - x0) / (x1 - x0)
            return r0 + w * (r1 - r0), s0 + w * (s1 - s0)
    return pts[-1][1], pts[-1][2]
