"""Is speculative sampling lossless? A two-sample test of the output distributions.

Greedy speculative decoding is lossless by equality (SA404 compares with the plain
greedy output). Under sampling two outputs of the same prompt differ by design, so
the claim is about distributions: for every prompt, the token at each of the first k
output positions must follow the same distribution with and without speculation.

Words:
    arm        a set of samples: for each prompt, many independent outputs
    position   output index j (1 = the first token after the prefill's; the prefill's
               own token is drawn the same way in both arms and is not tested)
    category   the token at position j, or "ended" when the output stopped before j
               (so the length distribution is tested too)

Test: per position and prompt, Pearson's chi-square test of homogeneity on the 2 x C
table of category counts (categories with fewer than MIN_POOLED samples over both
arms pooled into one "rare" category, so expected counts stay near 5 or more); the
statistics and degrees of freedom of a position's prompts are summed (independent
strata); the run's p-value is the smallest position p-value times the number of
positions tested (Bonferroni). The arms differ when it is below alpha.

Power: a distortion of size delta is modelled as delta of probability moved between
the two most likely categories of a position (total variation delta). For n samples
per prompt and arm the chi-square statistic is then non-central with
lambda = n * sum over prompts of delta^2 / 2 * (1/pa + 1/pb) (pa, pb the pooled
probabilities of the two categories); `n_needed` is the smallest n whose test at
alpha / positions detects it with probability POWER.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

MIN_POOLED = 10
POWER = 0.8
ENDED = -1


@dataclass
class PositionTest:
    position: int
    chi2: float
    dof: int
    p_value: float
    n_needed: int | None      # samples per prompt and arm to detect the distortion (None: no information)


@dataclass
class LosslessResult:
    positions: list[PositionTest]
    p_value: float            # Bonferroni over the positions with dof > 0
    alpha: float
    distortion: float
    prompts: int
    samples_a: int            # per prompt (the smallest over prompts)
    samples_b: int
    labels: tuple = ("A", "B")
    notes: list = field(default_factory=list)

    @property
    def differ(self) -> bool:
        return self.p_value < self.alpha

    @property
    def exit_code(self) -> int:
        return 1 if self.differ else 0

    @property
    def n_needed(self) -> int | None:
        """Samples per prompt and arm to detect the distortion at the first informative position."""
        for t in self.positions:
            if t.n_needed is not None:
                return t.n_needed
        return None

    def verdict(self) -> str:
        if self.differ:
            return (f"the distributions differ (p = {self.p_value:.3g} < alpha {self.alpha:g}): "
                    f"{self.labels[1]} is not lossless against {self.labels[0]}")
        n, have = self.n_needed, min(self.samples_a, self.samples_b)
        if n is not None and have < n:
            return (f"no difference detected (p = {self.p_value:.3g}), but {have} samples per prompt and arm "
                    f"cannot rule out a distortion of {self.distortion:g}: {n} would")
        return f"no difference detected (p = {self.p_value:.3g} >= alpha {self.alpha:g})"

    def to_dict(self) -> dict:
        return {"p_value": self.p_value, "alpha": self.alpha, "differ": self.differ,
                "distortion": self.distortion, "n_needed": self.n_needed, "prompts": self.prompts,
                "samples_a": self.samples_a, "samples_b": self.samples_b, "labels": list(self.labels),
                "verdict": self.verdict(), "notes": self.notes,
                "positions": [t.__dict__ for t in self.positions]}

    def text(self) -> str:
        a, b = self.labels
        lines = [f"lossless: {a} vs {b}, {self.prompts} prompt(s), {self.samples_a} / {self.samples_b} samples "
                 f"per prompt", "position  dof   chi2      p-value   n to detect"]
        for t in self.positions:
            lines.append(f"{t.position:>8}  {t.dof:>3}  {t.chi2:>8.2f}  {t.p_value:>8.3g}   "
                         f"{t.n_needed if t.n_needed is not None else '-'}")
        lines += [f"combined (Bonferroni over {sum(t.dof > 0 for t in self.positions)} positions): "
                  f"p = {self.p_value:.3g}",
                  f"n to detect: samples per prompt and arm for power {POWER} against {self.distortion:g} of "
                  "probability moved between the two most likely tokens", *self.notes, self.verdict()]
        return "\n".join(lines)


def _categories(outs: list[list[int]], j: int) -> Counter:
    return Counter(o[j] if len(o) > j else ENDED for o in outs)


def _table(ca: Counter, cb: Counter) -> tuple[np.ndarray, np.ndarray]:
    """2 x C counts with rare categories pooled; also the pooled probabilities."""
    cats = sorted(set(ca) | set(cb))
    tot = {c: ca[c] + cb[c] for c in cats}
    keep = [c for c in cats if tot[c] >= MIN_POOLED]
    rare = [c for c in cats if tot[c] < MIN_POOLED]
    rows = [[ca[c] for c in keep], [cb[c] for c in keep]]
    if rare:
        rows[0].append(sum(ca[c] for c in rare))
        rows[1].append(sum(cb[c] for c in rare))
    t = np.asarray(rows, dtype=np.float64)
    t = t[:, t.sum(0) > 0]
    return t, t.sum(0) / max(t.sum(), 1)


def chi2_homogeneity(t: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic and dof of a 2 x C table (0, 0 when it holds no information)."""
    if t.shape[1] < 2 or (t.sum(1) == 0).any():
        return 0.0, 0
    from scipy.stats import chi2_contingency
    res = chi2_contingency(t, correction=False)
    return float(res.statistic), int(res.dof)


def n_needed(lam1: float, dof: int, alpha: float, power: float = POWER) -> int | None:
    """Smallest n with P(noncentral chi2(dof, n * lam1) > critical) >= power."""
    if lam1 <= 0 or dof <= 0:
        return None
    from scipy.stats import chi2, ncx2
    crit = chi2.isf(alpha, dof)
    ok = lambda n: ncx2.sf(crit, dof, n * lam1) >= power
    hi = 1
    while not ok(hi):
        hi *= 2
        if hi > 1 << 40:
            return None
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def compare(a: dict, b: dict, positions: int, *, alpha: float = 0.01, distortion: float = 0.05,
            labels=("A", "B")) -> LosslessResult:
    """Two arms {prompt key: [output token lists]} -> the per-position test.

    Output lists start with the prefill's token (index 0, not tested); positions
    1..`positions` are tested. Prompts present in only one arm are ignored (noted).
    Raises ValueError when no prompt is shared or a parameter is out of range.
    """
    if positions < 1:
        raise ValueError(f"--positions must be at least 1 (got {positions})")
    if not 0 < alpha < 1:
        raise ValueError(f"--alpha must be in (0, 1) (got {alpha})")
    if not 0 < distortion < 1:
        raise ValueError(f"--distortion must be in (0, 1) (got {distortion})")
    keys = [k for k in a if k in b and a[k] and b[k]]
    if not keys:
        raise ValueError("the two arms share no prompt: nothing to compare")
    notes = []
    only = (len(a) - len(keys)) + (len(b) - len(keys))
    if only:
        notes.append(f"{only} prompt(s) present in one arm only were left out")
    tests = []
    m = positions
    for j in range(1, positions + 1):
        stat, dof, lam1 = 0.0, 0, 0.0
        for k in keys:
            t, pooled = _table(_categories(a[k], j), _categories(b[k], j))
            s, d = chi2_homogeneity(t)
            stat, dof = stat + s, dof + d
            if len(pooled) >= 2:
                top = np.sort(pooled)[::-1][:2]
                lam1 += distortion ** 2 / 2 * (1 / top[0] + 1 / top[1])
        from scipy.stats import chi2
        p = float(chi2.sf(stat, dof)) if dof > 0 else 1.0
        tests.append(PositionTest(j, round(stat, 4), dof, p, n_needed(lam1, dof, alpha / m)))
    informative = [t for t in tests if t.dof > 0]
    p_all = min(1.0, min((t.p_value for t in informative), default=1.0) * max(len(informative), 1))
    if not informative:
        notes.append("every position holds a single token in both arms: no information")
    return LosslessResult(tests, p_all, alpha, distortion, len(keys), min(len(a[k]) for k in keys),
                          min(len(b[k]) for k in keys), tuple(labels), notes)


# ----------------------------------------------------------------- trace datasets


def samples_from_dataset(path) -> tuple[dict, dict]:
    """{prompt key: [output token lists]} and the sampling parameters of a dataset.

    Raises InputError (one line) for a path without runs, runs without a requests
    table, or runs that did not sample (no config.sampling with temperature > 0) or
    sampled with different parameters.
    """
    import pyarrow.parquet as pq

    from specaudit.trace.safe_io import InputError
    from specaudit.trace.schema import discover
    out: dict = defaultdict(list)
    params = None
    for rf in discover([path]):
        if rf.problems:
            raise InputError(rf.problems[0].path, rf.problems[0].reason)
        sp = ((rf.manifest or {}).get("config") or {}).get("sampling") or {}
        if not (isinstance(sp.get("temperature"), (int, float)) and sp["temperature"] > 0):
            raise InputError(rf.run_dir, "this run did not sample (run.json has no config.sampling with "
                                         "temperature > 0): lossless compares sampled outputs")
        key = {k: sp.get(k) for k in ("temperature", "top_p", "top_k")}
        if params is not None and key != params:
            raise InputError(rf.run_dir, f"runs of one dataset sample differently: {params} and {key}")
        params = key
        if not rf.request_files:
            raise InputError(rf.run_dir, "no requests table (the run did not finish)")
        for rq in rf.request_files:   # requests.parquet, or a running run's parts
            try:
                t = pq.read_table(rq, columns=["prompt_tokens", "output_tokens"])
            except Exception as e:  # not Parquet, a column missing
                raise InputError(rq, f"cannot read: {str(e).splitlines()[0]}") from None
            for pr, o in zip(t.column("prompt_tokens").to_pylist(), t.column("output_tokens").to_pylist()):
                if o is not None:
                    out[json.dumps(pr)].append(list(o))
    return dict(out), params


def compare_datasets(a_path, b_path, positions: int, **kw) -> LosslessResult:
    """Two trace datasets with sampled output (same sampling parameters) -> the test."""
    from specaudit.trace.safe_io import InputError
    a, pa_ = samples_from_dataset(a_path)
    b, pb_ = samples_from_dataset(b_path)
    if pa_ != pb_:
        raise InputError(b_path, f"the datasets sample with different parameters: {pa_} and {pb_}; "
                                 "a difference would be expected")
    return compare(a, b, positions, labels=(str(a_path), str(b_path)), **kw)


# --------------------------------------------------------- the reference runtime


def run_reference(*, temperature: float, top_p: float = 1.0, top_k=None, algo="chain", budget=7,
                  topk=1, samples=400, num_prompts=2, positions=8, seed=0, concurrency=32,
                  inject=None, models=None, device="cpu", alpha=0.01, distortion=0.05,
                  prompt_len=48) -> LosslessResult:
    """Plain sampling (A) against speculative sampling (B) on the embedded models.

    Each of `num_prompts` held-out prompts runs `samples` times in each arm (independent
    requests; the arms use generators seeded `seed` and `seed + 1`), `positions + 1`
    tokens each. `inject` runs arm B with a runtime fault. Prompts are cut to their last
    `prompt_len` tokens: a prefill per sample is most of the cost, and the test needs
    many samples, not long contexts.
    """
    import torch

    from specaudit.model import EOS_ID, default_models
    from specaudit.runtime.engine import Request, SpecConfig, SpecEngine, sample_generate
    from specaudit.runtime.faults import get_fault
    from specaudit.runtime.sampling import SamplingParams
    from specaudit.tokenizer import default_prompts, encode

    sp = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    sp.validate()
    if sp.greedy:
        raise ValueError("--temperature must be > 0: greedy runs are lossless by equality (run --oracle)")
    for name, v, lo in (("--samples", samples, 2), ("--num-prompts", num_prompts, 1),
                        ("--concurrency", concurrency, 1)):
        if v < lo:
            raise ValueError(f"{name} must be at least {lo} (got {v})")
    get_fault(inject)
    target, drafter, _ = models if models is not None else default_models(device, torch.float32)
    texts = default_prompts()
    k0 = seed % len(texts)
    texts = (texts[k0:] + texts[:k0])[:num_prompts]
    if prompt_len < 1:
        raise ValueError(f"--prompt-len must be at least 1 (got {prompt_len})")
    toks = [encode(t)[-prompt_len:] for t in texts]
    reps = [t for t in toks for _ in range(samples)]
    max_new = positions + 1
    cfg = SpecConfig(algo=algo, budget=budget, topk=topk, max_new_tokens=max_new, concurrency=concurrency,
                     eos_id=EOS_ID, fault=inject,
                     sampling=SamplingParams(temperature, top_p, top_k, seed + 1))
    engine = SpecEngine(target, drafter, cfg, device=device)   # validates (fault needs sampling, ...)
    plain, _ = sample_generate(target, reps, max_new, EOS_ID, sp, concurrency, device)
    reqs = [Request(request_id=str(i), prompt=t, max_new_tokens=max_new) for i, t in enumerate(reps)]
    engine.run(reqs)
    a, b = defaultdict(list), defaultdict(list)
    for t, o in zip(reps, plain):
        a[json.dumps(t)].append(o)
    for r in reqs:
        b[json.dumps(r.prompt)].append(r.output)
    label = f"speculative {algo} b{budget}" + (f" k{topk}" if algo == "tree" else "") + \
            (f" with {inject}" if inject else "")
    res = compare(dict(a), dict(b), positions, alpha=alpha, distortion=distortion,
                  labels=("plain sampling", label))
    res.notes.insert(0, f"T = {temperature:g}, top_p = {top_p:g}, top_k = {top_k if top_k else 'off'}; "
                        "mean accepted depth of the speculative arm "
                        f"{engine.metrics.reported(1.0)['mean_accepted_depth']:.2f}")
    return res
