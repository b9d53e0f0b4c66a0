"""Issue 37 against the live vLLM: a drafter identical to the target, rejected when sampling.

vLLM 0.32.0's CPU build verifies sampled drafts against the target's logits divided by a
per-token temperature that its C++ replacement of `expand_kernel` never writes (the
float temperature is cast to int64, expanded into a copy, and the copy dropped:
vllm/utils/cpu_triton_utils.py `_expand_kernel_impl`), so each draft is judged by
softmax(logits / uninitialised memory). docs/vllm-sampling-anomaly.md has the analysis.

Two checks, both on the vLLM venv (scripts/vllm_env.sh builds it; missing: skipped
locally, a failure under CI):
  - the cause, in one process: vLLM's own expand_batch_to_tokens, with the CPU kernels
    registered, does not return the request's temperature for every draft token;
  - the effect, on a live loopback server with the issue's set-up (the tiny target as its
    own drafter, temperature 0.8, a per-request seed, 12 requests of 48 tokens): the log
    agrees with the responses' per_step_accepted, and `specaudit check` on the server's
    log reports SA735 with the numbers (the garbage differs from run to run: a collapse
    or acceptance that stops at position 0; both are SA735; now and then it is a plausible
    temperature, and the run is done again: see the `live` fixture);
  - the proof, in one traced vLLM process (scripts/vllm_sampling_probe.py): the trace of
    the run as shipped breaks SA801 (decisions u < p/q contradicts), the control pass of
    the same requests with the expansion fixed checks clean.
Bounded: start-up 300 s, requests 300 s, the server killed in a finaliser.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("SPECAUDIT_CACHE") or Path.home() / ".cache" / "specaudit")
VENV_PY = CACHE / "venv-vllm-0.32.0" / "bin" / "python"
HAVE = (CACHE / "venv-vllm-0.32.0" / ".ready").is_file() and VENV_PY.is_file()
pytestmark = [pytest.mark.slow,   # live vLLM servers
              pytest.mark.skipif(not HAVE and not os.environ.get("CI"),
                                 reason="vLLM venv missing (bash scripts/vllm_env.sh builds it)")]

sys.path.insert(0, str(REPO / "scripts"))

EXPAND = r"""
import json, torch
from vllm.platforms import current_platform
current_platform.register_triton_kernel_overrides()   # what the CPU worker does at start-up
from vllm.v1.sample import rejection_sampler as rs
temp = torch.tensor([0.8, 0.8, 0.5], dtype=torch.float32)      # [batch] per-request temperature
cu = torch.tensor([4, 8, 12], dtype=torch.int32)                # 4 drafts per request
got = rs.expand_batch_to_tokens(temp, cu, 12, replace_from=0, replace_to=1)   # [12] per token
print(json.dumps({"got": [float(x) for x in got]}))
"""


def _need_venv():
    assert HAVE, f"vLLM venv missing at {VENV_PY.parent.parent} (CI: scripts/test.sh must build it)"


def test_cpu_expand_drops_the_temperature():
    _need_venv()
    r = subprocess.run([str(VENV_PY), "-c", EXPAND], capture_output=True, text=True, timeout=240,
                       cwd="/", env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])["got"]
    want = [0.8] * 8 + [0.5] * 4
    # the bug: not the requests' temperatures (uninitialised memory: zeros, denormals, junk)
    assert any(abs(g - w) > 1e-6 for g, w in zip(got, want)), (
        f"vLLM's CPU expand now returns the temperatures {got}: the issue-37 bug is fixed in this "
        "build; update docs/vllm-sampling-anomaly.md and this test")


def _responses_show_the_anomaly(s: dict) -> bool:
    """From the responses alone (per_step_accepted, not the log): clearly past SA735's
    thresholds, with a margin beyond the rule's own gate (10%, a quarter): under 8% of the
    drafts accepted, or position 1 under an eighth of position 0 (at least 40 there)."""
    acc = s["accepted_at_position"]
    return sum(acc) < 0.08 * 4 * s["verify_steps"] or (acc[0] >= 40 and 8 * acc[1] < acc[0])


ATTEMPTS = 3   # fresh servers at most: each draws new uninitialised memory


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The first of up to ATTEMPTS live runs whose responses show the anomaly. The bug reads
    uninitialised memory, so a run's garbage may happen to give a plausible temperature:
    one run here accepted 54, 49, 45, 44 drafts per position, flat and just above 10%, which
    no log can tell from a healthy self-drafter sampling at a temperature where the top
    token is that unlikely. Two runs in a row doing so is rare; none of three fails."""
    _need_venv()
    from tiny_llama import TARGET, ensure
    from vllm_selfdraft_live import run
    target = ensure("target", TARGET, log=lambda m: None)   # the drafter checkpoint is not needed
    seen = []
    for _ in range(ATTEMPTS):
        out = tmp_path_factory.mktemp("vllm_selfdraft")
        summary = run(str(VENV_PY), str(target), out, temperature=0.8, seed=1, requests=12, max_tokens=48)
        if _responses_show_the_anomaly(summary):
            return out, summary
        seen.append({k: summary[k] for k in ("verify_steps", "accepted_at_position")})
    raise AssertionError(f"{ATTEMPTS} live runs, none with the anomaly in its responses: {seen}")


def test_live_counts_agree(live):
    out, s = live
    assert s["verify_steps"] >= 100, s
    # the log line sums what the responses' per_step_accepted hold (one interval here)
    from specaudit.audit.sources import read_source
    ws = [w for w in read_source(out / "server.log").windows if w.draft_tokens]
    assert sum(w.accepted_tokens for w in ws) == sum(s["accepted_at_position"]), (ws, s)
    assert sum(w.draft_tokens for w in ws) == 4 * s["verify_steps"], (ws, s)


def test_live_log_raises_sa735(live):
    out, s = live
    r = subprocess.run([sys.executable, "-m", "specaudit", "check", str(out / "server.log"), "--output-format",
                        "json", "--select", "SA735"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr    # a warning: the log cannot know the temperature
    rep = json.loads(r.stdout)
    fs = [f for f in rep["findings"] if f["code"] == "SA735"]
    assert fs, rep
    msg = fs[0]["message"]
    assert "the drafter is the target itself" in msg and "vLLM 0.32.0 on cpu" in msg, msg
    assert "stops at position 0" in msg or "drafted tokens accepted" in msg, msg


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """The set-up in one vLLM process, traced: as shipped, then the control pass (the same
    requests with expand_batch_to_tokens replaced by a plain repeat_interleave)."""
    _need_venv()
    from tiny_llama import TARGET, ensure
    target = ensure("target", TARGET, log=lambda m: None)
    d = tmp_path_factory.mktemp("vllm_probe")
    r = subprocess.run([str(VENV_PY), str(REPO / "scripts" / "vllm_sampling_probe.py"), "--model", str(target),
                        "--seed", "1", "--requests", "6", "--out", str(d / "probe.json"), "--trace", str(d / "tr"),
                        "--control", "--control-trace", str(d / "ctl")],
                       capture_output=True, text=True, timeout=600, cwd=REPO,
                       env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads((d / "probe.json").read_text())


def _check(run_dir: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "specaudit", "check", run_dir, "--output-format", "json"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_trace_proves_the_contradiction(probe):
    assert probe["trace"]["rows"] > 0 and probe["trace"]["mismatch"] == 0, probe["trace"]
    # vLLM divided by something other than the request's temperature at most drafted tokens
    s = probe["summary"]
    used = sum(p["temp_used_equal_request"] for p in s["per_position"])
    assert used < s["tested"] / 2, s
    rep = _check(probe["trace"]["dir"])
    errors = {c for c, info in rep["rules"].items() if info["severity"] == "error"}
    assert "SA801" in errors, rep["counts"]     # decisions that u < p/q contradicts


def test_control_is_clean(probe):
    c = probe["control"]
    assert c["trace"]["rows"] > 0 and c["trace"]["mismatch"] == 0, c["trace"]
    s = c["summary"]
    assert all(p["temp_used_equal_request"] == p["tested"] for p in s["per_position"]), s
    assert s["per_position"][1]["accepted"] > 0, s     # acceptance goes on past position 0
    rep = _check(c["trace"]["dir"])
    errors = {c for c, info in rep["rules"].items() if info["severity"] == "error"}
    assert errors == set(), rep["counts"]           # never a false error on the healthy path
