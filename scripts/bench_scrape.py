"""What a 10 Hz Prometheus scrape costs `specaudit serve`, measured side by side.

    python scripts/bench_scrape.py                       # starts its own server
    python scripts/bench_scrape.py --url http://127.0.0.1:8000 --pairs 6 --phase-seconds 5

One run, one server, one steady closed-loop load (--concurrency clients, non-streaming).
Time is cut into phases that alternate: without scraping, then with a --hz scrape of
/metrics, repeated --pairs times (ABAB..., so drift hits both). A phase's throughput is
the growth of the server's own specaudit_derived_committed_tokens_total over the phase
(read once at each phase boundary, in both kinds of phase alike) divided by its wall
time: engine throughput, free of request-boundary effects.

Last line: one JSON object with
    scrape_overhead        median over pairs of 1 - (tokens/s scraping) / (tokens/s not); target <= 0.01
    scrape_overhead_pooled the same from the pooled means of all phases of each kind
    scrape_cpu_share       CPU seconds per second the server spends answering /metrics at --hz
                           (its specaudit_metrics_scrape_cpu_seconds_total): the cost itself,
                           which a busy shared machine cannot blur the way it blurs throughput
    scrape_cpu_us_per_scrape  the same per scrape (scrape_cpu_share / hz): a CPU time, kept
                           when the machine is busy (the ratios above are then withheld)
    tokens_per_s_no_scrape, tokens_per_s_scrape, per_pair_overhead (list), pairs, phase_s
    scrape_hz, scrapes, scrape_latency_s {p50, p90}, metrics_bytes
A negative overhead is noise (the two kinds of phase differ by less than the spread of
per_pair_overhead); read both together.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import add_json_out, guard_ratios, load_fields, quiet_machine, record
from load import percentiles

TOKENS_RE = re.compile(r"^specaudit_derived_committed_tokens_total\s+(\S+)", re.MULTILINE)
SCRAPE_CPU_RE = re.compile(r"^specaudit_metrics_scrape_cpu_seconds_total\s+(\S+)", re.MULTILINE)


def start_server(args) -> tuple[subprocess.Popen, str, str]:
    """`specaudit serve --port 0` in a subprocess; returns (process, url, trace dir)."""
    trace_dir = tempfile.mkdtemp(prefix="bench-scrape-")
    cmd = [sys.executable, "-m", "specaudit", "serve", "--port", "0", "--out", trace_dir,
           "--algo", args.algo, "--budget", str(args.budget), "--concurrency", str(args.slots),
           "--max-new-tokens", str(max(args.max_tokens, 64))]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() - t0 < 120:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode} before listening")
            continue
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            # keep draining stderr so the server never blocks on a full pipe
            import threading
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(1), trace_dir
    proc.kill()
    raise RuntimeError("server did not start within 120 s")


async def bench(url: str, *, concurrency: int, max_tokens: int, pairs: int, phase_s: float, hz: float,
                warmup_s: float, prompts: list[str]) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:
        model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
        stop = asyncio.Event()
        n_sent = 0

        async def worker(k: int):
            nonlocal n_sent
            while not stop.is_set():
                body = {"model": model, "prompt": prompts[n_sent % len(prompts)], "max_tokens": max_tokens}
                n_sent += 1
                r = await client.post(f"{url}/v1/completions", json=body)
                if r.status_code != 200:
                    raise RuntimeError(f"load request failed: {r.status_code} {r.text[:200]}")

        scraping = asyncio.Event()
        lat: list[float] = []
        size = [0]

        async def scraper():
            period = 1.0 / hz
            nxt = time.perf_counter()
            while not stop.is_set():
                if scraping.is_set():
                    t = time.perf_counter()
                    r = await client.get(f"{url}/metrics")
                    lat.append(time.perf_counter() - t)
                    size[0] = len(r.content)
                nxt += period
                await asyncio.sleep(max(0.0, nxt - time.perf_counter()))

        cpu = {"A": 0.0, "B": 0.0}

        async def tokens() -> float:
            text = (await client.get(f"{url}/metrics")).text
            m = TOKENS_RE.search(text)
            c = SCRAPE_CPU_RE.search(text)
            cpu["now"] = float(c.group(1)) if c else float("nan")
            return float(m.group(1)) if m else 0.0

        workers = [asyncio.create_task(worker(k)) for k in range(concurrency)]
        scr = asyncio.create_task(scraper())
        await asyncio.sleep(warmup_s)     # fill the batch before measuring
        rates = {"A": [], "B": []}
        try:
            for _ in range(pairs):
                for kind in ("A", "B"):
                    if kind == "B":
                        scraping.set()
                    t0, c0 = time.perf_counter(), await tokens()
                    s0 = cpu["now"]
                    await asyncio.sleep(phase_s)
                    t1, c1 = time.perf_counter(), await tokens()
                    cpu[kind] += (cpu["now"] - s0) / (t1 - t0)
                    scraping.clear()
                    rates[kind].append((c1 - c0) / (t1 - t0))
                    for w in workers:
                        if w.done() and w.exception():
                            raise w.exception()
        finally:
            stop.set()
            await asyncio.gather(*workers, scr, return_exceptions=True)
    a = sum(rates["A"]) / len(rates["A"])
    b = sum(rates["B"]) / len(rates["B"])
    per_pair = sorted(1.0 - y / x for x, y in zip(rates["A"], rates["B"]) if x > 0)
    mid = len(per_pair) // 2
    # no pair at all (a phase saw no tokens: the counter moves once per tracer batch) -> None
    median = None if not per_pair else per_pair[mid] if len(per_pair) % 2 else \
        (per_pair[mid - 1] + per_pair[mid]) / 2
    return {
        # the median pair: robust to a burst from another process landing in one phase
        "scrape_overhead": round(median, 5) if per_pair else None,
        "scrape_overhead_pooled": round(1.0 - b / a, 5) if a > 0 else None,
        # the server's own CPU seconds answering /metrics per second while scraping (the
        # B phases less the boundary reads both kinds share): the cost without the noise
        "scrape_cpu_share": round((cpu["B"] - cpu["A"]) / pairs, 6),
        "tokens_per_s_no_scrape": round(a, 3), "tokens_per_s_scrape": round(b, 3),
        "per_pair_overhead": [round(1.0 - y / x, 5) for x, y in zip(rates["A"], rates["B"]) if x > 0],
        "pairs": pairs, "phase_s": phase_s, "scrape_hz": hz, "scrapes": len(lat),
        "scrape_latency_s": {k: v for k, v in percentiles(lat).items() if k in ("p50", "p90")},
        "metrics_bytes": size[0], "concurrency": concurrency, "max_tokens": max_tokens,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running server (default: start `specaudit serve --port 0`)")
    ap.add_argument("--pairs", type=int, default=8, help="A/B phase pairs (default 8)")
    ap.add_argument("--phase-seconds", type=float, default=3.0, help="seconds per phase (default 3)")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of load before measuring (default 3)")
    ap.add_argument("--hz", type=float, default=10.0, help="scrape rate in the B phases (default 10)")
    ap.add_argument("--concurrency", type=int, default=16, help="clients; more than --slots keeps the batch full "
                                                                  "(default 16)")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens per request (default 64)")
    ap.add_argument("--slots", type=int, default=8, help="server --concurrency when started here (default 8)")
    ap.add_argument("--algo", default="chain", choices=["chain", "tree"])
    ap.add_argument("--budget", type=int, default=7)
    add_json_out(ap, "scrape")
    args = ap.parse_args(argv)
    if args.pairs < 1 or args.phase_seconds <= 0 or args.hz <= 0 or args.concurrency < 1:
        print("bench_scrape.py: error: --pairs, --phase-seconds, --hz and --concurrency must be positive",
              file=sys.stderr)
        return 2
    from specaudit.tokenizer import default_prompts
    proc = None
    url = args.url
    try:
        quiet_machine()
        if url is None:
            proc, url, _ = start_server(args)
        out = asyncio.run(bench(url.rstrip("/"), concurrency=args.concurrency, max_tokens=args.max_tokens,
                                pairs=args.pairs, phase_s=args.phase_seconds, hz=args.hz, warmup_s=args.warmup,
                                prompts=default_prompts()))
    except Exception as e:
        print(f"bench_scrape.py: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    out["cpu_count"] = os.cpu_count()
    ov = "n/a" if out["scrape_overhead"] is None else format(out["scrape_overhead"], "+.4f")
    print(f"scrape overhead {ov}, scrape CPU share {out['scrape_cpu_share']:.4f} "
          f"({out['tokens_per_s_scrape']:.1f} vs "
          f"{out['tokens_per_s_no_scrape']:.1f} tokens/s, {out['scrapes']} scrapes at {args.hz:g} Hz, "
          f"{out['metrics_bytes']} bytes each)", file=sys.stderr)
    out["scrape_cpu_us_per_scrape"] = round(out["scrape_cpu_share"] / args.hz * 1e6, 1)
    out.update(load_fields())
    guard_ratios(out, ["scrape_overhead", "scrape_cpu_share"])
    print(json.dumps(out), flush=True)
    record("scrape", out, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
