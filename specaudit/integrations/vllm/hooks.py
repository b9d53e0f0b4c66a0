"""The places the plugin wraps inside vLLM (0.32.0; versions.py), and what each captures.

Worker side (the model runner; on CPU and single-GPU vLLM it lives in the engine core
process, beside the scheduler):
    GPUModelRunner.execute_model   the time the step's forward started (t_exec)
    GPUModelRunner._sample         called with the verify logits and SpecDecodeMetadata,
                                   while the runner's input buffers still hold what the
                                   forward was fed. For each request r with k drafts its
                                   last k+1 scheduled tokens are the root and the drafts:
                                     flat tokens  query_start_loc[r+1]-(k+1) .. query_start_loc[r+1]
                                     node_tokens  input_ids.gpu[flat]   (fed, not re-derived)
                                     positions    positions[flat]       (fed, not re-derived)
                                     logit rows   cu_num_sampled_tokens[r]-(k+1) .. (with drafts)
                                                  r                                (without)
                                     target_argmax, target_margin: argmax / top-1 minus top-2
                                                  of those logit rows, [k+1]
                                   kept on the runner until sample_tokens returns.
    rejection_sampler.rejection_sample, .generate_uniform_probs   (sampled requests only)
                                   p, q and the uniforms of vLLM's own test (sampling.py):
                                   contract v2 rows for requests with temperature > 0
    GPUModelRunner.sample_tokens   attaches the step's captures to the ModelRunnerOutput it
                                   returns (attribute specaudit_caps, a dict by request id):
                                   on CPU the model runner is a worker process and that
                                   object is pickled to the scheduler's process, so the
                                   evidence travels with the output it describes.
Scheduler side:
    Scheduler.update_from_output   before: each scheduled request's KV length before the
                                   step (num_computed_tokens was advanced at scheduling)
                                   and its output length; its scheduled drafts. After:
                                   the tokens vLLM appended (cut at a stop), finished.
                                   The tokens the rejection sampler returned come from
                                   model_runner_output.sampled_token_ids (its accepted
                                   drafts and one more token: the accepted path).
    Scheduler.shutdown             closes the run (sink.Recorder.close)
    Scheduler.make_spec_decoding_stats   vLLM's own per-step counters, as its metrics see
                                   them: (drafted, accepted) for each request and step.
                                   Recorded as accepted_depth: the thing under audit.

Every wrapper calls vLLM's original first or last and never lets its own failure reach
vLLM: an exception inside the plugin stops recording (sink.Recorder.fail marks the run
incomplete) and vLLM goes on serving.
"""
from __future__ import annotations

import time

_t_exec = [0.0]
# what rejection_sample / generate_uniform_probs saw during the _sample call in flight
# (the model runner is one thread; None when no sampled request is being captured)
_flight: dict = {"c": None}
_installed: list[tuple] = []   # (class, attribute, original) to undo in tests
ATTR = "specaudit_caps"         # the attribute carrying the captures on ModelRunnerOutput


def _wrap(cls, name, make):
    orig = getattr(cls, name)
    setattr(cls, name, make(orig))
    _installed.append((cls, name, orig))


def uninstall() -> None:
    while _installed:
        cls, name, orig = _installed.pop()
        setattr(cls, name, orig)


def install(recorder) -> None:
    """Wrap the scheduler and model runner classes (idempotent per process)."""
    if _installed:
        return
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def make_exec(orig):
        def execute_model(self, *a, **kw):
            _t_exec[0] = time.time()
            return orig(self, *a, **kw)
        return execute_model

    def make_sample(orig):
        def _sample(self, logits, spec_decode_metadata):
            caps = None
            if recorder.active:
                try:
                    caps = capture_worker(self, logits, spec_decode_metadata)
                    _flight["c"] = {} if caps and spec_decode_metadata is not None else None
                except Exception as e:   # never vLLM's problem
                    recorder.fail("worker hook", e)
            try:
                out = orig(self, logits, spec_decode_metadata)
            finally:
                flight, _flight["c"] = _flight["c"], None
            if caps:
                if flight and "p" in flight:
                    try:
                        add_sampling(self, caps, flight, spec_decode_metadata, out)
                    except Exception as e:
                        recorder.fail("worker hook (sampling)", e)
                        caps = None
                for _rid, c in caps or []:
                    c.pop("_raw", None)
                self._specaudit_caps = caps
            return out
        return _sample

    def make_rejection_sample(orig):
        import inspect
        sig = inspect.signature(orig)

        def rejection_sample(*a, **kw):
            c = _flight["c"]
            if c is not None:
                try:
                    b = sig.bind(*a, **kw).arguments
                    sm = b["sampling_metadata"]
                    if not sm.all_greedy:
                        # p as the test uses it: softmax of the processed target logits [num_tokens, V]
                        c["p"] = b["target_logits"].float().softmax(-1)
                        c["q"] = None if b["draft_probs"] is None else b["draft_probs"].float().clone()
                        c["sm"] = sm
                except Exception as e:
                    recorder.fail("worker hook (rejection_sample)", e)
            return orig(*a, **kw)
        return rejection_sample

    def make_uniform(orig):
        def generate_uniform_probs(*a, **kw):
            u = orig(*a, **kw)
            c = _flight["c"]
            if c is not None:
                c["u"] = u.detach().float().cpu().clone()     # [num_tokens]
            return u
        return generate_uniform_probs

    def make_sample_tokens(orig):
        def sample_tokens(self, *a, **kw):
            out = orig(self, *a, **kw)
            caps = self.__dict__.pop("_specaudit_caps", None)
            if caps is not None:
                try:   # pickled with the output to the scheduler's process (a plain dict)
                    setattr(out, ATTR, dict(caps))
                except Exception as e:
                    recorder.fail("worker hook (output)", e)
            return out
        return sample_tokens

    def make_update(orig):
        def update_from_output(self, scheduler_output, model_runner_output):
            pre = None
            if recorder.active:
                try:
                    pre = capture_before(self, scheduler_output, model_runner_output)
                    self._specaudit_counters = {}
                except Exception as e:
                    recorder.fail("scheduler hook (before)", e)
            out = orig(self, scheduler_output, model_runner_output)
            if pre is not None and recorder.active:
                try:
                    counters = getattr(self, "_specaudit_counters", None) or {}
                    self._specaudit_counters = None
                    recorder.on_update(self, pre, counters, time.time())
                except Exception as e:
                    recorder.fail("scheduler hook (after)", e)
            return out
        return update_from_output

    def make_stats(orig):
        def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                                     num_invalid_spec_tokens, request_id):
            c = getattr(self, "_specaudit_counters", None)
            if c is not None:
                invalid = (num_invalid_spec_tokens or {}).get(request_id, 0)
                c[request_id] = (int(num_draft_tokens) - int(invalid), int(num_accepted_tokens))
            return orig(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                        num_invalid_spec_tokens, request_id)
        return make_spec_decoding_stats

    def make_shutdown(orig):
        def shutdown(self):
            try:
                recorder.close()
            except Exception as e:
                recorder.fail("close", e)
            return orig(self)
        return shutdown

    _wrap(GPUModelRunner, "execute_model", make_exec)
    _wrap(Scheduler, "shutdown", make_shutdown)
    _wrap(GPUModelRunner, "_sample", make_sample)
    _wrap(GPUModelRunner, "sample_tokens", make_sample_tokens)
    _wrap(Scheduler, "update_from_output", make_update)
    _wrap(Scheduler, "make_spec_decoding_stats", make_stats)
    from vllm.v1.sample import rejection_sampler as rs
    _wrap(rs, "rejection_sample", make_rejection_sample)
    _wrap(rs, "generate_uniform_probs", make_uniform)


def capture_worker(runner, logits, meta) -> list[tuple[str, dict]]:
    """[(request id, capture)] of one verify forward (module doc: worker side)."""
    import torch
    if logits is None:
        return []
    t = time.time()
    req_ids = list(runner.input_batch.req_ids)
    B = len(req_ids)
    qsl = runner.query_start_loc.cpu[: B + 1].tolist()
    ids = runner.input_ids.cpu if getattr(runner.input_ids, "gpu", None) is None else runner.input_ids.gpu
    pos = runner.positions
    lg = logits.float()                                                  # [rows, V]
    # argmax as vLLM's greedy rejection sampler takes it (logits.argmax: the first of tied
    # maxima; bf16 logits tie often, and topk's order among ties is unspecified)
    argmax = lg.argmax(-1).tolist()
    top2 = torch.topk(lg, 2, dim=-1).values if lg.shape[-1] >= 2 else None   # [rows, 2]
    margin = (top2[:, 0] - top2[:, 1]).tolist() if top2 is not None else [0.0] * lg.shape[0]
    if meta is not None:
        nd = list(meta.num_draft_tokens)
        cu = meta.cu_num_sampled_tokens.tolist()
    else:
        nd, cu = [0] * B, list(range(1, B + 1))
    out = []
    for r, rid in enumerate(req_ids):
        if rid is None or r >= len(nd):
            continue
        n = nd[r] + 1
        lo = qsl[r + 1] - n
        rows = slice(cu[r] - n, cu[r])
        out.append((rid, {
            "node_tokens": ids[lo:qsl[r + 1]].tolist(), "positions": pos[lo:qsl[r + 1]].tolist(),
            "target_argmax": argmax[rows], "target_margin": margin[rows], "batch_size": B,
            "t_exec": _t_exec[0], "t_sample": t, "_raw": lg[rows], "_r": r, "_k": nd[r]}))
    return out


def add_sampling(runner, caps, flight, meta, out) -> None:
    """Contract v2 fields (sampling.py) on the captures of sampled requests."""
    from specaudit.integrations.vllm.sampling import sampled_fields
    sm = flight["sm"]
    temp = sm.temperature.tolist() if sm.temperature is not None else None
    plain = sm.top_k is None and sm.top_p is None
    cu_d = meta.cu_num_draft_tokens.tolist()
    drafts_all = meta.draft_token_ids.tolist()
    toks = out.sampled_token_ids.tolist()                     # [B, max_spec + 1], -1 padded
    for _rid, c in caps:
        r, k = c["_r"], c["_k"]
        if k == 0 or temp is None or temp[r] <= 0:            # greedy request: contract v1 row
            continue
        j0 = cu_d[r] - k
        got = [t for t in toks[r] if t >= 0]
        c["sampling"] = sampled_fields(flight["p"], flight["q"], flight.get("u"), j0, drafts_all[j0:j0 + k], got,
                                       c["_raw"], float(temp[r]), plain)
        c["sampling_params"] = {"temperature": float(temp[r]), "plain": plain}


def capture_before(sched, so, mro) -> dict:
    """Per scheduled request: the request object and its state before vLLM updates it."""
    out = {}
    spec = so.scheduled_spec_decode_tokens or {}
    idx = mro.req_id_to_index or {}
    sampled = mro.sampled_token_ids
    caps = getattr(mro, ATTR, None) or {}
    for rid, n in so.num_scheduled_tokens.items():
        req = sched.requests.get(rid)
        if req is None or rid not in idx:
            continue
        i = idx[rid]
        got = sampled[i] if sampled is not None and i < len(sampled) else []
        out[rid] = {"req": req, "worker": caps.get(rid), "kv_before": int(req.num_computed_tokens) - int(n),
                    "n_sched": int(n),
                    "out_before": int(req.num_output_tokens), "drafts": [int(x) for x in spec.get(rid) or []],
                    "sampled": [int(x) for x in (got.tolist() if hasattr(got, "tolist") else got)]}
    return out
