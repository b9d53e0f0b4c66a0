"""PromSink and the inline invariant rules, without a server.

Clean rows come from specaudit.synth (contract-valid by construction) and from the
runtime; each rule gets a mutated row that must trip it, on that row only.
"""
from __future__ import annotations

import copy

import numpy as np
import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specaudit.trace.inline_rules import INLINE_CODES, INLINE_RULES, inline_violations
from specaudit.trace.prom_sink import PromSink
from specaudit.trace.schema import STEPS_SCHEMA, tree_depths
from specaudit.trace.synth import synth_run_rows

CODE = {name: code for code, name, _ in INLINE_RULES}


def synth_batch(algo="chain", seed=0, **kw) -> pa.RecordBatch:
    steps, _, _ = synth_run_rows(n_requests=12, algo=algo, seed=seed, **kw)
    return steps.combine_chunks().to_batches()[0]


def rows_to_batch(rows: list[dict]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=STEPS_SCHEMA)


@pytest.mark.parametrize("algo,ragged", [("chain", False), ("chain", True), ("tree", False), ("tree", True)])
def test_clean_rows_break_no_rule(algo, ragged):
    for seed in range(3):
        b = synth_batch(algo, seed, ragged=ragged)
        v = inline_violations(b, eos_id=0)
        assert set(v) == set(INLINE_CODES)
        assert {c: int(m.sum()) for c, m in v.items() if m.any()} == {}


def _pick(rows, pred):
    for i, r in enumerate(rows):
        if pred(r):
            return i
    raise AssertionError("no row fits the mutation")


def _deep(r):
    return not r["finished"] and len(r["accepted_path"]) >= 3


def _set(lst_key, i, f):
    """Mutation: r[lst_key][i] = f(r) (i may be negative)."""
    return lambda r: r[lst_key].__setitem__(i, f(r))


def _drop_last_accepted(r):
    r["accepted_path"] = r["accepted_path"][:-1]
    r["accepted_depth"] -= 1
    r["commit_len"] -= 1
    r["committed_tokens"] = r["committed_tokens"][:-1]


def _bonus_is_eos(r):
    """The target's argmax at the path's last node becomes EOS (0), and so the bonus."""
    r["target_argmax"][r["accepted_path"][-1]] = 0
    r["committed_tokens"][-1] = 0


def _max_kids(r):
    return max(np.bincount(np.array(r["parents"][1:]), minlength=1).max(initial=0), 1)


# (rule name, row picker, mutation). Each mutation is the smallest lie that breaks the rule.
MUTATIONS = [
    ("node-list-lengths", lambda r: True, lambda r: r.update(parents=r["parents"][:-1])),
    ("node-count", lambda r: len(r["node_tokens"]) >= 3, lambda r: r.update(budget=len(r["node_tokens"]) - 2)),
    ("root-parent", lambda r: True, _set("parents", 0, lambda r: 0)),
    ("parent-precedes", lambda r: len(r["parents"]) >= 2, _set("parents", 1, lambda r: 1)),
    ("topk-children", lambda r: True, lambda r: r.update(topk=_max_kids(r) - 1)),
    ("chain-shape", lambda r: len(r["parents"]) >= 3,
     lambda r: (r["parents"].__setitem__(2, 0), r.update(algo="chain", topk=1))),
    ("positions", lambda r: len(r["positions"]) > 1, _set("positions", 1, lambda r: r["positions"][1] + 1)),
    ("mask-hash", lambda r: True, lambda r: r.update(mask_hash=r["mask_hash"] ^ 1)),
    # the seed case: the drafted count reported as depth and 2 as commit
    ("commit-len-vs-depth", _deep, lambda r: r.update(commit_len=2, committed_tokens=r["committed_tokens"][:2])),
    ("depth-vs-path", lambda r: True, lambda r: r.update(accepted_depth=r["accepted_depth"] + 1)),
    ("path-walk", lambda r: True, lambda r: r.update(accepted_path=[1] + r["accepted_path"][1:])),
    ("path-walk", _deep, lambda r: r.update(accepted_path=[0] + r["accepted_path"][2:])),
    ("path-matches-argmax", _deep,
     lambda r: r["node_tokens"].__setitem__(r["accepted_path"][1],
                                            (r["node_tokens"][r["accepted_path"][1]] + 1) % 256)),
    ("path-maximal", lambda r: not r["finished"] and len(r["accepted_path"]) >= 2, _drop_last_accepted),
    ("commit-len-vs-tokens", lambda r: True, lambda r: r.update(commit_len=r["commit_len"] + 1)),
    ("committed-tokens", lambda r: True, _set("committed_tokens", -1, lambda r: (r["committed_tokens"][-1] % 255) + 1)),
    ("commit-ends-at-eos", _deep, _set("committed_tokens", 0, lambda r: 0)),
    ("eos-finishes", lambda r: not r["finished"], lambda r: _bonus_is_eos(r)),
    ("counters-sign", lambda r: True, lambda r: r.update(accepted_depth=-1)),
]


@pytest.mark.parametrize("algo", ["chain", "tree"])
@pytest.mark.parametrize("name,pick,mutate", MUTATIONS, ids=[f"{m[0]}-{i}" for i, m in enumerate(MUTATIONS)])
def test_each_rule_catches_its_lie_on_that_row_only(algo, name, pick, mutate):
    rows = synth_batch(algo, seed=3, eos_frac=0.0).to_pylist()
    i = _pick(rows, pick)
    rows = copy.deepcopy(rows)
    mutate(rows[i])
    v = inline_violations(rows_to_batch(rows), eos_id=0)
    hit = np.flatnonzero(v[CODE[name]])
    assert hit.tolist() == [i], f"{CODE[name]} {name}: rows {hit.tolist()}, expected [{i}]"
    # nothing else in the batch is flagged by any rule
    for code, m in v.items():
        assert not np.delete(m, i).any(), f"{code} fired on an untouched row"


def test_eos_rules_need_eos_id_and_honour_finished():
    rows = copy.deepcopy(synth_batch("chain", seed=4, eos_frac=0.0).to_pylist())
    i = _pick(rows, _deep)
    _bonus_is_eos(rows[i])                         # EOS as the bonus of an unfinished step
    b = rows_to_batch(rows)
    assert np.flatnonzero(inline_violations(b, eos_id=0)[CODE["eos-finishes"]]).tolist() == [i]
    assert not inline_violations(b)[CODE["eos-finishes"]].any()   # EOS unknown: the rule is off
    rows[i]["finished"] = True                     # ... and finished there: legal
    v = inline_violations(rows_to_batch(rows), eos_id=0)
    assert not any(m.any() for m in v.values())


# ----------------------------------------------------------------------- the sink

def samples(registry) -> dict:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_every_series_exported_as_zero_from_the_start():
    reg = CollectorRegistry()
    PromSink(reg, max_depth=8)
    s = samples(reg)
    names = {n for n, _ in s}
    for n in ("specaudit_verify_steps_total", "specaudit_drafted_tokens_total", "specaudit_accepted_tokens_total",
              "specaudit_committed_tokens_total", "specaudit_derived_committed_tokens_total",
              "specaudit_running_requests", "specaudit_estimated_commit_length",
              "specaudit_reported_commit_length", "specaudit_step_duration_seconds_count",
              "specaudit_commit_length_tokens_bucket", "specaudit_accepted_depth_tokens_bucket"):
        assert n in names, n
    for d in range(1, 9):
        assert s[("specaudit_depth_accepted_total", (("depth", str(d)),))] == 0
        assert s[("specaudit_depth_drafted_total", (("depth", str(d)),))] == 0
    for code in INLINE_CODES:
        assert s[("specaudit_invariant_violations_total", (("code", code),))] == 0
    for fr in ("eos", "length", "abort"):
        assert s[("specaudit_requests_total", (("finish_reason", fr),))] == 0
    nonzero = {k: v for k, v in s.items() if v != 0 and not k[0].endswith("_created")}
    assert nonzero == {}
    # one histogram bucket per integer commit length 0..max_depth + 1, then +Inf
    les = sorted(float(dict(lb)["le"]) for (n, lb) in s if n == "specaudit_commit_length_tokens_bucket")
    assert les == [float(i) for i in range(10)] + [float("inf")]


def test_names_follow_prometheus_conventions():
    reg = CollectorRegistry()
    PromSink(reg, max_depth=4)
    # `_created` twins are prometheus_client's (specaudit serve turns them off)
    fams = [f for f in text_string_to_metric_families(generate_latest(reg).decode())
            if not f.name.endswith("_created")]
    allowed_labels = {"depth", "code", "finish_reason", "le", "run_id", "algo", "budget", "topk", "fault", "model",
                      "sink"}   # sink: bounded (prom_sink.SINK_NAMES)
    for f in fams:
        assert f.name.startswith("specaudit_") and ":" not in f.name, f.name
        assert f.type in ("counter", "gauge", "histogram"), (f.name, f.type)   # no summaries
        if f.type == "counter":
            assert all(s.name.endswith("_total") for s in f.samples), f.name
        if "duration" in f.name or "time" in f.name:
            assert f.name.endswith("_seconds"), f.name
        for s in f.samples:
            assert set(s.labels) <= allowed_labels, (f.name, s.labels)          # no per-request labels


@pytest.mark.parametrize("algo", ["chain", "tree"])
def test_counters_equal_sums_over_the_rows(algo):
    steps, reqs, manifest = synth_run_rows(n_requests=12, algo=algo, seed=5, ragged=True)
    reg = CollectorRegistry()
    sink = PromSink(reg)
    sink.open_run(manifest)
    D = sink.max_depth
    assert D == manifest["config"]["budget"] + 1
    for b in steps.to_batches(max_chunksize=7):          # several "forwards"
        sink.write_steps(b)
    for r in reqs.to_pylist():
        sink.write_request(r)
    g = reg.get_sample_value
    d = steps.to_pydict()
    n = np.array([len(x) for x in d["node_tokens"]])
    depth = np.array(d["accepted_depth"])
    commit = np.array(d["commit_len"])
    assert g("specaudit_verify_steps_total") == steps.num_rows
    assert g("specaudit_drafted_tokens_total") == (n - 1).sum()
    assert g("specaudit_accepted_tokens_total") == depth.sum() == g("specaudit_derived_accepted_tokens_total")
    assert g("specaudit_committed_tokens_total") == commit.sum() == g("specaudit_derived_committed_tokens_total")
    assert g("specaudit_generated_tokens_total") == sum(len(o) for o in reqs.column("output_tokens").to_pylist())
    # per depth: reached by the draft (from the parents) and accepted (from the counter)
    reach = np.array([tree_depths(np.array([p]))[0].max() for p in d["parents"]])
    for k in range(1, D + 1):
        assert g("specaudit_depth_drafted_total", {"depth": str(k)}) == (reach >= k).sum()
        assert g("specaudit_depth_accepted_total", {"depth": str(k)}) == (depth >= k).sum()
    # vLLM's identity: accepted tokens = sum over depths of acceptance at that depth
    assert sum(g("specaudit_depth_accepted_total", {"depth": str(k)}) for k in range(1, D + 1)) == depth.sum()
    for c in range(D + 2):
        assert g("specaudit_commit_length_tokens_bucket", {"le": f"{float(c)}"}) == (commit <= c).sum()
    # one duration observation per forward: a run of rows sharing t_start
    forwards = sum(1 + int((np.diff(b.column(b.schema.get_field_index("t_start")).to_numpy()) != 0).sum())
                   for b in steps.to_batches(max_chunksize=7))
    assert g("specaudit_step_duration_seconds_count") == forwards == g("specaudit_verify_forwards_total")
    for code in INLINE_CODES:
        assert g("specaudit_invariant_violations_total", {"code": code}) == 0
    fr = reqs.column("finish_reason").to_pylist()
    for reason in ("eos", "length", "abort"):
        assert g("specaudit_requests_total", {"finish_reason": reason}) == fr.count(reason)


def test_bulk_histogram_update_equals_one_observe_per_value():
    from prometheus_client import Histogram

    from specaudit.trace.prom_sink import DURATION_BUCKETS, _observe
    rng = np.random.default_rng(0)
    vals = np.concatenate([rng.exponential(0.05, 300), list(DURATION_BUCKETS[:4]), [0.0, 99.0]])
    r1, r2 = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("h_seconds", "h", buckets=DURATION_BUCKETS, registry=r1)
    h2 = Histogram("h_seconds", "h", buckets=DURATION_BUCKETS, registry=r2)
    for v in vals:
        h1.observe(float(v))
    _observe(h2, vals)
    s1, s2 = samples(r1), samples(r2)
    for k, v in s1.items():
        if k[0].endswith("_sum"):
            assert s2[k] == pytest.approx(v)
        elif not k[0].endswith("_created"):
            assert s2[k] == v, k


def test_sink_counts_violations_and_tolerates_negative_counters():
    rows = copy.deepcopy(synth_batch("chain", seed=6, eos_frac=0.0).to_pylist())
    rows[0]["accepted_depth"] = -1      # the "empty commit" bug class: a -1 counter
    rows[1]["accepted_depth"] = 7
    rows[1]["commit_len"] = 2
    reg = CollectorRegistry()
    sink = PromSink(reg, max_depth=8)
    sink.write_steps(rows_to_batch(rows))
    g = reg.get_sample_value
    assert g("specaudit_invariant_violations_total", {"code": CODE["counters-sign"]}) == 1
    assert g("specaudit_invariant_violations_total", {"code": CODE["depth-vs-path"]}) == 2
    # the reported counter reflects the lie; the derived one does not
    assert g("specaudit_derived_accepted_tokens_total") == sum(len(r["accepted_path"]) - 1 for r in rows)


@pytest.fixture(scope="module")
def small_run(make_run, tmp_path_factory):
    """small_run(fault, algo) -> the steps of a short traced runtime run, cached."""
    import glob

    import pyarrow.parquet as pq
    cache = {}

    def get(fault, algo):
        if (fault, algo) not in cache:
            kw = dict(algo=algo, budget=7 if algo == "chain" else 12, topk=1 if algo == "chain" else 3)
            res = make_run(out=tmp_path_factory.mktemp("live-rules"), inject=fault, num_prompts=3,
                           max_new_tokens=32, concurrency=3, eos_id=10, **kw)   # newline as EOS: hit mid-commit
            files = sorted(glob.glob(str(res.run_dir / "steps-*.parquet")))
            t = pa.concat_tables([pq.ParquetFile(f).read() for f in files]).combine_chunks()
            cache[(fault, algo)] = (t.to_batches()[0], res.manifest["config"]["eos_id"])
        return cache[(fault, algo)]
    return get


@pytest.mark.parametrize("fault,algo,codes", [
    (None, "chain", set()),
    (None, "tree", set()),
    ("commit-counter", "chain", {"depth-vs-path", "commit-len-vs-depth"}),
    ("bonus-double-count", "chain", {"depth-vs-path"}),
    ("position-off-by-one", "tree", {"positions"}),
    ("causal-mask-on-tree", "tree", {"mask-hash"}),
    ("eos-overcount", "chain", {"commit-ends-at-eos"}),
])
def test_runtime_faults_light_up_live(small_run, fault, algo, codes):
    """The runtime's own faults, recorded through the tracer, trip the inline rules
    (those rules exactly); its clean runs trip none."""
    batch, eos_id = small_run(fault, algo)
    v = inline_violations(batch, eos_id=eos_id)
    fired = {name for code, name, _ in INLINE_RULES if v[code].any()}
    if fault is None:
        assert fired == set(), {c: int(m.sum()) for c, m in v.items() if m.any()}
    else:
        assert codes <= fired, (fault, fired)


@pytest.mark.parametrize("code", INLINE_CODES)
def test_inline_rules_agree_with_the_checker_on_its_own_fixtures(code):
    """Each catalog rule's own failing fixture: the live rules flag exactly the (request,
    step, code) triples that `specaudit check` reports, for every inline code."""
    from specaudit.invariants.fixtures import FixtureRun
    from specaudit.invariants.registry import get_rule

    from specaudit.audit.check import check_tables

    rule = get_rule(code)
    assert rule is not None and rule.name == {c: n for c, n, _ in INLINE_RULES}[code]
    run = FixtureRun.make(getattr(rule, "fixture_algo", None) or "chain")
    rule.fail(run)
    steps, requests = run.tables()
    res = check_tables(steps, requests, run.manifest, select=INLINE_CODES, max_per_code=0)
    want = {(f.code, f.request_id, f.step) for f in res.findings if f.code in INLINE_CODES}
    assert any(c == code for c, _, _ in want), f"the checker's own fixture does not fire {code}"
    b = steps.combine_chunks().to_batches()[0]
    v = inline_violations(b, eos_id=run.eos_id)
    rid, st = b.column(1).to_pylist(), b.column(2).to_pylist()
    got = {(c, rid[i], st[i]) for c, m in v.items() for i in np.flatnonzero(m)}
    assert got == want


def test_fast_exposition_equals_generate_latest():
    """The server's /metrics renderer: byte for byte what prometheus_client writes, also
    with labels (sorted, escaped), histograms with labels, and children added later."""
    from prometheus_client import Counter, Histogram

    from specaudit.trace.prom_exposition import FastExposition
    steps, reqs, manifest = synth_run_rows(n_requests=12, algo="tree", seed=1)
    reg = CollectorRegistry()
    sink = PromSink(reg)
    fx = FastExposition(reg)
    def text(data: bytes) -> str:
        return "\n".join(ln for ln in data.decode().splitlines() if "_created" not in ln)
    want = lambda: text(generate_latest(reg))
    got = lambda: text(fx.render())
    assert got() == want()
    sink.open_run(manifest)                      # a labelled child appears (run_info)
    for b in steps.to_batches(max_chunksize=5):
        sink.write_steps(b)
    for r in reqs.to_pylist():
        sink.write_request(r)
    sink.set_load(3, 1)
    h = Histogram("x_seconds", 'odd "doc"\\ here', ["zone", "app"], buckets=(0.5, 1.0), registry=reg)
    h.labels(zone='a"b\\c\nd', app="z").observe(0.7)
    Counter("y", "y", ["k"], registry=reg).labels(k="v").inc(2.5)
    assert got() == want()
    assert fx.render().decode().count("\n") > 200


def test_fast_exposition_reuses_lines_only_while_values_stand():
    """Renders reuse a series' formatted line between updates; every kind of update (inc,
    set to the same or a new value, NaN, an observation of 0 that moves a bucket but not
    the sum, a new child) still shows on the next render, byte for byte as generate_latest."""
    from prometheus_client import Counter, Gauge, Histogram

    from specaudit.trace.prom_exposition import FastExposition
    reg = CollectorRegistry()
    c = Counter("a", "a", registry=reg)
    g = Gauge("b", "b", registry=reg)
    h = Histogram("c_tokens", "c", buckets=(0.0, 1.0, 2.0), registry=reg)
    lab = Counter("d", "d", ["k"], registry=reg)
    fx = FastExposition(reg)
    text = lambda data: "\n".join(ln for ln in data.decode().splitlines() if "_created" not in ln)
    first = fx.render()
    assert text(first) == text(generate_latest(reg))
    assert fx.render() == first                        # nothing moved: the same bytes
    steps = [lambda: c.inc(), lambda: g.set(5), lambda: g.set(5.0), lambda: g.set(float("nan")),
             lambda: g.set(float("nan")), lambda: g.set(-1), lambda: h.observe(0.0), lambda: h.observe(0.0),
             lambda: h.observe(1.5), lambda: lab.labels(k="x").inc(3), lambda: lab.labels(k="x").inc(0.5)]
    for i, step in enumerate(steps):
        step()
        assert text(fx.render()) == text(generate_latest(reg)), i
    assert 'c_tokens_bucket{le="0.0"} 2.0' in fx.render().decode()


def test_fast_exposition_rereads_a_sink_only_after_it_wrote():
    """The sink's series are re-read only when its generation moved; every write path
    (steps, requests, sink errors, load, commit lengths) moves it, so the text always
    equals generate_latest's."""
    from types import SimpleNamespace

    from specaudit.trace.prom_exposition import FastExposition
    steps, reqs, manifest = synth_run_rows(n_requests=6, algo="chain", seed=3)
    reg = CollectorRegistry()
    sink = PromSink(reg)
    fx = FastExposition(reg)
    text = lambda data: "\n".join(ln for ln in data.decode().splitlines() if "_created" not in ln)
    same = lambda: text(fx.render()) == text(generate_latest(reg))
    sink.open_run(manifest)
    assert same()
    g0, g = sink.generation(0), sink.generation(1)
    sink.set_load(2, 0)                            # the server's gauges: their own group
    assert sink.generation(1) > g and sink.generation(0) == g0 and same()
    g = sink.generation(1)
    sink.set_load(2, 0)                            # unchanged: no new generation, same text
    assert sink.generation(1) == g and same()
    for b in steps.to_batches(max_chunksize=7):
        sink.write_steps(b)
        assert same()
    for r in reqs.to_pylist():
        sink.write_request(r)
        assert same()
    sink.sink_error("parquet")
    assert same()
    sink.set_commit_lengths(3.5, SimpleNamespace(value=3.4, low=3.1, high=3.7))
    assert same()
    sink.set_load(0, 0)
    assert same() and 'specaudit_running_requests 0.0' in fx.render().decode()
