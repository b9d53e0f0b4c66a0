"""Shared fixtures. TRITON_INTERPRET must be set before any kernel is defined."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
# pytest caches each test module with its asserts rewritten (tests/__pycache__/*-pytest-*.pyc)
# only where bytecode may be written; where PYTHONDONTWRITEBYTECODE is set (this CI machine sets
# it) every xdist worker rewrote all of tests/ on every run: about 8 s of a core each, a quarter of
# the suite's start. The test command writes bytecode anyway (scripts/test.sh's compileall line);
# this lets the first worker that rewrites a module keep it for the others and the next run.
sys.dont_write_bytecode = False
# One intra-op thread in tests and in the subprocesses they start (servers, CLI runs):
# decode-sized ops on a tiny model gain nothing from more, and oversubscribed OpenMP
# threads spin and slow every process on a 2-core machine by an order of magnitude.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import contextlib
import json
from pathlib import Path

import pytest
import torch
from live_procs import worker_core

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
# vLLM's CPU worker binds its thread to core 0 unless told otherwise: under xdist each worker's
# vLLM processes (servers, probes, scripts) take that worker's core, so two workers' engines
# never share core 0 while core 1 idles
if worker_core() is not None:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(worker_core()))

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"


def mask_hash_vectors() -> list[dict]:
    """The contract's test vectors: ../shared/spec when present, else the committed copy."""
    shared = REPO.parent / "shared" / "spec" / "mask-hash-vectors.json"
    path = shared if shared.exists() else DATA / "mask-hash-vectors.json"
    return json.loads(path.read_text())["vectors"]


@pytest.fixture(scope="session")
def models():
    """The embedded target and drafter, loaded once per session."""
    from specaudit.model import default_models
    return default_models()


@pytest.fixture(scope="session")
def make_run(tmp_path_factory, models):
    """make_run(out=None, **run_traced kwargs) -> RunResult, on the embedded models.

    Defaults are small (4 prompts, 40 new tokens) so a run takes about a second.
    """
    from specaudit.traced_run import run_traced

    def _run(out=None, **kw):
        kw.setdefault("num_prompts", 4)
        kw.setdefault("max_new_tokens", 40)
        out = out or tmp_path_factory.mktemp("traces")
        return run_traced(out=out, models=models, **kw)
    return _run


# Configurations every reader must handle: chain, topk=1 tree, branching tree, at
# concurrency 1 and 4, with EOS (newline as EOS hits it mid-commit) and the token limit.
CLEAN_CONFIGS = [
    dict(algo="chain", budget=7, topk=1, concurrency=1),
    dict(algo="chain", budget=7, topk=1, concurrency=4, eos_id=10),
    dict(algo="tree", budget=7, topk=1, concurrency=1),
    dict(algo="tree", budget=12, topk=3, concurrency=1, eos_id=10),
    dict(algo="tree", budget=12, topk=3, concurrency=4),
]


@pytest.fixture(scope="session")
def clean_dataset(tmp_path_factory, make_run):
    """One dataset folder holding a clean --oracle run of each CLEAN_CONFIGS entry."""
    out = tmp_path_factory.mktemp("clean")
    results = [make_run(out=out, oracle=True, max_new_tokens=37, **cfg) for cfg in CLEAN_CONFIGS]
    return out, results


@pytest.fixture(scope="session")
def fault_run(tmp_path_factory, make_run):
    """fault_run(name, algo="chain"|"tree") -> (dataset folder, RunResult), cached.

    Trees use budget 12, topk 3 (branching); EOS is newline so eos-overcount shows.
    """
    cache = {}

    def _get(name, algo="chain"):
        key = (name, algo)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"fault-{name}-{algo}")
            kw = dict(algo=algo, budget=7 if algo == "chain" else 12, topk=1 if algo == "chain" else 3)
            if name == "eos-overcount":
                kw["eos_id"] = 10
            cache[key] = (out, make_run(out=out, oracle=True, inject=name, **kw))
        return cache[key]
    return _get


# ------------------------------------------------------------------ pytest-xdist (scripts/test.sh: -n 4)
# Workers share nothing but the machine: each has its own session fixtures (models, datasets under
# its own tmp_path_factory base), its servers bind free ports, its files live under tmp_path.
# Two rules keep the expensive set-ups built once and the two cores busy to the end:
#   - a module whose tests share a module-, class- or session-scoped fixture defined in that module
#     (a vLLM or llama-server fleet, a Spark session, a corpus) runs on one worker
#     (xdist_group, honoured by --dist loadgroup): split across two, each worker would build it;
#   - tests marked alone (below) go first, as one group, on one worker, while the other worker
#     runs the tests marked light (a replay under a real Prometheus: it mostly sleeps), so the
#     minute the alone tests need the cores to themselves costs the suite no idle core;
#   - then tests marked slow (whole modules or one test), then the grouped ones, then single
#     tests in file order (with --no-loadscope-reorder): the long units start at once and the short
#     tests fill in whichever worker frees first, instead of one long unit starting last on its own.

def _shares_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    module = item.nodeid.split("::", 1)[0]
    for defs in (info.name2fixturedefs.values() if info else ()):
        for d in defs:
            if d.scope != "function" and d.baseid == module:
                return True
    return False


@pytest.hookimpl(tryfirst=True)    # before xdist reads the xdist_group marks (its own hook)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("alone"):      # together, first (below): the other worker runs the light ones
            item.add_marker(pytest.mark.xdist_group("alone"))
        elif _shares_a_module_fixture(item) and not any(item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))

    def rank(it):
        for r, name in enumerate(("alone", "light", "slow")):
            if it.get_closest_marker(name):
                return r
        return 3 if it.get_closest_marker("xdist_group") else 4
    # stable: file order within a rank; a group is dispatched where its first test sits. xdist's
    # first units go one to each worker in this order: the alone group to one, the light module
    # (a group: it shares its module's fixture) to the other.
    items.sort(key=rank)


class _GroupsHeld:
    """A plugin (registered in pytest_configure) so its hook can run last: a conftest holds one
    pytest_collection_modifyitems, and that one must run first."""

    @pytest.hookimpl(trylast=True)     # after xdist's own hook has put each group in its tests' ids
    def pytest_collection_modifyitems(self, config, items):
        _check_groups_held(config, items)


def pytest_configure(config):
    config.pluginmanager.register(_GroupsHeld(), "specaudit-groups-held")
    if "PYTEST_XDIST_WORKER" in os.environ or getattr(config.option, "dist", "no") != "loadgroup":
        return
    import importlib.metadata as md

    from packaging.version import Version
    xd = md.version("pytest-xdist")
    # the worker's check below stops such a run too, but xdist shows that only as an INTERNALERROR
    if Version(pytest.__version__) >= Version("9.2.0.dev0") and Version(xd) <= Version("3.8.0"):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {xd}: --dist loadgroup groups nothing "
            "(pytest-xdist#1386), so each worker would build every module's fleet of servers. "
            "Install the versions pyproject.toml's test extra pins: python3 -m pip install 'pytest<9.2'")


def _check_groups_held(config, items):
    """On an xdist worker under --dist loadgroup, every test with an xdist_group mark must carry
    its group in its id ("...@group"): the scheduler groups by that suffix alone. With pytest 9.2
    and pytest-xdist 3.8 the rename is silently lost (pytest-xdist#1386), the module fleets are
    built once per worker (four vLLM fleets at once ran the machine out of memory), so the run
    stops here, naming the versions."""
    if "PYTEST_XDIST_WORKER" not in os.environ or not config.getvalue("loadgroup"):
        return
    lost = [it.nodeid for it in items if any(it.iter_markers("xdist_group")) and "@" not in it.nodeid]
    if lost:
        import importlib.metadata as md
        pytest.exit(
            f"pytest-xdist's --dist loadgroup did not group {len(lost)} tests (first: {lost[0]}) under pytest "
            f"{pytest.__version__} with pytest-xdist {md.version('pytest-xdist')}: each worker would build every "
            "module's fleet. Install the versions pyproject.toml's test extra pins (pytest<9.2).", returncode=4)


# Timing-sensitive tests (marked `alone`: a verdict that rests on wall-clock throughput) run while
# the other workers wait: every test passes a gate and holds a shared lock on the cores; an `alone`
# test holds the gate (no other test starts) and then the cores exclusively (the running ones end
# first). Tests marked `light` take neither lock: they wait on a replay's clock (an exporter thread
# and Prometheus on loopback, a few % of one core), so they run beside an alone test, which uses
# one core at a time. Lock files sit in this run's temporary root, which the workers share;
# without xdist, nothing is locked.

@contextlib.contextmanager
def _cores(root: Path, alone: bool):
    import fcntl
    with open(root / "xdist-gate.lock", "a") as gate, open(root / "xdist-cores.lock", "a") as cores:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
            fcntl.flock(cores, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            yield
        finally:
            fcntl.flock(cores, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with _timeline(item):
        if "PYTEST_XDIST_WORKER" not in os.environ or item.get_closest_marker("light"):
            return (yield)
        root = item.config._tmp_path_factory.getbasetemp().parent     # pytest-N/, above each popen-gwK/
        with _cores(root, item.get_closest_marker("alone") is not None):
            return (yield)


@contextlib.contextmanager
def _timeline(item):
    """SPECAUDIT_TEST_TIMELINE=<file>: each test's worker, wall start/end and the worker's CPU
    seconds appended as one JSON line (set-up, call and tear-down together, lock waits included):
    scripts/bench_suite.py reads it to show where each worker's time went."""
    path = os.environ.get("SPECAUDIT_TEST_TIMELINE")
    if not path:
        yield
        return
    import resource
    import time

    def kids():   # children reaped so far (a server's CPU lands on the test whose tear-down stops it)
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime
    t0, c0, k0 = time.time(), time.process_time(), kids()
    try:
        yield
    finally:
        rec = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
               "start": round(t0, 3), "end": round(time.time(), 3),
               "cpu_s": round(time.process_time() - c0, 3), "children_cpu_s": round(kids() - k0, 3)}
        with open(path, "a") as f:      # one short append per test: whole lines, even from two workers
            f.write(json.dumps(rec) + "\n")


def pytest_collection_finish(session):
    """gc.freeze(): what the imports and the collection made (torch, transformers, every test
    module and its parameters: objects that live for the whole session) moves to a generation
    the collector no longer walks, so each full collection during the tests, and pytest's five
    at the end of each worker (about a second here), walk only what the tests made."""
    import gc
    gc.freeze()
