"""JSON and JSONL records of spec-decoding figures, one Window per record.

A file is either one JSON document (an object, or a list such as TensorRT-LLM's
`GET /metrics`), or JSONL (one object per line, `data: ` server-sent-event prefixes
allowed). Each record is recognised by its keys:

    vllm-request     {"metrics": {"speculative_decoding": {"mean_acceptance_length": 1.23,
                     "draft_acceptance_rate": 0.078, "acceptance_histogram": [39, 1, 0, 3],
                     "num_spec_steps": 43, "num_accepted_draft_tokens": 10, "num_draft_tokens": 129,
                     "num_spec_tokens": 3}}}   (--per-request-spec-decode-metrics, 2026)
    sglang-request   {"meta_info": {"spec_verify_ct": 43, ...}} with accepted / proposed drafts under
                     the name of its version: spec_accept_token_num / spec_draft_token_num (<= 0.5.10),
                     spec_accepted_drafts / spec_proposed_drafts (0.5.11), spec_num_correct_drafts /
                     spec_num_proposed_drafts (>= 0.5.12), plus spec_accept_length (completion tokens /
                     verify count, bonus counted), spec_accept_rate, spec_correct_drafts_histogram
    trtllm-iter      {"iter": 60, "specDecodingStats": {"numDraftTokens": .., "numAcceptedTokens": ..,
                     "numRequestsWithDraftTokens": .., "acceptanceLength": .., "draftOverhead": ..}}
    trtllm-request   {"request_perf_metrics": {"speculative_decoding": {"acceptance_rate": 0.75,
                     "total_accepted_draft_tokens": 30, "total_draft_tokens": 40}}} and the per-request
                     payload {"num_spec_steps", "total_accepted_draft_tokens", "total_draft_tokens",
                     "acceptance_histogram", "num_spec_tokens"} (PR 19311)
    llamacpp-timings {"timings": {"predicted_n": 200, "draft_n": 347, "draft_n_accepted": 65}}
    aiperf           {"metrics": {"spec_decode_acceptance_length": {"value": 2.1}, "spec_decode_steps":
                     .., "spec_decode_accepted_draft_tokens": .., "spec_decode_draft_tokens": ..,
                     "spec_decode_draft_acceptance_rate": (percent)}}  (profile_export.jsonl)
"""
from __future__ import annotations

import json
import math

from specaudit.audit.sources.reading import LineParser, Reading, Window

MAX_BYTES = 512 * 1024 * 1024  # a JSON document (not JSONL) is parsed whole: refuse absurd ones

TOKENSPEED_KEYS = ("spec_accepted_tokens", "spec_draft_tokens")   # TokenSpeed PR 1443 (Sep 2026)
SGLANG_KEYS = (  # (accepted, proposed, version) by release
    ("spec_num_correct_drafts", "spec_num_proposed_drafts", ">= 0.5.12 (spec_num_correct_drafts)"),
    ("spec_accepted_drafts", "spec_proposed_drafts", "0.5.11 (spec_accepted_drafts)"),
    ("spec_accept_token_num", "spec_draft_token_num", "<= 0.5.10 (spec_accept_token_num)"),
)
HIST_CONV = "h[i] = verify steps that accepted exactly i drafts (bonus excluded): sum(h) = steps, sum(i*h_i) = accepted"


def looks_like_first(s: str) -> bool:
    """The first non-blank line of a JSON document or of JSONL (not a '[2026-...] log' line)."""
    s = s[6:].lstrip() if s.startswith("data: ") else s.strip()
    if s in ("[", "{") or s.startswith('{"') or s.startswith("[{") or s.startswith('["') or s.startswith("[]"):
        return True
    if s[:1] in "[{":
        try:
            json.loads(s)
        except (ValueError, RecursionError):
            return False
        return True
    return False


def looks_like_line(line: str) -> bool:  # JSON is detected by its first character only
    return False


def _num(x):
    """A finite number or None (bools are not numbers; 'value' dicts are unwrapped)."""
    if isinstance(x, dict) and "value" in x:
        x = x["value"]
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        x = float(x)
    except (OverflowError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _bad(*vals) -> bool:
    """Some value is present but not a finite number (nan, inf, a string)."""
    for v in vals:
        if v is None:
            continue
        if isinstance(v, dict) and "value" in v:
            v = v["value"]
        if _num(v) is None:
            return True
    return False


def _hist(h):
    if isinstance(h, dict):  # AIPerf: {"0": 1, "1": 1, "2": 2, ...} (accepted drafts -> steps)
        try:
            idx = {int(k): v for k, v in h.items()}
        except (TypeError, ValueError):
            return None
        if not idx or min(idx) < 0 or max(idx) > 4096:
            return None
        h = [idx.get(i, 0) for i in range(max(idx) + 1)]
    if not isinstance(h, list):
        return None
    out = [_num(x) for x in h]
    return None if any(x is None for x in out) else out


def _find(obj, keys, depth=0):
    """The first dict (obj or nested under common wrappers, or in its first choice)
    holding any of `keys`."""
    if not isinstance(obj, dict) or depth > 4:
        return None
    if any(k in obj for k in keys):
        return obj
    ch = obj.get("choices")
    if isinstance(ch, list) and ch and isinstance(ch[0], dict):
        got = _find(ch[0], keys, depth + 1)
        if got is not None:
            return got
    for wrap in ("metrics", "speculative_decoding", "request_perf_metrics", "meta_info", "data", "sglext",
                 "spec_decode_stats", "speculative_decoding_stats", "timings", "usage"):
        if wrap in obj:
            got = _find(obj[wrap], keys, depth + 1)
            if got is not None:
                return got
    return None


def window_of(obj, line: int) -> tuple[Window | None, str | None]:
    """(Window, None) for a record with spec figures, (None, reason) for a record whose
    figures are unusable, (None, None) for a record that carries none."""
    if not isinstance(obj, dict):
        return None, None
    # TensorRT-LLM iteration stats
    if "specDecodingStats" in obj:
        sd = obj["specDecodingStats"]
        if not isinstance(sd, dict):
            return None, None  # null: speculative decoding off (or the C++ TRT backend without it)
        vals = [sd.get(k) for k in ("numDraftTokens", "numAcceptedTokens", "numRequestsWithDraftTokens",
                                    "acceptanceLength")]
        if _bad(*vals):
            return None, "TensorRT-LLM specDecodingStats value that is not a finite number"
        w = Window(line=line, engine="trtllm", kind="interval", version="iteration stats (specDecodingStats)")
        w.draft_tokens, w.accepted_tokens = _num(sd.get("numDraftTokens")), _num(sd.get("numAcceptedTokens"))
        w.drafts = _num(sd.get("numRequestsWithDraftTokens"))
        w.accept_len = _num(sd.get("acceptanceLength"))
        if w.draft_tokens == 0 and not w.accepted_tokens and not w.drafts:
            return None, None  # an iteration without drafts (prefill): nothing to audit
        ib = obj.get("inflightBatchingStats") or {}
        w.concurrency = _num(ib.get("numGenRequests")) if isinstance(ib, dict) else None
        if isinstance(ib, dict) and _num(ib.get("avgNumDecodedTokensPerIter")) is not None:
            w.extra["avg_decoded_per_iter"] = _num(ib.get("avgNumDecodedTokensPerIter"))
        w.extra["iter"] = obj.get("iter")
        w.conventions = {"accept_len": "(numAcceptedTokens + numRequestsWithDraftTokens) / numRequestsWithDraftTokens:"
                                       " counts the bonus token"}
        w.text = f"iter {obj.get('iter', '?')}: specDecodingStats {json.dumps(sd)[:200]}"
        return w, None
    # AIPerf profile_export record
    m = obj.get("metrics") if isinstance(obj.get("metrics"), dict) else None
    if m is not None and any(str(k).startswith("spec_decode_") for k in m):
        keys = ("spec_decode_acceptance_length", "spec_decode_draft_acceptance_rate", "spec_decode_steps",
                "spec_decode_accepted_draft_tokens", "spec_decode_draft_tokens")
        if _bad(*(m.get(k) for k in keys)):
            return None, "AIPerf spec_decode value that is not a finite number"
        w = Window(line=line, engine="aiperf", kind="interval", version="AIPerf profile_export record")
        w.accept_len = _num(m.get(keys[0]))
        rate = _num(m.get(keys[1]))
        w.accept_rate = rate / 100.0 if rate is not None else None
        if w.accept_rate is not None:
            w.extra["printed_rate"] = (w.accept_rate, 1e-6)
        w.drafts, w.accepted_tokens, w.draft_tokens = (_num(m.get(k)) for k in keys[2:])
        w.conventions = {"accept_len": "1 + accepted / steps per request (bonus counted)",
                         "accept_rate": "accepted / drafted (percent in the export)"}
        # the engine-neutral record beside the metrics (AIPerf PR 1191): histogram and k
        sda = obj.get("spec_decode_acceptance")
        if isinstance(sda, dict):
            if _bad(sda.get("num_spec_tokens")):
                return None, "AIPerf spec_decode_acceptance value that is not a finite number"
            w.histogram = _hist(sda.get("acceptance_histogram"))
            if w.histogram is not None:
                w.conventions["histogram"] = HIST_CONV
            k = _num(sda.get("num_spec_tokens"))
            if k is not None and k > 0:
                w.k = int(k)
                drafted = sda.get("per_step_drafted")
                # every step drafted k tokens: drafted = steps x k must hold exactly
                w.extra["fixed_block"] = isinstance(drafted, list) and bool(drafted) and all(
                    _num(x) == k for x in drafted)
            if isinstance(sda.get("engine"), str):
                w.version = f"AIPerf profile_export record ({sda['engine'][:20]} stats)"
        w.text = "AIPerf record " + json.dumps({k: m.get(k) for k in keys})[:200]
        return w, None
    # FastDeploy speculate_metrics (per request, PR 5518 / 5952)
    holder = _find(obj, ("speculate_metrics",))
    if holder is not None and isinstance(holder.get("speculate_metrics"), dict):
        return _fastdeploy(holder["speculate_metrics"], line)
    # vLLM per-request metrics.speculative_decoding / TensorRT-LLM per-request payload
    sd = _find(obj, ("num_spec_steps", "total_draft_tokens", "num_accepted_draft_tokens"))
    if sd is not None:
        fields = ("mean_acceptance_length", "draft_acceptance_rate", "acceptance_rate", "num_spec_steps",
                  "num_accepted_draft_tokens", "num_draft_tokens", "total_accepted_draft_tokens",
                  "total_draft_tokens", "num_spec_tokens")
        if _bad(*(sd.get(k) for k in fields)):
            return None, "per-request speculative_decoding value that is not a finite number"
        trt = "total_draft_tokens" in sd or "total_accepted_draft_tokens" in sd
        w = Window(line=line, kind="interval", engine="trtllm" if trt else "vllm")
        w.version = ("per-request speculative_decoding (TensorRT-LLM)" if trt
                     else "per-request metrics.speculative_decoding (--per-request-spec-decode-metrics)")
        w.drafts = _num(sd.get("num_spec_steps"))
        w.accepted_tokens = _num(sd.get("total_accepted_draft_tokens", sd.get("num_accepted_draft_tokens")))
        w.draft_tokens = _num(sd.get("total_draft_tokens", sd.get("num_draft_tokens")))
        w.accept_len = _num(sd.get("mean_acceptance_length"))
        w.accept_rate = _num(sd.get("draft_acceptance_rate", sd.get("acceptance_rate")))
        if w.accept_rate is not None:
            w.extra["printed_rate"] = (w.accept_rate, 1e-6)
        if w.accept_len is not None:
            w.extra["printed_len"] = (w.accept_len, 1e-6)
        k = _num(sd.get("num_spec_tokens"))
        w.k = int(k) if k is not None else None
        w.histogram = _hist(sd.get("acceptance_histogram"))
        w.extra["fixed_block"] = w.k is not None
        w.conventions = {"accept_rate": "accepted draft tokens / drafted tokens (bonus excluded)"}
        if w.accept_len is not None:
            w.conventions["accept_len"] = "1 + accepted / spec steps: counts the bonus token"
        if w.histogram is not None:
            w.conventions["histogram"] = HIST_CONV
        w.text = json.dumps(sd)[:300]
        avg = _num(obj.get("avg_decoded_tokens_per_iter")) if isinstance(obj, dict) else None
        if avg is None and isinstance(obj.get("choices"), list) and obj["choices"] \
                and isinstance(obj["choices"][0], dict):
            avg = _num(obj["choices"][0].get("avg_decoded_tokens_per_iter"))
        if avg is not None:
            w.extra["avg_decoded_per_iter"] = avg
        return w, None
    # SGLang meta_info
    mi = _find(obj, ("spec_verify_ct", "spec_accept_length", "spec_accept_token_num", "spec_accepted_drafts",
                     "spec_num_correct_drafts", "spec_accepted_tokens"))
    if mi is not None and TOKENSPEED_KEYS[0] in mi:
        return _tokenspeed_meta(mi, line)
    if mi is not None:
        names = [k for k in mi if str(k).startswith("spec_")]
        if _bad(*(mi.get(k) for k in names if k != "spec_correct_drafts_histogram")):
            return None, "SGLang meta_info spec value that is not a finite number"
        w = Window(line=line, engine="sglang", kind="interval")
        for acc, prop, ver in SGLANG_KEYS:
            if acc in mi or prop in mi:
                w.accepted_tokens, w.draft_tokens, w.version = _num(mi.get(acc)), _num(mi.get(prop)), ver
                break
        else:
            w.version = "meta_info without accepted / proposed counts (version not inferable)"
        w.drafts = _num(mi.get("spec_verify_ct"))
        w.accept_len = _num(mi.get("spec_accept_length"))
        w.accept_rate = _num(mi.get("spec_accept_rate"))
        if w.accept_rate is not None:
            w.extra["printed_rate"] = (w.accept_rate, 1e-6)
        ct = _num(mi.get("completion_tokens"))
        if ct is not None:
            w.extra["completion_tokens"] = ct
        w.histogram = _hist(mi.get("spec_correct_drafts_histogram"))
        if w.histogram is not None:
            w.k = len(w.histogram) - 1
            w.conventions["histogram"] = HIST_CONV
        w.extra["fixed_block"] = True
        w.conventions.update({"accept_len": "completion tokens / spec_verify_ct (bonus counted)",
                              "accept_rate": "accepted / proposed drafts (names with 'correct' exclude the bonus)"})
        w.text = json.dumps({k: mi.get(k) for k in names})[:300]
        if w.drafts is None and w.accept_len is None and w.accepted_tokens is None:
            return None, None
        return w, None
    # llama.cpp timings
    t = _find(obj, ("draft_n", "draft_n_accepted"))
    if t is not None:
        if _bad(t.get("draft_n"), t.get("draft_n_accepted"), t.get("predicted_n")):
            return None, "llama.cpp timings value that is not a finite number"
        if "draft_rounds" in t or "draft_kind" in t:
            return _mlx_vlm_timings(t, line)
        w = Window(line=line, engine="llamacpp", kind="interval", version="timings (draft_n, PR 12603)")
        w.draft_tokens, w.accepted_tokens = _num(t.get("draft_n")), _num(t.get("draft_n_accepted"))
        if _num(t.get("predicted_n")) is not None:
            w.extra["generated_tokens"] = _num(t.get("predicted_n"))
        w.conventions = {"accept_rate": "draft_n_accepted / draft_n (drafts sent to verification)"}
        w.text = json.dumps({k: t.get(k) for k in ("predicted_n", "draft_n", "draft_n_accepted")})
        return w, None
    return None, None


def _mlx_vlm_timings(t: dict, line: int):
    """mlx-vlm's response timings (PR 1788): llama.cpp's names plus draft_kind and
    draft_rounds (verify steps). Generated tokens = accepted drafts + one per round (and
    the first token, when the request's count includes it): predicted_n >= rounds + accepted."""
    if _bad(t.get("draft_rounds"), t.get("draft_n"), t.get("draft_n_accepted"), t.get("predicted_n")):
        return None, "mlx-vlm timings value that is not a finite number"
    kind = t.get("draft_kind") if isinstance(t.get("draft_kind"), str) else None
    w = Window(line=line, engine="mlx-vlm", kind="interval",
               version=f"response timings with draft_rounds (PR 1788){', ' + kind[:20] if kind else ''}")
    w.drafts = _num(t.get("draft_rounds"))
    w.draft_tokens, w.accepted_tokens = _num(t.get("draft_n")), _num(t.get("draft_n_accepted"))
    if w.drafts is None and w.draft_tokens is None and w.accepted_tokens is None:
        return None, None   # a run without a drafter: every field null
    if _num(t.get("predicted_n")) is not None:
        w.extra["output_tokens"] = _num(t.get("predicted_n"))   # SA731: >= rounds + accepted
    w.conventions = {"accept_rate": "draft_n_accepted / draft_n (no rate or length printed: the counts only)"}
    w.text = json.dumps({k: t.get(k) for k in ("predicted_n", "draft_kind", "draft_rounds", "draft_n",
                                               "draft_n_accepted")})
    return w, None


FD_RATIO = ("accept_ratio as FastDeploy prints it; with per-head counts it reads as accepted drafts / emitted tokens "
            "(1 - 1 / average_accept_length), not accepted / drafted (SA729 sizes the difference)")
FD_LEN = "accepted_tokens / verify steps (head 0 counts every step): counts the bonus token"


def _fastdeploy(sm: dict, line: int):
    """FastDeploy's speculate_metrics: accepted_tokens, rejected_tokens, accept_ratio,
    average_accept_length, accepted_tokens_per_head [h0, h1, ...] (h0 = verify steps: the
    target's own token, accepted every step; h_i = steps accepting draft i) and
    accept_ratio_per_head (h_(i+1) / h_i, conditional)."""
    keys = ("accepted_tokens", "rejected_tokens", "accept_ratio", "average_accept_length")
    heads = sm.get("accepted_tokens_per_head")
    if _bad(*(sm.get(k) for k in keys)) or (heads is not None and _hist(heads) is None):
        return None, "FastDeploy speculate_metrics value that is not a finite number"
    acc, rej, ratio, avg = (_num(sm.get(k)) for k in keys)
    w = Window(line=line, engine="fastdeploy", kind="interval", version="speculate_metrics (PR 5952: per head)"
               if heads is not None else "speculate_metrics (PR 5518)")
    w.accept_len = avg
    w.conventions = {"accept_len": FD_LEN, "accept_rate": FD_RATIO}
    h = _hist(heads) if heads is not None else None
    if h and h[0] > 0 and acc is not None and rej is not None:
        steps, drafts_acc = h[0], sum(h[1:])
        w.drafts, w.accepted_tokens = steps, drafts_acc
        w.draft_tokens = rej + drafts_acc          # drafted = accepted drafts + rejected
        w.k = len(h) - 1 if len(h) > 1 else None
        w.per_pos_counts = h[1:]
        w.per_pos = [c / steps for c in h[1:]]
        w.per_pos_kind = "verify_steps"
        w.extra["fixed_block"] = False
        w.extra["emitted_total"] = acc              # the printed accepted_tokens: drafts + one per step
        if ratio is not None:
            w.extra["ratio_with_bonus"] = ratio
        cond = sm.get("accept_ratio_per_head")
        if isinstance(cond, list) and not _bad(*cond):
            w.extra["conditional_per_head"] = [_num(x) for x in cond]
    else:
        w.accept_rate = ratio                       # no per-head counts: the ratio as printed
    w.text = "speculate_metrics " + json.dumps({k: sm.get(k) for k in keys})[:200]
    return w, None


def _tokenspeed_meta(mi: dict, line: int):
    """TokenSpeed's meta_info (PR 1443): spec_verify_ct, spec_accepted_tokens = completion
    tokens - 1 - verify steps (one token from prefill, one bonus per step), spec_draft_tokens
    = verify steps x (num_draft_tokens - 1) (slot 0 is the verified root, no draft)."""
    names = [k for k in mi if str(k).startswith("spec_")] + ["completion_tokens"]
    if _bad(*(mi.get(k) for k in names)):
        return None, "TokenSpeed meta_info value that is not a finite number"
    w = Window(line=line, engine="tokenspeed", kind="interval", version="meta_info spec_accepted_tokens (PR 1443)")
    w.drafts = _num(mi.get("spec_verify_ct"))
    w.accepted_tokens, w.draft_tokens = _num(mi.get(TOKENSPEED_KEYS[0])), _num(mi.get(TOKENSPEED_KEYS[1]))
    ct = _num(mi.get("completion_tokens"))
    if ct is not None:
        w.extra["output_tokens"] = ct          # >= verify steps + accepted (SA731)
    if w.drafts and w.draft_tokens is not None and w.drafts > 0:
        per = w.draft_tokens / w.drafts
        if abs(per - round(per)) < 1e-9 and per >= 1:
            w.k = int(round(per))              # a fixed block: drafted = steps x (num_draft_tokens - 1)
            w.extra["fixed_block"] = True
    w.conventions = {"accept_rate": "spec_accepted_tokens / spec_draft_tokens (drafts only, root slot excluded)"}
    w.text = json.dumps({k: mi.get(k) for k in names})[:300]
    if w.drafts is None and w.accepted_tokens is None:
        return None, None
    return w, None


def engine_shape(obj) -> str | None:
    """The engine record a JSON object is by its own keys, figures or not (TensorRT-LLM
    iteration stats with specDecodingStats null, an SGLang response's meta_info, a vLLM
    per-request record, llama.cpp timings), or None."""
    if not isinstance(obj, dict):
        return None
    if "specDecodingStats" in obj and "iter" in obj:
        return "TensorRT-LLM iteration stats"
    if isinstance(obj.get("meta_info"), dict) and ("completion_tokens" in obj["meta_info"]
                                                   or "prompt_tokens" in obj["meta_info"]):
        return "SGLang response meta_info"
    if isinstance(obj.get("timings"), dict) and "predicted_n" in obj["timings"]:
        return "llama.cpp response timings"
    return None


class Parser(LineParser):
    source = "json-records"
    engine = "json"

    def __init__(self, path: str):
        super().__init__(path)
        self.mode = None          # "jsonl" | "doc"
        self.buf: list[str] = []
        self.buf_bytes = 0
        self.doc_line = 1
        self.too_big = False

    recognised = None   # an engine's record shape seen without figures (sources.reading.NoFigures)

    def _record(self, obj, line):
        if self.recognised is None:
            self.recognised = engine_shape(obj)
        w, why = window_of(obj, line)
        if why:
            self.skip(line, why, json.dumps(obj)[:200] if isinstance(obj, dict) else "")
        elif w is not None:
            self.reading.windows.append(w)

    def feed(self, i: int, raw: str) -> None:
        s = raw.strip()
        if not s:
            return
        if s.startswith("data: "):
            s = s[6:].strip()
            if s == "[DONE]":
                return
        if self.mode is None:
            if s.startswith("{"):
                try:
                    obj = json.loads(s)
                except (ValueError, RecursionError):
                    self.mode, self.doc_line = "doc", i
                else:
                    self.mode = "jsonl"
                    self._record(obj, i)
                    return
            else:
                self.mode, self.doc_line = "doc", i
        if self.mode == "jsonl":
            try:
                obj = json.loads(s)
            except (ValueError, RecursionError) as e:
                self.skip(i, f"unreadable JSON record ({str(e)[:60]})", raw)
                return
            self._record(obj, i)
            return
        if self.too_big:
            return
        self.buf_bytes += len(raw) + 1
        if self.buf_bytes > MAX_BYTES:
            self.too_big = True
            self.skip(self.doc_line, f"JSON document over {MAX_BYTES // 2**20} MiB: write JSONL (one record a line) "
                                     "to audit it streamed")
            self.buf = []
            return
        self.buf.append(raw)

    def finish(self) -> Reading:
        if self.mode == "doc" and self.buf:
            text = "\n".join(self.buf)
            self.buf = []
            try:
                doc = json.loads(text)
            except (ValueError, RecursionError) as e:
                self.skip(self.doc_line, f"unreadable JSON document ({str(e)[:80]})")
                doc = None
            items = doc if isinstance(doc, list) else ([doc] if doc is not None else [])
            if isinstance(doc, dict):
                for key in ("records", "iterationStats", "results"):
                    if isinstance(doc.get(key), list):
                        items = doc[key]
                        break
            for n, obj in enumerate(items):
                self._record(obj, self.doc_line + n if isinstance(doc, list) else self.doc_line)
        return super().finish()

    def finalize(self, reading) -> None:
        engines = {w.engine for w in reading.windows}
        if len(engines) == 1:
            reading.engine = engines.pop()
        elif engines:
            reading.engine = "mixed"
        reading.version = next((w.version for w in reading.windows if w.version), None)


def parse(text: str, path: str) -> Reading:
    p = Parser(path)
    for i, ln in enumerate(text.splitlines(), 1):
        p.feed(i, ln)
    return p.finish()
