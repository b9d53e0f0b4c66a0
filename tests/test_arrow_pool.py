"""Arrow's memory pool for a check process (specaudit/audit/check/arrow_pool.py): jemalloc
when `specaudit check` starts, unless the user chose a pool; each case in a fresh
interpreter, as the choice is process-wide. What it buys is measured by
scripts/bench_check.py (check_pool_over_default), not here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
HAS_JEMALLOC = "jemalloc" in pa.supported_memory_backends()
PROBE = ("import json; from specaudit.audit.check.arrow_pool import use_check_pool; import pyarrow as pa; "
         "b, why = use_check_pool(); print(json.dumps([b, why, pa.default_memory_pool().backend_name]))")


def clean_env(**env) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "SPECAUDIT_ARROW_POOL")}
    e.update(env)
    return e


def probe(**env) -> list:
    e = clean_env(**env)
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=e, cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_jemalloc_is_chosen_where_pyarrow_has_it():
    backend, why, now = probe()
    assert backend == now
    if HAS_JEMALLOC:
        assert (backend, why) == ("jemalloc", "")
    else:   # a pyarrow built without it keeps its own pool, and says why
        assert backend != "jemalloc" and "no jemalloc" in why


def test_a_pool_the_user_chose_is_kept():
    assert probe(ARROW_DEFAULT_MEMORY_POOL="system") == ["system", "ARROW_DEFAULT_MEMORY_POOL chose it", "system"]


def test_specaudit_arrow_pool_default_keeps_arrows_own():
    own = subprocess.run([sys.executable, "-c", "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"],
                         capture_output=True, text=True, env=clean_env(), timeout=120).stdout.strip()
    assert own   # what a fresh interpreter has when nobody picks
    assert probe(SPECAUDIT_ARROW_POOL="default") == [own, "SPECAUDIT_ARROW_POOL=default", own]


def test_the_check_command_picks_the_pool_before_checking(tmp_path):
    from specaudit.trace.synth import write_synthetic_dataset
    run = write_synthetic_dataset(tmp_path, n_steps=300)
    e = clean_env(SPECAUDIT_DEBUG="1")
    p = subprocess.run([sys.executable, "-m", "specaudit", "check", str(run)], capture_output=True, text=True,
                       env=e, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    want = "Arrow memory pool: jemalloc" if HAS_JEMALLOC else "Arrow memory pool: "
    assert want in p.stderr, p.stderr[-2000:]


def test_pages_other_than_4k_or_a_failing_first_allocation_keep_arrows_pool():
    """A jemalloc built for smaller pages than the system's fails every allocation (aarch64
    kernels with 16 or 64 KiB pages): the pool is not switched there, nor when a first
    allocation from jemalloc fails (each case in a fresh interpreter, as probe())."""
    own = subprocess.run([sys.executable, "-c", "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"],
                         capture_output=True, text=True, env=clean_env(), timeout=120).stdout.strip()
    cases = {
        "import specaudit.audit.check.arrow_pool as ap; ap._page_size = lambda: 65536": "system pages of 65536 bytes",
        "import pyarrow as pa\ndef bad(*a, **k): raise MemoryError('Unsupported system page size')\n"
        "pa.allocate_buffer = bad": "jemalloc unavailable: Unsupported system page size",
    }
    for patch, why in cases.items():
        code = patch + "\n" + PROBE.replace("; ", "\n")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd=REPO,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        backend, got, now = json.loads(p.stdout)
        if HAS_JEMALLOC:
            assert (backend, got, now) == (own, why, own)
        else:
            assert (backend, got) == (own, "this pyarrow has no jemalloc")
