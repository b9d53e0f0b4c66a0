#!/usr/bin/env python3
"""Measure a cost profile for `specaudit estimate` on your own llama-server pair.

    python3 scripts/llama_cost_profile.py --spec http://127.0.0.1:8080 --plain http://127.0.0.1:8081 \\
        --k 6 --prompts prompts.txt --out cost.json
    specaudit estimate --observed-tps TPS_SPEC --baseline-tps TPS_PLAIN --profile cost.json \\
        --n-nodes 7 --concurrency 1 --reported-commit-len L

--spec is the server with the drafter (`--spec-draft-n-max K`), --plain the same target with
speculation off; both loopback, both otherwise idle. Each prompt (one per line of
--prompts; `\\n` in a line is a newline), --rounds times, greedy: streamed to the spec
server with "timings_per_token": true (its target forwards counted by the server's clock,
never by its spec counters; specaudit/audit/llamacpp_cost.py says how), then asked again
without streaming on both servers (the times r is made of: streaming slows each token).
Prints one JSON line: r, r_std, the step and plain-token times, date, machine and load.
Exit 0, 2 on bad input or a server that does not answer (one line).
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _post(url: str, prompt: str, n_predict: int, streamed: bool, timeout: float):
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "seed": 0,
            "cache_prompt": False}
    if streamed:
        body.update(stream=True, timings_per_token=True)
    req = urllib.request.Request(url.rstrip("/") + "/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)   # noqa: S310  (loopback URLs only, checked)


def stream(url: str, prompt: str, n_predict: int, timeout: float = 120.0) -> tuple[list, str]:
    """One streamed greedy completion -> ([(predicted_n, predicted_ms)] per chunk, the text)."""
    out, text = [], []
    with _post(url, prompt, n_predict, True, timeout) as r:
        for raw in r:
            ln = raw.decode("utf-8", "replace").strip()
            if not ln.startswith("data: "):
                continue
            d = json.loads(ln[6:])
            text.append(d.get("content") or "")
            t = d.get("timings")
            if isinstance(t, dict):
                out.append((t.get("predicted_n"), t.get("predicted_ms")))
    return out, "".join(text)


def complete(url: str, prompt: str, n_predict: int, timeout: float = 120.0) -> dict:
    """One plain (not streamed) greedy completion -> the response."""
    with _post(url, prompt, n_predict, False, timeout) as r:
        return json.loads(r.read())


def loopback(url: str) -> str:
    u = urllib.parse.urlparse(url)
    if u.scheme != "http" or u.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"{url}: give the server's loopback URL (http://127.0.0.1:PORT)")
    return url


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="URL of the server with speculation on")
    ap.add_argument("--plain", required=True, help="URL of the same target with speculation off")
    ap.add_argument("--k", type=int, required=True, help="its --spec-draft-n-max (the profile is at N = k + 1)")
    ap.add_argument("--prompts", type=Path, required=True, help="one prompt per line (\\n for a newline)")
    ap.add_argument("--n-predict", type=int, default=200, help="tokens per request (default 200)")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the prompts (default 2)")
    ap.add_argument("--out", type=Path, required=True, help="the cost profile JSON to write")
    a = ap.parse_args(argv)
    from specaudit.audit.llamacpp_cost import profile_from_runs
    try:
        spec, plain = loopback(a.spec), loopback(a.plain)
        if a.k < 1 or a.n_predict < 2 or a.rounds < 1:
            raise ValueError("--k >= 1, --n-predict >= 2 and --rounds >= 1")
        prompts = [p.replace("\\n", "\n") for p in a.prompts.read_text().splitlines() if p.strip()]
        if not prompts:
            raise ValueError(f"{a.prompts}: no prompt in it")
        s_runs, p_runs = [], []
        for _ in range(a.rounds):
            for p in prompts:   # alternating: a busy machine slows both alike
                chunks, text = stream(spec, p, a.n_predict)
                s_runs.append((chunks, text, complete(spec, p, a.n_predict)))
                p_runs.append(complete(plain, p, a.n_predict))
        prof = profile_from_runs(s_runs, p_runs, a.k, 1, {"spec_url": spec, "plain_url": plain,
                                                           "n_predict": a.n_predict})
    except (OSError, ValueError, urllib.error.URLError) as e:
        print(f"llama_cost_profile: error: {getattr(e, 'reason', None) or e}", file=sys.stderr)
        return 2
    prof.save(a.out)
    e = prof.entries[0]
    print(json.dumps({"profile": str(a.out), "r": e.r, "r_std": e.r_std, "n_nodes": e.n_nodes,
                      "concurrency": e.concurrency, **prof.meta}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
