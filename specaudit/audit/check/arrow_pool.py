"""Arrow's memory pool for a process that checks traces: jemalloc, where this pyarrow has it.

    from specaudit.audit.check.arrow_pool import use_check_pool
    use_check_pool()   # -> ("jemalloc", ""), or (the pool left in place, why)

Why: a check decodes each step batch into fresh Arrow buffers (tens of MB at 65536 rows)
that are freed one or two batches later. pyarrow's default pool on Linux, mimalloc, hands
pages back to the kernel between batches, so later batches fault them in again, and on a
small VM the system time that costs varied several-fold between identical checks;
jemalloc keeps freed pages for its decay time and hands them to the next batch (user
time the same, peak RSS no higher). What it buys is scripts/bench_check.py's
check_pool_over_default: interleaved fresh processes, one pool against the other, in one
run (docs/benchmarks.md).

Process-wide (Arrow has one default pool), so the library never calls this on import:
`specaudit check` calls it as it starts, and scripts/bench_check.py's check process does
the same to measure what the command does. Left alone when the user chose a pool
(ARROW_DEFAULT_MEMORY_POOL, which Arrow reads itself) or SPECAUDIT_ARROW_POOL=default is
set; a pyarrow built without jemalloc keeps its own, and so does a system whose memory pages
are not 4 KiB (a jemalloc built for smaller pages fails every allocation there), or one
where a first allocation from jemalloc fails.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)   # SPECAUDIT_DEBUG=1 shows its line (fallback.debug_to_stderr)
ENV = "SPECAUDIT_ARROW_POOL"          # "default": leave Arrow's pool as it is
ARROW_ENV = "ARROW_DEFAULT_MEMORY_POOL"
WANTED = "jemalloc"


def use_check_pool() -> tuple[str, str]:
    """Make jemalloc Arrow's default memory pool for this process when allowed and
    available -> (the pool's backend now, the reason when it is not jemalloc)."""
    backend, why = _choose()
    log.debug("Arrow memory pool: %s%s", backend, f" ({why})" if why else "")
    return backend, why


def _choose() -> tuple[str, str]:
    import pyarrow as pa
    now = pa.default_memory_pool().backend_name
    if os.environ.get(ARROW_ENV):
        return now, f"{ARROW_ENV} chose it"
    if os.environ.get(ENV, "").lower() == "default":
        return now, f"{ENV}=default"
    if now == WANTED:
        return now, ""
    if WANTED not in pa.supported_memory_backends():
        return now, f"this pyarrow has no {WANTED}"
    page = _page_size()
    if page != 4096:
        # a jemalloc built for smaller pages than the system's fails every allocation
        # ("Unsupported system page size": aarch64 kernels with 16 or 64 KiB pages)
        return now, f"system pages of {page} bytes"
    try:
        pool = pa.jemalloc_memory_pool()
        pa.allocate_buffer(1 << 20, memory_pool=pool)   # it allocates here, or says why not
    except (NotImplementedError, MemoryError, pa.ArrowException) as e:   # listed but not usable here
        return now, f"{WANTED} unavailable: {' '.join(str(e).split())[:200]}"
    pa.set_memory_pool(pool)
    return pa.default_memory_pool().backend_name, ""


def _page_size() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):   # no sysconf (Windows): not known
        return None
