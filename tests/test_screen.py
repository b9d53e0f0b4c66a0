"""The clean-batch screen (invariants/screen.py) changes nothing a check reports: the same
findings, run sums and carried per-request state with it as without it (SPECAUDIT_SCREEN=0,
every batch through StepFrame, the definition), on every rule's pass and fail fixture and
on faults injected at random into valid runs; and it does screen the clean batches (else
the equalities above would hold for nothing).

compiled.MIN_ROWS is patched to 0 so that small batches are screened, and pool.POOL_RUN_BYTES
to 0 so that a small run is checked alone (pooled tiny runs are checked by a StepFrame of
the pool, and a run with a finding there is checked alone, screened)."""
from __future__ import annotations

import numpy as np
import pytest
import specaudit.invariants.screen as screen
from specaudit.invariants import all_rules, compiled
from specaudit.invariants.carry import Carry
from specaudit.invariants.fixtures import FixtureRun
from specaudit.invariants.frame import StepFrame

from specaudit.audit.check import check_paths, pool
from specaudit.audit.check.core import RunSums, check_group, run_config
from specaudit.trace.schema import SAMPLING_COLUMNS
from specaudit.trace.synth import synth_run_rows

TRACE_RULES = [r for r in all_rules() if r.scope != "source"]
STEP_CODES = sorted(r.code for r in TRACE_RULES if r.scope == "step")


@pytest.fixture
def small_batches(monkeypatch):
    """Every batch is screened unless SPECAUDIT_SCREEN=0; a count of the batches screened."""
    monkeypatch.setattr(compiled, "MIN_ROWS", 0)
    monkeypatch.setattr(pool, "POOL_RUN_BYTES", 0)   # each run checked alone (check_group), not pooled
    monkeypatch.delenv(compiled.ENV, raising=False)
    seen = {"screened": 0, "declined": 0}
    real = screen.screen_batch

    def counted(*a, **k):
        got = real(*a, **k)
        seen["screened" if got is not None else "declined"] += 1
        return got

    import specaudit.audit.check.core as core
    monkeypatch.setattr(core, "screen_batch", counted)
    return monkeypatch, seen


def _both(mp, fn):
    """fn() with the screen off, then on."""
    out = []
    for env in ("0", "1"):
        mp.setenv(screen.ENV, env)
        out.append(fn())
    return out


def _findings(res):
    return [(f.code, f.request_id, f.step, f.message) for f in res.findings], dict(res.counts), res.steps


def test_every_step_rule_is_screened_for():
    """A new step rule must be added to SCREENED (and to the screen's C, if it can fire on
    a batch the screen passes), or every check would run without the screen."""
    assert STEP_CODES == sorted(screen.SCREENED)


@pytest.mark.parametrize("rule", TRACE_RULES, ids=lambda r: r.code)
@pytest.mark.parametrize("which", ["pass", "fail"])
def test_fixture_findings_equal(rule, which, small_batches, tmp_path):
    """Every rule's pass and fail fixture: the same findings with the screen as without."""
    mp, seen = small_batches
    run = FixtureRun.make(rule.fixture_algo)
    (rule.passing if which == "pass" else rule.fail)(run)
    path = run.write(tmp_path / which)
    off, on = _both(mp, lambda: _findings(check_paths([path], batch_rows=16)))
    assert on == off
    if which == "fail":
        assert rule.code in off[1]


@pytest.mark.parametrize("algo", ["chain", "tree"])
def test_clean_batches_are_screened(algo, small_batches, tmp_path):
    """A valid run's batches pass the screen (all of them: none holds a finding)."""
    mp, seen = small_batches
    path = FixtureRun.make(algo).write(tmp_path / algo)
    mp.setenv(screen.ENV, "1")
    res = check_paths([path], batch_rows=16)
    assert not res.counts and res.steps > 0
    assert seen["screened"] >= res.steps // 16 and seen["declined"] == 0


DIAGNOSTIC = ("draft_logprob", "target_margin")


def _batches(table, rows=16, diagnostics=False):
    """A steps table in batches of `rows` as the checker reads them: strings
    dictionary-encoded per batch (as Parquet row groups give them), the diagnostic lists
    left out unless asked (a clean file's metadata settles them: stream.proven_diagnostics)."""
    import pyarrow as pa
    t = table if diagnostics else table.drop_columns([c for c in DIAGNOSTIC if c in table.schema.names])
    out = []
    for lo in range(0, t.num_rows, rows):
        part = t.slice(lo, rows).combine_chunks()
        cols = [part.column(n).combine_chunks() for n in part.schema.names]
        cols = [c.dictionary_encode() if n in ("run_id", "request_id", "algo") else c
                for n, c in zip(part.schema.names, cols)]
        out.append(pa.RecordBatch.from_arrays(cols, names=part.schema.names))
    return out


@pytest.mark.parametrize("algo", ["chain", "tree"])
def test_carry_and_sums_equal(algo, small_batches):
    """The screen folds a batch into the carry and the run sums exactly as StepFrame's
    finish_carry and RunSums.add do: every field of every request, every counter, the
    depth histogram."""
    mp, _ = small_batches
    st, _, man = synth_run_rows(40, algo=algo, seed=3, concurrency=6, run_id="r")
    eos, max_new, _ = run_config(man)
    batches = _batches(st, rows=64)
    got = []
    for use in (False, True):
        carry, sums = Carry(), RunSums()
        for b in batches:
            g = screen.screen_batch(b, run_id="r", carry=carry, eos_id=eos, max_new_tokens=max_new) if use else None
            if use:
                assert g is not None, "a valid batch must pass the screen"
                sums.add_sums(*g, "all")
                continue
            f = StepFrame(b, run_id="r", carry=carry, eos_id=eos, max_new_tokens=max_new)
            sums.add(f, "all")
            f.finish_carry()
        got.append((carry, sums))
    (c0, s0), (c1, s1) = got
    assert c0.n == c1.n and c0.names[: c0.n] == c1.names[: c1.n]
    for k in Carry.FIELDS:
        assert np.array_equal(c0.view(k), c1.view(k)), k
    assert s0.total == s1.total and s0.parts == s1.parts
    assert np.array_equal(np.trim_zeros(s0.depth_hist, "b"), np.trim_zeros(s1.depth_hist, "b"))


def test_declined_batch_leaves_the_carry_as_it_was(small_batches):
    """A batch that fails the screen part-way is put back: the carry after it equals the
    carry before it, field by field."""
    mp, _ = small_batches
    st, _, man = synth_run_rows(20, seed=4, concurrency=4, run_id="r")
    eos, max_new, _ = run_config(man)
    b0, b1 = _batches(st, rows=64)[:2]
    carry = Carry()
    assert screen.screen_batch(b0, run_id="r", carry=carry, eos_id=eos, max_new_tokens=max_new) is not None
    before = {k: carry.view(k).copy() for k in Carry.FIELDS}
    import pyarrow as pa
    cl = b1.schema.names.index("commit_len")
    bad = b1.column(cl).to_numpy().copy()
    bad[-1] += 1                                         # the last row breaks SA306: the rest was folded
    b1 = b1.set_column(cl, "commit_len", pa.array(bad, pa.int32()))
    assert screen.screen_batch(b1, run_id="r", carry=carry, eos_id=eos, max_new_tokens=max_new) is None
    for k in Carry.FIELDS:
        assert np.array_equal(before[k], carry.view(k)[: len(before[k])]), k


def test_partials_equal(small_batches):
    """check_group's partial (what run rules read) is the same with the screen as without."""
    mp, seen = small_batches
    st, rq, man = synth_run_rows(30, algo="tree", seed=5, run_id="r")
    from specaudit.audit.check.result import CheckResult
    off, on = _both(mp, lambda: check_group(_batches(st), run_id="r", manifest=man, rules=TRACE_RULES,
                                            result=CheckResult(), requests=rq.to_batches(max_chunksize=16)))
    assert on == off and seen["screened"] > 0


# ---------------------------------------------- batch by batch, one row each

STEP_RULES = [r for r in TRACE_RULES if r.scope == "step"]


def _screen_never_passes_a_finding(table, manifest, rows: int = 1, diagnostics=False) -> tuple[int, set]:
    """Batch by batch (`rows` rows each) in a check's order, the carry evolved by StepFrame
    (the definition): before each batch, the screen on the same carry must refuse it when
    StepFrame's step rules find anything in it, and fold it as StepFrame does when it
    passes it. -> (batches screened, codes StepFrame found)."""
    from specaudit.audit.check.core import emit_hits
    from specaudit.audit.check.result import CheckResult
    eos, max_new, conv = run_config(manifest)
    carry, screened, found = Carry(), 0, set()
    run_id = manifest["run_id"]
    for i, b in enumerate(_batches(table, rows, diagnostics)):
        saved = {k: getattr(carry, k).copy() for k in Carry.FIELDS}
        got = screen.screen_batch(b, run_id=run_id, carry=carry, eos_id=eos, max_new_tokens=max_new)
        after = {k: carry.view(k).copy() for k in Carry.FIELDS}
        for k, v in saved.items():                       # the definition from the same carry
            setattr(carry, k, v)
        f = StepFrame(b, run_id=run_id, carry=carry, eos_id=eos, max_new_tokens=max_new, manifest=manifest,
                      conventions=conv)
        res = CheckResult()
        for rule in STEP_RULES:
            emit_hits(rule, rule.check(f), f, res, kind="step")
        f.finish_carry()
        found |= set(res.counts)
        if got is not None:
            screened += 1
            assert not res.counts, f"batch {i}: the screen passed it, StepFrame found {dict(res.counts)}"
            for k in Carry.FIELDS:
                assert np.array_equal(after[k], carry.view(k)), (i, k)
    return screened, found


@pytest.mark.parametrize("rule", STEP_RULES, ids=lambda r: r.code)
@pytest.mark.parametrize("algo", ["chain", "tree"])
def test_screen_refuses_every_step_finding(rule, algo, small_batches):
    """Every step rule's fail fixture, on a chain run and on a tree run where it applies,
    one row per batch: no row with a finding passes the screen, and the rows without one do
    (a row after a fault may be refused too: its request's carried state is broken)."""
    run = FixtureRun.make(algo)
    try:
        rule.fail(run)
    except (LookupError, KeyError, IndexError, ValueError):
        return   # this fixture needs the other shape (its own algo's case is run too)
    st, _ = run.tables()
    diagnostics = rule.code == "SA109"   # its fault is in a diagnostic list: read, not settled
    screened, found = _screen_never_passes_a_finding(st, run.manifest, diagnostics=diagnostics)
    if rule.fixture_algo == algo:
        assert rule.code in found
    if diagnostics or set(SAMPLING_COLUMNS) & set(st.schema.names):
        assert screened == 0                # batches with those columns are never screened
    else:
        assert screened >= len(run.steps) // 2   # the clean rows around the fault were screened


def _topk_below_children(run):
    s = run.steps_where(lambda s: max(s["parents"].count(i) for i in range(len(s["parents"]))) >= 3)[0]
    s["topk"] = 2                                        # a node has 3 children


def _chain_topk_zero(run):
    run.steps_where(lambda s: len(s["parents"]) > 1)[3]["topk"] = 0


def _last_position(run):
    run.steps[7]["positions"][-1] += 1                    # one node past the root


def _first_step_missing(run):
    s0 = run.step(run.steps[0]["request_id"], 0)
    run.steps.remove(s0)                                  # the request starts at step 1


def _path_skips_a_node(run):
    """A path [0, v] to a leaf that is not the root's child, its token the root's argmax
    (so that only the walk is wrong: a leaf leaves the path maximal), counters and commit
    made to fit it."""
    leaf = lambda s, i: s["parents"][i] not in (-1, 0) and i not in s["parents"]
    s = run.steps_where(lambda s: not s["finished"] and any(leaf(s, i) for i in range(len(s["parents"]))))[0]
    v = next(i for i in range(len(s["parents"])) if leaf(s, i))
    s["node_tokens"][v] = s["target_argmax"][0]
    s["accepted_path"], s["accepted_depth"] = [0, v], 1
    s["committed_tokens"], s["commit_len"] = [s["node_tokens"][v], s["target_argmax"][v]], 2


def _commit_repeats_bonus(run):
    s = run.steps_where(lambda s: not s["finished"] and s["committed_tokens"][-1] != run.eos_id)[0]
    s["committed_tokens"].append(s["committed_tokens"][-1])   # the bonus twice: one past the path
    s["commit_len"] += 1


def _path_starts_off_root(run):
    s = run.steps_where(lambda s: not s["finished"] and s["accepted_depth"] == 0)[0]
    s["accepted_path"] = [1]                              # a one-node path at the root's child
    s["committed_tokens"] = [s["target_argmax"][1]]


def _limit_below_outputs(run):
    run.manifest["config"]["max_new_tokens"] = 5          # EOS-finished requests end past it


TARGETED = [("tree", _topk_below_children, "SA105"), ("chain", _chain_topk_zero, "SA105"),
            ("chain", _last_position, "SA201"), ("tree", _last_position, "SA201"),
            ("chain", _first_step_missing, "SA401"), ("tree", _path_skips_a_node, "SA303"),
            ("chain", _limit_below_outputs, "SA311"), ("tree", _limit_below_outputs, "SA311"),
            ("chain", _commit_repeats_bonus, "SA301"), ("chain", _path_starts_off_root, "SA303")]


@pytest.mark.parametrize("algo,fault,code", TARGETED, ids=lambda x: getattr(x, "__name__", x))
def test_screen_refuses_targeted_faults(algo, fault, code, small_batches):
    """Faults that break one condition of the screen where no other does (the rules'
    fixtures break several at once for some): the screen refuses each such row."""
    run = FixtureRun.make(algo)
    fault(run)
    st, _ = run.tables()
    screened, found = _screen_never_passes_a_finding(st, run.manifest)
    assert code in found and screened > 0


# ------------------------------------------------------------- injected faults

_SCALARS = ("step", "seq_len", "budget", "topk", "accepted_depth", "commit_len")
_LISTS = ("node_tokens", "parents", "positions", "target_argmax", "accepted_path", "committed_tokens")


def _inject(run: FixtureRun, rng) -> str:
    """One random fault in one random step row: a counter or a list entry off by one, a
    list entry dropped or repeated, the finished flag flipped, the mask hash changed."""
    s = run.steps[int(rng.integers(len(run.steps)))]
    kind = int(rng.integers(5))
    if kind == 0:
        c = _SCALARS[int(rng.integers(len(_SCALARS)))]
        s[c] += int(rng.choice([-1, 1]))
    elif kind in (1, 2, 3):
        c = _LISTS[int(rng.integers(len(_LISTS)))]
        v = s[c]
        if not v:
            return "empty"
        i = int(rng.integers(len(v)))
        if kind == 1:
            v[i] += int(rng.choice([-1, 1]))
        elif kind == 2:
            del v[i]
        else:
            v.insert(i, v[i])
        c = f"{c}[{i}]"
    elif rng.random() < 0.5:
        s["finished"] = not s["finished"]
        c = "finished"
    else:
        s["mask_hash"] ^= 1 << int(rng.integers(64))
        c = "mask_hash"
    return f"request {s['request_id']} step {s['step']} {c} (fault {kind})"


@pytest.mark.parametrize("algo", ["chain", "tree"])
def test_injected_faults_found_the_same(algo, small_batches, tmp_path):
    """Faults injected at random into a valid run: every fault a full check finds, the
    screened check finds too, with the same findings (seeded: the same faults each run)."""
    mp, _ = small_batches
    rng = np.random.default_rng(20261203 + (algo == "tree"))
    found = 0
    for i in range(30):
        run = FixtureRun.make(algo)
        what = _inject(run, rng)
        path = run.write(tmp_path / f"{algo}-{i}")
        off, on = _both(mp, lambda p=path: _findings(check_paths([p], batch_rows=16)))
        assert on == off, what
        found += bool(off[1])
    assert found >= 20   # the faults are real: most change what the check reports
