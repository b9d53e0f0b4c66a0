"""vLLM's real metric bug classes, reproduced in vLLM itself and caught.

One server runs a patched copy of vLLM 0.32.0's Python source (tests/vllm_patch.py: the
installed venv is untouched) with two fixture diffs, and the plugin on:

  block   the per-request block's per_step_accepted counts the bonus token (a per-request-
          block miscount). Caught from vLLM's own outputs: the block's per-step array no
          longer sums to its own num_accepted_draft_tokens; the trace then says by how much.
  34734   a decode step whose request had no valid drafts still counts as a draft (vLLM
          #34734 / #34757: fully invalidated requests increment num_drafts). Caught from
          vLLM's own outputs (a per-request block with spec steps that drafted nothing) and
          from the trace: /metrics num_drafts exceeds the verify steps that held drafts.

And one bug that vLLM 0.32.0 has as shipped (no patch): 56101, drafts accepted after a stop
token (or past max_tokens) inside the accepted prefix are counted though never emitted. The aggregates cannot
show it (they hold no committed length); the trace decides: the request's last step has
accepted_depth + 1 > commit_len.

The server is then killed with SIGKILL (no shutdown): the trace it leaves must be readable,
hold every step, and be reported incomplete, as any specaudit trace of a killed run.

Loopback only, bounded, the server killed in a finalizer; failures fail (no skip).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_vllm_live import MAX_TOKENS, PROMPTS, run_prompts, wait_log_settled  # noqa: E402
from vllm_patch import patched_vllm  # noqa: E402
from vllm_server import REPO, VllmServer, tiny_pair, vllm_python  # noqa: E402

pytestmark = pytest.mark.slow
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3}

PATCHES = {
    # block: the bonus token counted into each step's accepted entry of the detailed block
    "v1/metrics/stats.py": [("            self.per_step_accepted.append(num_accepted)\n",
                             "            self.per_step_accepted.append(num_accepted + 1)\n")],
    # 34734: a decode step without (valid) drafts observed as a draft of 0 tokens
    "v1/core/sched/scheduler.py": [
        ("            if scheduled_spec_token_ids and (\n"
         "                generated_token_ids or self.num_sampled_tokens_per_step == 0\n"
         "            ):\n"
         "                num_draft_tokens = len(scheduled_spec_token_ids)\n",
         "            if (scheduled_spec_token_ids or (self.num_spec_tokens and generated_token_ids\n"
         "                                             and request.num_output_tokens > 0)) and (\n"
         "                generated_token_ids or self.num_sampled_tokens_per_step == 0\n"
         "            ):\n"
         "                scheduled_spec_token_ids = scheduled_spec_token_ids or []\n"
         "                num_draft_tokens = len(scheduled_spec_token_ids)\n"),
        ("        if not self.log_stats or not num_draft_tokens:\n            return None\n",
         "        if not self.log_stats:\n            return None\n")],
}


def _rows(run_dir: Path) -> list[dict]:
    import pyarrow.parquet as pq
    return [r for f in sorted(run_dir.glob("steps-*.parquet")) for r in pq.read_table(f).to_pylist()]


def _stop_probes(rows: list[dict], responses: list[dict]):
    """(prompt index, request options) that end a greedy request inside an accepted prefix:
    first stop tokens (the token's first appearance in the output is an accepted draft
    followed by more accepted drafts in its step: the EOS case of #56101), then max_tokens
    limits at such a place (the same count at the token limit)."""
    stops, limits = [], []
    for i, resp in enumerate(responses):
        rid = resp["id"] + "-"
        steps = sorted((r for r in rows if r["request_id"].startswith(rid)), key=lambda r: r["step"])
        out = [*resp["choices"][0]["token_ids"]]
        offset = 1                                   # the prefill's token comes first
        for r in steps:
            c, a = r["committed_tokens"], len(r["accepted_path"]) - 1
            if not r["finished"]:
                for j in range(a - 1):               # at least one accepted draft after position j
                    if c[j] not in out[:offset + j]:
                        stops.append((i, {"stop_token_ids": [c[j]]}))
                        break
                if a >= 2:
                    limits.append((i, {"max_tokens": offset + 1}))   # ends on the step's first token
            offset += len(c)
    return stops[:2] + limits[:2]


def _cut_after_stop(rows: list[dict], resp: dict) -> bool:
    return any(r["request_id"].startswith(resp["id"] + "-") and r["finished"]
               and r["accepted_depth"] + 1 > r["commit_len"] for r in rows)


@pytest.fixture(scope="module")
def bugs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_bugs")
    py = vllm_python()
    site = patched_vllm(py, tmp / "site", PATCHES)
    model = tiny_pair()["target"]
    run_dir = tmp / "traces" / "run_id=patched"
    srv = VllmServer(py, model, tmp / "patched.log", spec=NGRAM, trace_dir=tmp / "traces", run_id="patched",
                     pythonpath=f"{site}:{REPO}")
    try:
        srv.wait_ready()
        before = srv.metrics()
        resps = run_prompts(srv, PROMPTS)
        time.sleep(2.0)                      # the plugin flushes every 0.5 s, also when idle
        # the same greedy request again with a stop token that lands inside an accepted
        # prefix (batching may shift a near-tie, so up to three candidates are tried)
        stops, hit = [], None
        for i, opts in _stop_probes(_rows(run_dir), resps):
            kw = {"max_tokens": MAX_TOKENS, "return_token_ids": True, "ignore_eos": True, **opts}
            r = srv.complete(PROMPTS[i], kw.pop("max_tokens"), **kw)
            stops.append(r)
            time.sleep(1.5)
            if _cut_after_stop(_rows(run_dir), r):
                hit = (r, opts)
                break
        assert hit is not None, f"no stop landed inside an accepted prefix ({len(stops)} tried)"
        wait_log_settled(srv)
        after = srv.metrics()
        time.sleep(1.5)      # the idle flusher's interval (0.5 s) several times over
        srv.kill()           # SIGKILL, no shutdown: the trace must stand as the plugin left it
        from specaudit.audit.sources.vllm_crosscheck import crosscheck
        out = crosscheck(run_dir, srv.log(), before, after, resps + stops)
        yield {"out": out, "rows": _rows(run_dir), "resps": resps, "stop": hit[0], "tok": hit[1], "log": srv.log(),
               "run_dir": run_dir, "n_requests": len(resps) + len(stops)}
    finally:
        srv.kill()


def _bad(out, surface, what):
    return [m for m in out["mismatches"] if m["surface"] == surface and what in m["what"]]


def test_the_patched_copy_really_ran(bugs):
    assert "per_step_accepted" in json.dumps(bugs["resps"][0]["metrics"])
    # the miscount is visible in vLLM's own block: one more than the histogram's count per step
    b = bugs["resps"][0]["metrics"]["speculative_decoding"]
    assert sum(b["per_step_accepted"]) == b["num_accepted_draft_tokens"] + len(b["per_step_accepted"])


def test_per_request_block_miscount_is_caught_from_vllms_own_outputs(bugs):
    own = _bad(bugs["out"], "vllm-own", "sum(per_step_accepted) = num_accepted_draft_tokens")
    assert len(own) >= len(PROMPTS) - 1, bugs["out"]["mismatches"]
    # and the trace says exactly how: +1 on every step
    # (the 34734 fixture adds draft-less entries to the same arrays: compared where drafted)
    blocks = {r["id"]: r["metrics"]["speculative_decoding"] for r in bugs["resps"]}
    tr = _bad(bugs["out"], "per-request", "per_step_accepted")
    assert tr
    for m in tr:
        b = blocks.get(m["what"].split(":")[0])
        if b is None:
            continue
        shown = [a for a, d in zip(b["per_step_accepted"], b["per_step_drafted"]) if d > 0]
        assert len(shown) == len(m["trace"]) and all(v == t + 1 for t, v in zip(m["trace"], shown)), m


def test_drafts_counted_for_steps_without_drafts_are_caught(bugs):
    no_draft_steps = sum(1 for r in bugs["rows"] if len(r["node_tokens"]) == 1)
    assert no_draft_steps > 0, "no decode step without drafts happened: the fault had nothing to act on"
    own = _bad(bugs["out"], "vllm-own", "spec steps that drafted nothing")
    assert own, bugs["out"]["mismatches"]
    (m,) = _bad(bugs["out"], "/metrics", "spec_decode_num_drafts_total")
    assert m["vllm"] - m["trace"] == no_draft_steps       # the trace decides by how many


def test_drafts_accepted_past_a_stop_or_the_limit_are_counted_by_stock_vllm_56101(bugs):
    opts = bugs["tok"]
    if "stop_token_ids" in opts:
        assert bugs["stop"]["choices"][0]["token_ids"][-1] == opts["stop_token_ids"][0]
    else:
        assert len(bugs["stop"]["choices"][0]["token_ids"]) == opts["max_tokens"]
    (m,) = _bad(bugs["out"], "trace", "#56101")
    hits = [t for t in m["trace"] if t[0].startswith(bugs["stop"]["id"] + "-")]
    assert m["vllm"] >= 1 and len(hits) == 1
    _rid, _step, depth, commit = hits[0]
    assert depth + 1 > commit
    # the aggregates agree with the trace's accepted paths: they cannot show it
    assert not _bad(bugs["out"], "log", "Accepted")
    assert not _bad(bugs["out"], "/metrics", "num_accepted_tokens_total")


def test_a_killed_server_leaves_a_readable_trace_reported_incomplete(bugs):
    import subprocess
    p = subprocess.run([sys.executable, "-m", "specaudit", "check", str(bugs["run_dir"]), "--output-format", "json"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    rep = json.loads(p.stdout)
    assert p.returncode == 0 and rep["summary"]["bad_files"] == 0, p.stdout[-3000:]
    assert rep["summary"]["incomplete_runs"] == 1 and any(f["code"] == "SA001" for f in rep["findings"])
    # nothing was lost: every request and all its steps were flushed before the kill
    assert rep["summary"]["requests"] == bugs["n_requests"]
    assert sum(len(r["committed_tokens"]) for r in bugs["rows"]) + bugs["n_requests"] == \
        bugs["out"]["trace"]["generated"]
