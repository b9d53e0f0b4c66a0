"""What the vLLM plugin costs: the same server and requests with and without tracing.

    python3 scripts/vllm_overhead.py [--rounds 3] [--max-tokens 64] [--model DIR]

Starts vLLM 0.32.0 (scripts/vllm_env.sh's venv) with n-gram speculation on the tiny Llama
(scripts/tiny_llama.py), once untraced and once with SPECAUDIT_VLLM_TRACE set, one after
the other on 127.0.0.1; sends the same greedy requests (two at a time) `rounds` times to
each and prints one JSON object: date, machine, load averages before and after, generated
tokens per second of each (best and median round), and traced / untraced.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from specaudit.machine_load import load_fields  # noqa: E402  (the repository root on the path first)


def measure(srv, prompts, rounds, max_tokens) -> list[float]:
    from concurrent.futures import ThreadPoolExecutor
    out = []
    with ThreadPoolExecutor(2) as ex:
        list(ex.map(lambda p: srv.complete(p, 8), prompts[:2]))       # warm-up
        for _ in range(rounds):
            t0 = time.perf_counter()
            rs = list(ex.map(lambda p: srv.complete(p, max_tokens, ignore_eos=True), prompts))
            dt = time.perf_counter() - t0
            out.append(sum(r["usage"]["completion_tokens"] for r in rs) / dt)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model", help="a Llama folder (default: scripts/tiny_llama.py's target)")
    a = ap.parse_args(argv)
    from test_vllm_live import NGRAM, PROMPTS
    from vllm_server import VllmServer, tiny_pair, vllm_python
    py = vllm_python()
    model = a.model or tiny_pair()["target"]
    res = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": {
        "platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "load_before": load_fields(), "model": model, "speculative_config": NGRAM,
        "rounds": a.rounds, "max_tokens": a.max_tokens, "requests_per_round": len(PROMPTS)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, trace in (("untraced", None), ("traced", Path(tmp) / "traces")):
            srv = VllmServer(py, model, Path(tmp) / f"{name}.log", spec=NGRAM, trace_dir=trace,
                             executor="mp")   # as vLLM's CPU platform deploys it (3 processes)
            try:
                srv.wait_ready()
                tps = measure(srv, PROMPTS, a.rounds, a.max_tokens)
            finally:
                srv.stop()
            res[name] = {"tokens_per_s": [round(x, 2) for x in tps], "best": round(max(tps), 2),
                         "median": round(statistics.median(tps), 2)}
    res["load_after"] = load_fields()
    res["traced_over_untraced_median"] = round(res["traced"]["median"] / res["untraced"]["median"], 4)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
