#!/usr/bin/env python3
"""Measure a cost profile for `specaudit estimate` on your own llama-server pair.

    python3 scripts/llama_cost_profile.py --spec http://127.0.0.1:8080 --plain http://127.0.0.1:8081 \\
        --k 6 --prompts prompts.txt --out cost.json
    specaudit estimate --observed-tps TPS_SPEC --baseline-tps TPS_PLAIN --profile cost.json \\
        --n-nodes 7 --concurrency 1 --reported-commit-len L

--spec is the server with the drafter (`--spec-draft-n-max K`), --plain the same target with
speculation off; both loopback, both otherwise idle. Each prompt (one per line of
--prompts; `\\n` in a line is a newline) is streamed to one server then the other,
--rounds times, greedy, with "timings_per_token": true; the steps are counted by the
server's clock (specaudit/audit/llamacpp_cost.py says how), never by its spec counters.
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


def stream(url: str, prompt: str, n_predict: int, timeout: float = 120.0) -> list:
    """One streamed greedy completion -> [(predicted_n, predicted_ms)] per chunk."""
    body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "seed": 0,
                       "cache_prompt": False, "stream": True, "timings_per_token": True}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/completion", data=body,
                                 headers={"Content-Type": "application/json"})
    out = []
    with urllib.request.urlopen(req, timeout=timeout) as r:   # noqa: S310  (loopback URLs only, checked)
        for raw in r:
            ln = raw.decode("utf-8", "replace").strip()
            if not ln.startswith("data: "):
                continue
            t = json.loads(ln[6:]).get("timings")
            if isinstance(t, dict):
                out.append((t.get("predicted_n"), t.get("predicted_ms")))
    return out


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
    from specaudit.audit.llamacpp_cost import profile_from_streams
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
                s_runs.append(stream(spec, p, a.n_predict))
                p_runs.append(stream(plain, p, a.n_predict))
        prof = profile_from_streams(s_runs, p_runs, a.k, 1, {"spec_url": spec, "plain_url": plain,
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
