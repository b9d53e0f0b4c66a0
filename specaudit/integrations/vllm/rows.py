"""One scheduler update of one request -> what the trace records (no vLLM import).

    classify(before, prompt_len, committed)   "prefill", "first" (prefill's token) or "step"
    step_row(worker, before, committed, finished, counter)   the contract fields of a step

What comes from where (hooks.py captures each):
    node_tokens, positions      the verify forward's input buffers (worker)
    target_argmax, margin       the verify logits (worker)
    seq_len                     the request's KV length before the step (scheduler)
    accepted_path               0..len(sampled)-1: the rejection sampler returned its
                                accepted drafts then one token (scheduler's input)
    accepted_depth              vLLM's own counter (make_spec_decoding_stats), as its
                                metrics counted it; for a step without drafts, 0
    committed_tokens, commit_len   what vLLM appended to the request (cut at a stop)
    finished                    the request finished in this update
A step whose worker capture is missing (a worker in another process) records the
scheduled drafts as node_tokens and no target evidence: rows.step_row returns None and
the run is marked incomplete instead (never a row with invented evidence).
"""
from __future__ import annotations


def classify(before: dict, prompt_len: int, committed: list) -> str:
    """A prefill chunk, the prefill that produced the first token, or a decode step."""
    if before["kv_before"] < prompt_len:
        return "first" if committed else "prefill"
    return "step"


def step_row(worker: dict | None, before: dict, committed: list[int], finished: bool,
             counter: tuple | None, t_update: float) -> dict | None:
    """The fields Tracer.record_step needs for one request (B = 1), or None when the
    worker's evidence for this step is missing."""
    if worker is None:
        return None
    drafts = before["drafts"]
    N = len(worker["node_tokens"])
    sampled = before["sampled"]
    path = list(range(max(len(sampled), 1)))           # root, then accepted drafts
    if counter is not None:
        depth = counter[1]
    else:
        depth = 0 if not drafts else len(path) - 1      # no counter called: vLLM counted nothing
    t0 = worker["t_exec"] or worker["t_sample"]
    return {
        "N": N, "seq_len": before["kv_before"], "node_tokens": worker["node_tokens"],
        "positions": worker["positions"], "target_argmax": worker["target_argmax"],
        "target_margin": worker["target_margin"], "accepted_path": path, "accepted_depth": int(depth),
        "commit_len": len(committed), "committed_tokens": list(committed), "finished": bool(finished),
        "batch_size": worker["batch_size"], "budget_drafts": len(drafts),
        "t_start": t0, "verify_s": max(0.0, worker["t_sample"] - t0),
        "draft_s": max(0.0, t_update - worker["t_sample"]), "step_s": max(0.0, t_update - t0),
        "counter_drafted": None if counter is None else counter[0],
        "sampling": worker.get("sampling"), "sampling_params": worker.get("sampling_params"),
    }


FINISH = {"FINISHED_LENGTH_CAPPED": "length", "FINISHED_ABORTED": "abort", "FINISHED_IGNORED": "abort",
          "FINISHED_ERROR": "abort"}


def finish_reason(status_name: str, last_token: int | None = None, eos_id: int | None = None) -> str:
    """vLLM's RequestStatus name -> the contract's eos / length / abort. A request vLLM
    stopped on its EOS is `eos`; one stopped on a stop token or string (or a repetition
    guard) has no contract reason of its own and is `abort`, which the checker never
    holds to an EOS or a length (run.json `finish_reasons` says so)."""
    if status_name == "FINISHED_STOPPED":
        return "eos" if last_token is not None and last_token == eos_id else "abort"
    return FINISH.get(status_name, "abort")
