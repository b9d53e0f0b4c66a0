"""Run the issue-37 set-up against a live vLLM server and keep what vLLM exposes.

The target is its own drafter (`--speculative-config '{"model": <target>,
"num_speculative_tokens": 4}'`: method draft_model, draft_sample_method greedy), the server
bound to 127.0.0.1, `--per-request-spec-decode-metrics detailed`; N requests of M tokens
sent at once at one temperature, with or without a per-request seed. Then the server is
stopped and its log and the responses are left in --out:

    server.log        vLLM's own log (start-up config, `SpecDecoding metrics:` lines)
    responses.jsonl   one completion response per line (metrics.speculative_decoding)
    summary.json      the run's set-up, per-position counts from the responses, timings

    python3 scripts/vllm_selfdraft_live.py --python $VENV/bin/python --model DIR --out DIR
        [--temperature 0.8] [--seed 1] [--requests 12] [--max-tokens 48]

Every wait has a timeout; the server runs in its own process group and is killed (TERM,
then KILL) whatever happens. Exit 0 with summary.json written, 2 on bad input, 3 when the
server does not come up or a request fails (the log's tail is printed).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

FIX_DIR = Path(__file__).resolve().parent / "vllm_fix_expand"
PROMPTS = [
    "def ", "import os\n", "class Foo:\n    ", "    return ", "for i in range(", "if __name__ == ",
    "# Copyright ", "from collections import ", "    def __init__(self", "try:\n    ", "x = [", "\"\"\"",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Server:
    """vLLM's OpenAI server in its own process group, its output in a file."""

    def __init__(self, python: str, model: str, k: int, log: Path, port: int, extra=(), fix_expand=False):
        spec = json.dumps({"model": model, "num_speculative_tokens": k})
        self.cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
                    "--port", str(port), "--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "16",
                    "--speculative-config", spec, "--per-request-spec-decode-metrics", "detailed", *extra]
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                   VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        # vLLM's ZMQ sockets (ipc://$VLLM_RPC_BASE_PATH/<uuid>) and torch.distributed's init
        # files (vllm_dist_<uuid>, under TMPDIR) stay behind when it is killed: a private
        # folder for both, removed in stop()
        self._rpc_dir = tempfile.mkdtemp(prefix="sa-vllm-")
        env["VLLM_RPC_BASE_PATH"] = env["TMPDIR"] = self._rpc_dir
        if fix_expand:   # the control: a correct expand_batch_to_tokens in every vLLM process
            env["PYTHONPATH"] = os.pathsep.join([str(FIX_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def wait_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} before it was ready")
            try:
                if _get(self.url + "/health", 2)[0] == 200:
                    return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        raise RuntimeError(f"vLLM not ready after {timeout:.0f} s")

    def spec_lines(self) -> int:
        try:
            return self.log.read_text(errors="replace").count("SpecDecoding metrics:")
        except OSError:
            return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=20)
        self._out.close()
        shutil.rmtree(self._rpc_dir, ignore_errors=True)


def run(python: str, model: str, out: Path, *, temperature: float, seed, requests: int, max_tokens: int,
        k: int = 4, ready_timeout: float = 300.0, request_timeout: float = 300.0, fix_expand: bool = False) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    log = out / "server.log"
    t0 = time.time()
    srv = Server(python, model, k, log, free_port(), fix_expand=fix_expand)
    try:
        srv.wait_ready(ready_timeout)
        t_ready = time.time()
        before = srv.spec_lines()
        results: list = [None] * requests
        errors: list = []

        def one(i):
            body = {"model": model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens,
                    "temperature": temperature, "ignore_eos": True}
            if seed is not None:
                body["seed"] = seed + i
            try:
                results[i] = _post(srv.url + "/v1/completions", body, request_timeout)
            except (urllib.error.URLError, OSError, ValueError) as e:
                errors.append(f"request {i}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(requests)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(request_timeout)
        if errors or any(r is None for r in results):
            raise RuntimeError("; ".join(errors) or "a request did not finish in time")
        t_done = time.time()
        # the stats logger prints every 10 s: wait for the interval that holds the last steps
        end = time.monotonic() + 40
        while srv.spec_lines() <= before and time.monotonic() < end:
            time.sleep(1)
        time.sleep(11)   # one more interval: the requests' last steps may fall into it
    finally:
        srv.stop()
    with open(out / "responses.jsonl", "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repository root
    from specaudit.machine_load import load_fields  # the busy rule's load keys (stdlib only)
    steps, per_pos, psa = 0, [0] * k, []
    for r in results:
        sd = (r.get("metrics") or {}).get("speculative_decoding") or {}
        a = sd.get("per_step_accepted") or []
        psa.append(a)
        steps += len(a)
        for n in a:
            for i in range(min(n, k)):
                per_pos[i] += 1
    summary = dict(
        what="vLLM self-draft live run (scripts/vllm_selfdraft_live.py)",
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        machine=load_fields(),
        setup=dict(model=model, k=k, temperature=temperature, seed=seed, requests=requests, max_tokens=max_tokens,
                   fix_expand=fix_expand),
        startup_s=round(t_ready - t0, 1), requests_s=round(t_done - t_ready, 1),
        verify_steps=steps, accepted_at_position=per_pos,
        rate_at_position=[round(c / steps, 4) if steps else None for c in per_pos],
        per_step_accepted_values=sorted({n for a in psa for n in a}),
        spec_lines=srv.spec_lines())
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Writes server.log, responses.jsonl and summary.json into --out.")
    ap.add_argument("--python", required=True, help="the vLLM venv's python")
    ap.add_argument("--model", required=True, help="the target's folder (also its drafter)")
    ap.add_argument("--out", required=True, type=Path, help="folder for the log, responses and summary")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=None, help="per-request seed base: request i gets seed + i")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--fix-expand", action="store_true",
                    help="control run: scripts/vllm_fix_expand/ on PYTHONPATH (a correct expand_batch_to_tokens)")
    args = ap.parse_args(argv)
    if not os.access(args.python, os.X_OK):
        print(f"vllm_selfdraft_live: --python {args.python}: not an executable", file=sys.stderr)
        return 2
    if not (Path(args.model) / "config.json").is_file():
        print(f"vllm_selfdraft_live: --model {args.model}: no config.json there", file=sys.stderr)
        return 2
    try:
        s = run(args.python, args.model, args.out, temperature=args.temperature, seed=args.seed,
                requests=args.requests, max_tokens=args.max_tokens, k=args.k, fix_expand=args.fix_expand)
    except RuntimeError as e:
        log = args.out / "server.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        print(f"vllm_selfdraft_live: {e}\n{tail}", file=sys.stderr)
        return 3
    print(json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
