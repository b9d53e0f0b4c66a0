"""`check --prometheus` reads TensorRT-LLM's draft length k from trtllm_speculative_config_info
{spec_num_tokens} (TensorRT-LLM's metrics collector, log_config_info): its per-position series
name only the positions requests reached, so without k an acceptance length above k + 1
went unseen there (the alert rules caught it)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_prom_http import T0, FakeProm  # noqa: E402  (the fake Prometheus API, after the path set-up)

from specaudit.audit.sources.prom_http import audit_prometheus, read_prometheus  # noqa: E402  (same)

LAB = {"job": "trtllm", "instance": "gpu0:8000", "model_name": "llama-70b"}


def trtllm(accept_len: float, k: int | None):
    """Five scrapes 15 s apart: 100 drafted and 60 accepted tokens per interval (positions 0
    and 1 reached), the acceptance-length gauge, and (when k) the config info series."""
    times = [T0 + 15 * i for i in range(5)]
    out = []
    for name, per in (("trtllm_spec_decode_num_draft_tokens_total", 100.0),
                      ("trtllm_spec_decode_num_accepted_tokens_total", 60.0)):
        out.append(({"__name__": name, **LAB}, [(t, per * i) for i, t in enumerate(times)]))
    out.append(({"__name__": "trtllm_spec_decode_acceptance_length", **LAB}, [(t, accept_len) for t in times]))
    if k is not None:
        info = {"__name__": "trtllm_speculative_config_info", **LAB, "spec_enabled": "true", "spec_method": "Eagle",
                "spec_num_tokens": str(k)}
        out.append((info, [(t, 1.0) for t in times]))
    return out


@pytest.fixture
def prom():
    made = []
    yield lambda series: made.append(FakeProm(series)) or made[-1]
    for f in made:
        f.close()


def _errors(url):
    fs, rs = audit_prometheus(url, range_s=3600, step_s=0, end=T0 + 3000, timeout=10.0)
    return {f.code for f in fs if f.severity == "error"}, rs


def test_k_from_the_config_info_series_catches_accept_length_above_k_plus_one(prom):
    codes, (r,) = _errors(prom(trtllm(accept_len=5.0, k=3)).url)
    assert r.config["num_spec_tokens"] == 3 and all(w.k == 3 for w in r.windows)
    assert "SA705" in codes


def test_a_length_within_k_plus_one_stays_clean(prom):
    codes, (r,) = _errors(prom(trtllm(accept_len=3.4, k=3)).url)
    assert r.windows and codes == set()


def test_without_the_info_series_k_is_unknown_and_said_so(prom):
    f = prom(trtllm(accept_len=5.0, k=None))
    (r,) = read_prometheus(f.url, range_s=3600, step_s=0, end=T0 + 3000, timeout=10.0)
    assert "num_spec_tokens" not in r.config and all(w.k is None for w in r.windows)
