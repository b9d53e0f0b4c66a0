"""A real llama-server on loopback for the live tests: start, ask, scrape, stop; never a hang.

    srv = LlamaServer(binary, ["-m", t, "-md", d, "--spec-type", "draft-simple"], log_path)
    r = srv.complete("def f(x):", n_predict=48)      # the /completion response (timings, tokens)
    text = srv.metrics()                             # /metrics (Prometheus text)
    srv.stop()

Every wait has a timeout; a server that exits before it is ready raises ServerError with the
last lines of its log; a port taken between choosing it and binding it is retried on another.
The process runs in its own session and is killed (SIGKILL after 10 s of SIGTERM) by stop(),
which the fixtures call in their finalizers.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from live_procs import HTTP, free_port  # (tests/ is on the path: this module is imported from there)

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

# Short Python prompts (the models were trained on the stdlib's source). The tiny target falls
# into runs of "_" or spaces after many prompts, where the drafter agrees trivially (mean
# accepted length near k); these five keep their greedy continuations varied: a workload with
# real partial acceptance, not a degenerate one (test_acceptance_is_partial_... prints the
# figure over them).
PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv):\n    ",
    "def _check_arg(name, value):\n    if value is None:\n",
    "    for i in range(len(items)):\n        ",
    "try:\n    import _thread\nexcept ImportError:\n",
    "def open(file, mode='r', buffering=-1):\n    \"\"\"",
]


class ServerError(Exception):
    pass


class LlamaServer:
    def __init__(self, binary, args, log_path: Path, ready_timeout: float = 90.0, env=None, core: int | None = None):
        """core: run the server pinned to that one core (all its threads), None for anywhere."""
        self.binary, self.args, self.log_path = str(binary), list(args), Path(log_path)
        self.core = core
        self.proc = None
        for attempt in range(3):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self._start(env)
            try:
                self._wait_ready(ready_timeout)
                return
            except ServerError as e:
                self.stop()
                bind = "bind" in str(e).lower() or "address already in use" in str(e).lower()
                if not bind or attempt == 2:
                    raise

    def _start(self, env):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "ab")
        cmd = [self.binary, *self.args, "--host", "127.0.0.1", "--port", str(self.port)]
        self.log.write(("$ " + " ".join(cmd) + "\n").encode())
        self.log.flush()
        pin = {} if self.core is None else {"preexec_fn": lambda: os.sched_setaffinity(0, {self.core})}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env={**os.environ, **(env or {})}, **pin)

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def _wait_ready(self, timeout: float):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise ServerError(f"llama-server exited with {self.proc.returncode} before it was ready "
                                  f"(log {self.log_path}):\n{self.tail()}")
            try:
                if HTTP.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise ServerError(f"llama-server not ready in {timeout:.0f} s (log {self.log_path}):\n{self.tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def complete(self, prompt: str, n_predict: int = 48, timeout: float = 60.0, **extra) -> dict:
        """Greedy completion (temperature 0, top-k 1), the prompt not cached between requests."""
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                "return_tokens": True, "seed": 0, **extra}
        try:
            r = HTTP.post(self.url + "/completion", json=body, timeout=timeout)
        except httpx.HTTPError as e:
            raise ServerError(f"POST /completion failed ({type(e).__name__}: {e}); server alive: {self.alive()}\n"
                              f"{self.tail()}") from None
        if r.status_code != 200:
            raise ServerError(f"POST /completion: HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    def metrics(self, timeout: float = 10.0) -> str:
        r = HTTP.get(self.url + "/metrics", timeout=timeout)
        r.raise_for_status()
        return r.text

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode


def counters(text: str) -> dict:
    """The llamacpp:* samples of a /metrics text: {name or name{labels}: value}."""
    out = {}
    for ln in text.splitlines():
        if ln.startswith("llamacpp:"):
            name, _, val = ln.rpartition(" ")
            out[name] = float(val)
    return out


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
