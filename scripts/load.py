"""Load generator for `specaudit serve` (or any OpenAI-compatible /v1/completions).

    python scripts/load.py --url http://127.0.0.1:8000 --concurrency 32 --requests 128
    python scripts/load.py --url http://127.0.0.1:8000 --concurrency 8 --duration 60 --no-stream

Keeps `--concurrency` requests in flight (asyncio + httpx) until `--requests` have been
sent or `--duration` seconds have passed, whichever comes first; in-flight requests then
finish (cancelled at duration + --grace). Prompts are the embedded held-out set unless
--prompts FILE. Streaming (default) measures time to first token from the first SSE
chunk; completion tokens come from the server's `usage`.

The last line of output is one JSON object (the estimator reads it:
`specaudit estimate --load FILE`):
    tokens_per_s                 completion tokens / wall seconds (client side, aggregate)
    per_request_tokens_per_s     list, each request's completion tokens / its e2e seconds
    concurrency, requests, ok, errors, completion_tokens, prompt_tokens, wall_s
    ttft_s, e2e_s                {"p50", "p90", "p99", "mean"} over successful requests
    mean_commit_len              the server's reported mean commit length over the run
                                 (from /metrics before and after; absent with --no-metrics)
Exit code 1 when any request failed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time


def percentiles(xs: list[float]) -> dict:
    if not xs:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    s = sorted(xs)

    def q(p):  # nearest-rank
        return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]
    return {"p50": round(q(0.50), 6), "p90": round(q(0.90), 6), "p99": round(q(0.99), 6),
            "mean": round(sum(s) / len(s), 6)}


def load_prompt_texts(path: str | None) -> list[str]:
    from specaudit.tokenizer import default_prompts, load_prompts
    return load_prompts(path) if path else default_prompts()


async def settled_counters(client, url: str, interval: float = 0.3, limit: float = 5.0) -> dict:
    """Scrape /metrics until the step counter stops moving: the server's tracer hands
    steps to its Prometheus sink in batches (every 0.25 s), so the last requests' steps
    can land a moment after their responses."""
    prev = scrape_counters((await client.get(f"{url}/metrics")).text)
    end = time.perf_counter() + limit
    while time.perf_counter() < end:
        await asyncio.sleep(interval)
        cur = scrape_counters((await client.get(f"{url}/metrics")).text)
        if cur.get("specaudit_verify_steps_total") == prev.get("specaudit_verify_steps_total"):
            return cur
        prev = cur
    return prev


def scrape_counters(text: str) -> dict:
    """specaudit_committed_tokens_total and specaudit_verify_steps_total from /metrics text."""
    out = {}
    for line in text.splitlines():
        if line.startswith(("specaudit_committed_tokens_total ", "specaudit_verify_steps_total ")):
            name, value = line.split()[:2]
            out[name] = float(value)
    return out


async def one_request(client, url: str, model: str | None, prompt: str, max_tokens: int, stream: bool) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens}
    if model:
        body["model"] = model
    t0 = time.perf_counter()
    ttft = None
    if not stream:
        r = await client.post(f"{url}/v1/completions", json=body)
        t1 = time.perf_counter()
        if r.status_code != 200:
            return {"ok": False, "status": r.status_code, "error": r.text[:200]}
        obj = r.json()
        u = obj.get("usage") or {}
        return {"ok": True, "ttft": t1 - t0, "e2e": t1 - t0, "completion_tokens": int(u.get("completion_tokens", 0)),
                "prompt_tokens": int(u.get("prompt_tokens", 0))}
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    usage = None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")
            return {"ok": False, "status": r.status_code, "error": text[:200]}
        done = False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            obj = json.loads(data)
            if "error" in obj:
                return {"ok": False, "status": 200, "error": json.dumps(obj)[:200]}
            if ttft is None and obj.get("choices"):
                ttft = time.perf_counter() - t0
            if obj.get("usage"):
                usage = obj["usage"]
    t1 = time.perf_counter()
    if not done or usage is None:
        return {"ok": False, "status": 200, "error": "stream ended without [DONE] and usage"}
    return {"ok": True, "ttft": ttft if ttft is not None else t1 - t0, "e2e": t1 - t0,
            "completion_tokens": int(usage.get("completion_tokens", 0)),
            "prompt_tokens": int(usage.get("prompt_tokens", 0))}


async def run_load(url: str, *, concurrency: int, requests: int, duration: float, max_tokens: int,
                   prompts: list[str], model: str | None = None, stream: bool = True, grace: float = 30.0,
                   metrics: bool = True, timeout: float = 120.0) -> dict:
    import httpx

    url = url.rstrip("/")
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    results: list[dict] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), limits=limits) as client:
        before = scrape_counters((await client.get(f"{url}/metrics")).text) if metrics else {}
        if model is None:
            try:
                model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
            except Exception:
                model = None
        t_start = time.perf_counter()
        deadline = t_start + duration
        issued = 0

        async def worker():
            nonlocal issued
            while issued < requests and time.perf_counter() < deadline:
                i = issued
                issued += 1
                try:
                    res = await one_request(client, url, model, prompts[i % len(prompts)], max_tokens, stream)
                except (httpx.HTTPError, json.JSONDecodeError, OSError) as e:
                    res = {"ok": False, "status": None, "error": f"{type(e).__name__}: {e}"[:200]}
                results.append(res)

        tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        _, pending = await asyncio.wait(tasks, timeout=duration + grace)
        for t in pending:
            t.cancel()
        wall = time.perf_counter() - t_start
        after = await settled_counters(client, url) if metrics else {}
    ok = [r for r in results if r["ok"]]
    ctoks = sum(r["completion_tokens"] for r in ok)
    out = {
        "url": url, "concurrency": concurrency, "requests": len(results), "ok": len(ok),
        "errors": len(results) - len(ok) + len(pending), "stream": stream, "max_tokens": max_tokens,
        "completion_tokens": ctoks, "prompt_tokens": sum(r["prompt_tokens"] for r in ok),
        "wall_s": round(wall, 6), "tokens_per_s": round(ctoks / wall, 3) if wall > 0 else 0.0,
        "per_request_tokens_per_s": [round(r["completion_tokens"] / r["e2e"], 3) for r in ok if r["e2e"] > 0],
        "ttft_s": percentiles([r["ttft"] for r in ok]), "e2e_s": percentiles([r["e2e"] for r in ok]),
    }
    steps = after.get("specaudit_verify_steps_total", 0) - before.get("specaudit_verify_steps_total", 0)
    if steps > 0:
        out["mean_commit_len"] = round((after["specaudit_committed_tokens_total"]
                                        - before.get("specaudit_committed_tokens_total", 0)) / steps, 4)
        out["verify_steps"] = int(steps)
    errs = [r for r in results if not r["ok"]]
    if errs:
        out["first_errors"] = [{"status": r["status"], "error": r["error"]} for r in errs[:3]]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    ap.add_argument("--requests", type=int, default=64, help="most requests to send (default 64)")
    ap.add_argument("--duration", type=float, default=60.0, help="stop sending after S seconds (default 60)")
    ap.add_argument("--grace", type=float, default=30.0, help="then wait at most S for in-flight ones (default 30)")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens per request (default 64)")
    ap.add_argument("--prompts", metavar="FILE", help="JSONL or text prompts (default: the embedded set)")
    ap.add_argument("--model", help="model name (default: the first of /v1/models)")
    ap.add_argument("--no-stream", action="store_true", help="non-streaming requests")
    ap.add_argument("--no-metrics", action="store_true", help="do not read /metrics before and after")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request timeout in seconds (default 120)")
    args = ap.parse_args(argv)
    for name in ("concurrency", "requests", "max_tokens"):
        if getattr(args, name) < 1:
            print(f"load.py: error: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    if not args.duration > 0:
        print("load.py: error: --duration must be positive", file=sys.stderr)
        return 2
    try:
        prompts = load_prompt_texts(args.prompts)
    except Exception as e:
        print(f"load.py: error: {e}", file=sys.stderr)
        return 2
    try:
        out = asyncio.run(run_load(args.url, concurrency=args.concurrency, requests=args.requests,
                                   duration=args.duration, max_tokens=args.max_tokens, prompts=prompts,
                                   model=args.model, stream=not args.no_stream, grace=args.grace,
                                   metrics=not args.no_metrics, timeout=args.timeout))
    except Exception as e:
        print(f"load.py: error: cannot load {args.url}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(f"load: {out['ok']}/{out['requests']} ok at concurrency {out['concurrency']}, "
          f"{out['completion_tokens']} tokens in {out['wall_s']:.2f}s = {out['tokens_per_s']:.1f} tokens/s, "
          f"ttft p50 {out['ttft_s']['p50']}s, e2e p90 {out['e2e_s']['p90']}s", file=sys.stderr)
    print(json.dumps(out), flush=True)
    return 1 if out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
