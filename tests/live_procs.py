"""Child processes the live tests start, in one place: a free loopback port, a child whose
stderr is drained (never blocks on a full pipe), and a real Prometheus started and waited for.

    from live_procs import Proc, free_port, start_prometheus
    prom, url = start_prometheus(exe, tmp / "prometheus.yml", tmp / "tsdb")   # ready, or stopped + raised
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx

# One client for the tests' loopback calls, shared by every thread (httpx.Client is thread-safe):
# httpx.get/post build a Client per call, and each loads the CA bundle (~26 ms of a core here),
# which the polling loops (alerts twice a second, readiness, a fleet's requests) paid per call.
HTTP = httpx.Client()


def worker_core() -> int | None:
    """The core this xdist worker's engines are pinned to (gw0 -> 0, gw1 -> 1, ...), None
    without xdist. Engines that pin themselves (vLLM's CPU worker binds core 0 by default)
    would otherwise all land on core 0 when two workers run them at once, leaving the
    other core idle; a time-bound load (the llama fleet) pinned to one core leaves the
    other worker's tests a whole core instead of taking whatever the scheduler gives it."""
    w = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not w.startswith("gw") or not w[2:].isdigit():
        return None
    cores = sorted(os.sched_getaffinity(0))
    return cores[int(w[2:]) % len(cores)]


@contextlib.contextmanager
def private_tmpdir(prefix: str):
    """A folder of its own under the temporary folder, removed afterwards: a child's TMPDIR
    for programs that leave their files there (AIPerf's IPC sockets and memory-mapped
    datasets: two folders per run, never removed). Short, as a Unix socket's path is at
    most 107 bytes."""
    d = tempfile.mkdtemp(prefix=prefix)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_aiperf(cmd: list, out: Path) -> subprocess.CompletedProcess:
    """One `aiperf profile` command (cmd) writing its artifacts to `out`, run as the tests run
    it: outside our virtual environment (AIPerf has its own), offline (its Hugging Face calls
    go to a closed port), plain output, and its temporary files in a private folder that it
    must have used and that is removed after. Asserts it succeeded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env.update(HF_HOME=str(out / "hf"), HF_ENDPOINT="http://127.0.0.1:9", NO_COLOR="1", TERM="dumb")
    with private_tmpdir("sa-aiperf-") as tmp:   # its IPC sockets and datasets, removed after
        env["TMPDIR"] = tmp
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=out.parent)
        used = os.listdir(tmp)   # AIPerf honoured TMPDIR (else its files went to the shared folder)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert used, "AIPerf wrote nothing under its TMPDIR"
    return r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process whose stderr is drained into a list (never blocks on a full pipe)."""

    def __init__(self, cmd, cwd=None):
        self.cmd = cmd
        self.p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.t = threading.Thread(target=self._drain, daemon=True)
        self.t.start()

    def _drain(self):
        for line in self.p.stderr:
            self.lines.append(line)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        rx = re.compile(pattern)
        end = time.time() + timeout
        while time.time() < end:
            for ln in list(self.lines):
                m = rx.search(ln)
                if m:
                    return m
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{self.cmd[:4]}: no {pattern!r} within {timeout}s; stderr:\n" + "".join(self.lines[-30:]))

    def stop(self, timeout: float = 30.0) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(10)
        self.t.join(5)
        return self.p.returncode


def start_prometheus(exe: str, config: Path, tsdb: Path, ready_s: float = 30.0) -> tuple[Proc, str]:
    """Prometheus on a free loopback port with `config`, data in `tsdb` (retention 1 h), once
    /-/ready answers 200 -> (its Proc, its URL). Not ready within `ready_s` s: stopped, then an
    AssertionError with the tail of its stderr."""
    port = free_port()
    proc = Proc([exe, f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
                 f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"])
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + ready_s
    while time.monotonic() < end:
        try:
            if HTTP.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.stop()
    raise AssertionError(f"prometheus not ready in {ready_s:.0f} s:\n" + "".join(proc.lines[-20:]))
