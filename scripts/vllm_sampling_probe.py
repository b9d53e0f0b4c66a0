"""Record vLLM's own rejection-sampling inputs and decisions, step by step (issue 37).

Runs vLLM in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with a draft model and wraps
three functions of vllm.v1.sample.rejection_sampler for the duration of the run:

    apply_sampling_constraints   the logits before (raw) and after temperature, top-k/top-p
    expand_batch_to_tokens       the per-token temperature vLLM really divided by
    generate_uniform_probs       the uniforms of the acceptance test
    rejection_sample             the drafts, the bonus tokens and the sampler's output

and GPUModelRunner._sample (inherited by the CPU runner) for the request ids of the batch.
Nothing is changed in what vLLM computes unless `--fix-expand` is given, which replaces
expand_batch_to_tokens by a plain torch equivalent (repeat_interleave): the control run
that shows what acceptance a correct expansion gives on the same set-up.

Run it with the vLLM venv's python (scripts/vllm_env.sh on branch i36-vllm builds it):

    $VENV/bin/python scripts/vllm_sampling_probe.py --model DIR [--seed 1] [--fix-expand]

It writes one JSON object (--out; its summary also goes to stdout, after vLLM's own lines):
the set-up (date, machine, load, vLLM and torch versions); one row per drafted position
(request, step, position, drafted token, the temperature vLLM used there, vLLM's target
probability of the draft, its probability under the request's own temperature from the
raw logits, the uniform, vLLM's decision, the token vLLM emitted); and a summary
(per-position acceptance, expected acceptance under the request's temperature).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

PROMPTS = [
    "def ", "import os\n", "class Foo:\n    ", "    return ", "for i in range(", "if __name__ == ",
    "# Copyright ", "from collections import ", "    def __init__(self", "try:\n    ", "x = [", "\"\"\"",
]


def _p_of(logits_row, temp, token):
    """Probability of `token` in softmax(logits_row / temp) (float64; temp > 0)."""
    import torch
    z = logits_row.double() / float(temp)
    return float(torch.softmax(z, dim=-1)[token])


state: dict = {}   # {"fix": bool}: whether expand_batch_to_tokens is replaced (flipped by --control)


def build(args):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.worker import gpu_model_runner as gmr

    calls: list[dict] = []      # one entry per rejection_sample call (one verify batch)
    cur: dict = {}              # filled by the wrappers of one forward, then moved into calls
    steps: list[dict] = []      # one entry per (request, sampling forward): the trace's raw material

    orig_sample = gmr.GPUModelRunner._sample

    def _sample(self, logits, meta):
        cur.clear()
        req_ids = list(self.input_batch.req_ids)
        cur["req_ids"] = req_ids
        B = len(req_ids)
        qsl = self.query_start_loc.cpu[: B + 1].tolist()
        ids = self.input_ids.gpu if hasattr(self.input_ids, "gpu") else self.input_ids
        pos = self.positions.gpu if hasattr(self.positions, "gpu") else self.positions
        nd = list(meta.num_draft_tokens) if meta is not None else [0] * B
        cu = meta.cu_num_sampled_tokens.tolist() if meta is not None else list(range(1, B + 1))
        lg = logits.detach().float().clone() if logits is not None else None     # [rows, vocab] raw
        out = orig_sample(self, logits, meta)
        toks = out.sampled_token_ids.tolist()                                     # [B, max_spec + 1]
        u = cur.get("u")
        u_at = 0
        for r, rid in enumerate(req_ids):
            if rid is None or lg is None:
                continue
            n = nd[r] + 1                                  # root + drafts
            lo = qsl[r + 1] - n
            steps.append(dict(rid=rid, t=time.time(), batch=B, node_tokens=ids[lo:qsl[r + 1]].tolist(),
                              positions=pos[lo:qsl[r + 1]].tolist(), raw=lg[cu[r] - n:cu[r]],
                              out=toks[r], u=(u[u_at:u_at + nd[r]].tolist() if u is not None and nd[r] else []),
                              temp_used=(cur["temp_used"][u_at:u_at + nd[r]].tolist()
                                         if "temp_used" in cur and nd[r] else [])))
            u_at += nd[r]
        return out

    orig_expand = rs.expand_batch_to_tokens

    def expand_fixed(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        # [batch] -> [num_tokens]: each request's value repeated once per draft token
        counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=torch.zeros(1, dtype=torch.int64))
        out = torch.repeat_interleave(x, counts, output_size=num_tokens)
        return torch.where(out == replace_from, torch.full_like(out, replace_to), out)

    state["fix"] = bool(args.fix_expand)

    def expand(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        impl = expand_fixed if state["fix"] else orig_expand
        out = impl(x, cu_num_tokens, num_tokens, replace_from, replace_to)
        if x.is_floating_point() and replace_to == 1:     # the temperature call
            cur["temp_in"] = x.detach().clone()
            cur["temp_used"] = out.detach().clone()
        return out

    orig_asc = rs.apply_sampling_constraints

    def asc(logits, cu, sm):
        cur["raw"] = logits.detach().clone()              # [num_tokens, vocab] before temperature
        out = orig_asc(logits, cu, sm)
        cur["processed"] = out.detach().clone()           # what the acceptance test sees
        return out

    orig_uni = rs.generate_uniform_probs

    def uni(*a, **k):
        out = orig_uni(*a, **k)
        cur["u"] = out.detach().clone()
        return out

    orig_rs = rs.rejection_sample

    def rej(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
            target_logits, bonus_token_ids, sampling_metadata, **kw):
        out = orig_rs(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                      draft_probs, target_logits, bonus_token_ids, sampling_metadata, **kw)
        calls.append(dict(cur, drafts=draft_token_ids.detach().clone(), n=list(num_draft_tokens),
                          draft_probs_given=draft_probs is not None,
                          temperature=(None if sampling_metadata.temperature is None
                                       else sampling_metadata.temperature.detach().clone()),
                          out=out.detach().clone()))
        return out

    gmr.GPUModelRunner._sample = _sample
    rs.expand_batch_to_tokens = expand
    rs.apply_sampling_constraints = asc
    rs.generate_uniform_probs = uni
    rs.rejection_sample = rej
    return calls, steps


def rows_of(calls, req_temp):
    """One dict per drafted position of every verify batch, in batch order."""
    import torch
    rows, step_of = [], {}
    for c in calls:
        if "raw" not in c:                                # an all-greedy batch: no temperature path
            continue
        start = 0
        for b, n in enumerate(c["n"]):
            rid = c["req_ids"][b]
            step = step_of.get(rid, 0)
            step_of[rid] = step + 1
            rejected = False
            for j in range(n):
                t = start + j
                d = int(c["drafts"][t])
                T = req_temp
                proc = c["processed"][t].double()
                pv = torch.softmax(proc, dim=-1)
                p_vllm = float(pv[d])
                p_req = _p_of(c["raw"][t], T, d)
                p_t1 = _p_of(c["raw"][t], 1.0, d)
                emitted = int(c["out"][b, j])
                decision = None if rejected else ("accept" if emitted == d else "reject")
                rows.append(dict(
                    request=rid, step=step, position=j, drafted=d,
                    target_argmax=int(c["raw"][t].argmax()),
                    temp_request=T, temp_used=float(c["temp_used"][t]) if "temp_used" in c else None,
                    p_target_vllm=None if math.isnan(p_vllm) else p_vllm,
                    p_target_nan=bool(torch.isnan(pv).any()),
                    p_target_at_request_temp=p_req, p_target_at_temp_1=p_t1,
                    u=float(c["u"][t]) if "u" in c else None,
                    decision=decision, emitted=emitted if decision else None,
                    draft_probs_given=c["draft_probs_given"]))
                rejected = rejected or decision == "reject"
            start += n
    return rows


def summary(rows, k):
    out = {"verify_rows": sum(1 for r in rows if r["position"] == 0), "per_position": []}
    for j in range(k):
        tested = [r for r in rows if r["position"] == j and r["decision"]]
        acc = sum(r["decision"] == "accept" for r in tested)
        exp = sum(min(1.0, r["p_target_at_request_temp"]) for r in tested)
        temps = [r["temp_used"] for r in tested if r["temp_used"] is not None]
        out["per_position"].append(dict(
            position=j, tested=len(tested), accepted=acc,
            rate=acc / len(tested) if tested else None,
            expected_rate_at_request_temp=exp / len(tested) if tested else None,
            temp_used_equal_request=sum(abs(t - r["temp_request"]) < 1e-6 for t, r in zip(temps, tested)),
            p_target_nan=sum(r["p_target_nan"] for r in tested)))
    tested = [r for r in rows if r["decision"]]
    out["tested"] = len(tested)
    out["accepted"] = sum(r["decision"] == "accept" for r in tested)
    out["expected_accepts_at_request_temp"] = sum(min(1.0, r["p_target_at_request_temp"]) for r in tested)
    used = [r["temp_used"] for r in rows if r["temp_used"] is not None]
    out["temp_used_distinct"] = sorted({float(f"{t:.6g}") for t in used})[:20]
    return out


def one_pass(args, llm, prompts, params, calls, steps, t0, trace_dir) -> dict:
    """Generate once, then the JSON of that pass (and its trace when trace_dir is set)."""
    import torch
    import vllm
    t_gen = time.time()
    outs = llm.generate(prompts, params, use_tqdm=False)
    trace = None
    if trace_dir:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from vllm_probe_trace import write_trace
        got = [dict(request_id=o.request_id, prompt=list(o.prompt_token_ids), gen=list(o.outputs[0].token_ids),
                    t0=t_gen) for o in outs]
        trace = write_trace(steps, got, trace_dir, temperature=args.temperature, model=args.model, k=args.k,
                            seed=args.seed, vllm_version=vllm.__version__,
                            run_id=f"vllm-probe-{'control' if state['fix'] else 'shipped'}-"
                                   f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository root
    from specaudit.machine_load import load_fields  # the busy rule's load keys (stdlib only)
    rows = rows_of(calls, args.temperature)
    return dict(
        what="vLLM rejection-sampling probe (scripts/vllm_sampling_probe.py)",
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        machine=dict(**load_fields(), platform=platform.platform()),
        vllm=vllm.__version__, torch=torch.__version__, wall_s=round(time.time() - t0, 1),
        setup=dict(model=args.model, drafter=args.drafter or args.model, k=args.k, requests=args.requests,
                   max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                   fix_expand=state["fix"]),
        summary=summary(rows, args.k), trace=trace,
        outputs=[o.outputs[0].text for o in outs][:4],
        rows=rows[:args.rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Prints one JSON object (see the module docstring).")
    ap.add_argument("--model", required=True, help="the target folder; also used as the drafter")
    ap.add_argument("--drafter", default=None, help="drafter folder (default: the target itself)")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens (default 4)")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=None, help="per-request seed base (request i gets seed+i)")
    ap.add_argument("--fix-expand", action="store_true",
                    help="control run: replace expand_batch_to_tokens by repeat_interleave")
    ap.add_argument("--rows", type=int, default=200, help="rows kept in full (the summary covers all)")
    ap.add_argument("--out", default=None, help="write the JSON here (vLLM logs to stdout too)")
    ap.add_argument("--trace", default=None, metavar="DIR",
                    help="also write the run as a contract v2 trace dataset here (scripts/vllm_probe_trace.py)")
    ap.add_argument("--control", action="store_true",
                    help="then run the same requests again with expand_batch_to_tokens replaced (JSON key control)")
    ap.add_argument("--control-trace", default=None, metavar="DIR", help="the control pass's trace dataset")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.model):
        print(f"vllm_sampling_probe: --model {args.model}: not a folder", file=sys.stderr)
        return 2

    calls, steps = build(args)
    from vllm import LLM, SamplingParams

    t0 = time.time()
    llm = LLM(model=args.model, enforce_eager=True, max_model_len=512, max_num_seqs=16,
              speculative_config={"model": args.drafter or args.model, "num_speculative_tokens": args.k})
    params = [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=True,
                             seed=None if args.seed is None else args.seed + i)
              for i in range(args.requests)]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
    res = one_pass(args, llm, prompts, params, calls, steps, t0, args.trace)
    if args.control:   # the same requests again, expand_batch_to_tokens replaced
        state["fix"] = True
        calls.clear()
        steps.clear()
        res["control"] = one_pass(args, llm, prompts, params, calls, steps, time.time(), args.control_trace)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print(json.dumps(res["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
