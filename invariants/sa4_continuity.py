"""SA4xx: continuity within a request, the requests table, lossless (rules 7 and 8).

Step-scope rules here compare a step with the request's previous step (carried
across batches); request-scope rules compare the requests table with what the
request's steps add up to. "Server vs client": a figure the client received for a
request must agree with the step rows.
"""
from __future__ import annotations

import numpy as np

from specaudit.audit.compare import agrees
from specaudit.trace.derived import bonus
from specaudit.trace.schema import manifest_conventions

from . import compiled
from .base import Hits, Rule

_KERNELS = "specaudit.invariants.rule_kernels"   # compiled "anything bad?" tests (big batches)

_STEP_DESC = {"gap": "steps are missing", "repeat": "a step is repeated", "late": "a step came out of order",
              "start": "the first step of a request must be 0"}


class StepSequence(Rule):
    """What: a request's step indices run 0, 1, 2, ... with no gap or repeat, in the
    order the rows were written.

    Why: a missing step loses tokens and counts; a repeated one counts them twice.

    Example: steps 0, 1, 3 of request 5: step 2 is missing.
    """

    code = "SA401"
    name = "step-sequence"
    message = "step {step} follows step {prev} of this request (expected step {want}): {what}"

    def check(self, f):
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and not kern.step_bad(f.step, f.has_prev, f.prev_step):
            return None   # every step follows its request's previous one: numpy's mask all false
        want = np.where(f.has_prev, f.prev_step + 1, 0)
        bad = f.step != want
        if not bad.any():
            return None

        def what(i):
            if not f.has_prev[i]:
                return _STEP_DESC["start"]
            if f.step[i] > want[i]:
                return _STEP_DESC["gap"]
            return _STEP_DESC["repeat"] if f.step[i] == f.prev_step[i] else _STEP_DESC["late"]
        prev = lambda i: str(f.prev_step[i]) if f.has_prev[i] else "none"
        return Hits(bad, step=f.step, prev=prev, want=want, what=what)

    def fail(self, run):
        steps = run.steps_of(run.steps_where(lambda s: s["step"] == 3)[0]["request_id"])
        run.steps.remove(steps[2])


class SeqLenContinuity(Rule):
    """What: the next step's seq_len is the previous step's seq_len + its commit.

    Why: the KV cache grows by exactly the committed tokens; another value means the
    positions, and so the target's predictions, are off from then on (or the
    cache was compacted wrongly).

    Example: step 3 ended at 40 + 4 = 44, step 4 starts at seq_len 43.
    """

    code = "SA402"
    name = "seq-len-continuity"
    message = "seq_len is {seq_len} but the previous step's seq_len + commit is {want}"

    def check(self, f):
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and not kern.seq_len_bad(f.step, f.has_prev, f.prev_step, f.seq_len, f.prev_seq_end):
            return None   # numpy's mask would be all false
        bad = f.has_prev & (f.step == f.prev_step + 1) & (f.seq_len != f.prev_seq_end)
        return Hits(bad, seq_len=f.seq_len, want=f.prev_seq_end)

    def fail(self, run):
        s = run.steps_where(lambda s: s["step"] == 2)[0]
        s["seq_len"] += 1
        s["positions"] = [p + 1 for p in s["positions"]]


class RootContinuity(Rule):
    """What: the next step's root (node_tokens[0]) is the previous step's last
    committed token (the bonus, or EOS).

    Why: the root is the token the step continues from; another token means the
    verify block is attached to the wrong text.

    Example: step 3 committed [.., 133]; step 4's root is 40.
    """

    code = "SA403"
    name = "root-continuity"
    message = "the root token is {root} but the previous step's last committed token is {want}"

    def check(self, f):
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and not kern.root_continuity_bad(f.has_prev, f.step, f.prev_step, f.prev_last,
                                                             f.start, f.n, f.tokens, f.inv):
            return None   # every root continues its previous step: numpy's mask would be all false
        root = f.at_root(f.tokens)
        bad = f.has_prev & (f.step == f.prev_step + 1) & (root != f.prev_last) & (f.n > 0)
        return Hits(bad, root=root, want=f.prev_last)

    def fail(self, run):
        s = run.steps_where(lambda s: s["step"] == 2)[0]
        s["node_tokens"][0] = (s["node_tokens"][0] % 250) + 1


class StepAfterFinish(Rule):
    """What: no step follows a finished step of the same request.

    Why: a finished request generates nothing more; a later step means the finished
    flag lies or text is generated past the end.

    Example: step 6 finished (EOS), then step 7 of the same request.
    """

    code = "SA404"
    name = "step-after-finish"
    message = "step {step} comes after the request's finished step {prev}"

    def check(self, f):
        bad = f.has_prev & f.prev_finished
        return Hits(bad, step=f.step, prev=f.prev_step)

    def fail(self, run):
        s = run.steps_where(lambda s: s["step"] == 1 and not s["finished"])[0]
        s["finished"] = True


class FirstStep(Rule):
    """What: a request's step 0 has seq_len = len(prompt_tokens) and its root is the
    requests table's first_token (a first step an SA1xx rule refused is reported
    there, not compared here).

    Why: before step 0 the cache holds the prompt, and the prefill's token is the
    first root; anything else means the steps belong to another request or the
    prefill was counted twice.

    Example: prompt of 22 tokens, step 0 at seq_len 23.
    """

    code = "SA405"
    name = "first-step"
    scope = "request"
    message = "step 0 {what}"

    def check(self, q):
        # a first step refused by an SA1xx rule is reported there: its values are no evidence
        use = q.has_row & q.has_steps & ~q.null_slot & q.first_ok
        bad_len = use & (q.first_seq_len != q.prompt_len)
        bad_root = use & (q.first_root != q.first_token)
        what = np.full(q.R, "", dtype=object)
        for i in np.flatnonzero(bad_len | bad_root):
            parts = []
            if bad_len[i]:
                parts.append(f"has seq_len {q.first_seq_len[i]} but the prompt holds {q.prompt_len[i]} tokens")
            if bad_root[i]:
                parts.append(f"has root {q.first_root[i]} but first_token is {q.first_token[i]}")
            what[i] = " and ".join(parts)
        return Hits(bad_len | bad_root, what=what)

    def fail(self, run):
        r = run.requests[0]
        r["first_token"] = (r["first_token"] % 250) + 1
        r["output_tokens"][0] = r["first_token"]
        if r.get("reference_tokens"):
            r["reference_tokens"][0] = r["first_token"]


class OutputReassembles(Rule):
    """What: output_tokens = first_token followed by every step's committed_tokens in
    step order.

    Why: the per-request record the client received must be what the steps
    committed; otherwise the trace (or the response) lies about the output.

    Example: output_tokens holds 37 tokens but first_token + the commits make 38.
    """

    code = "SA406"
    name = "output-reassembles"
    scope = "request"
    message = "output_tokens ({olen} tokens) is not first_token + the commits in step order ({clen} tokens){what}"

    def check(self, q):
        use = q.has_row & q.has_steps & q.contiguous & ~q.null_slot & (q.output_len >= 0)
        first_bad = q.output_first != q.first_token
        bad = use & ((q.commits_len != q.output_len) | (q.commits_hash != q.output_hash) | first_bad)
        what = lambda i: ("" if q.commits_len[i] != q.output_len[i] else
                          ": output_tokens[0] is not first_token" if first_bad[i] else ": the tokens differ")
        return Hits(bad, olen=q.output_len, clen=q.commits_len, what=what)

    def fail(self, run):
        r = run.requests[1]
        r["output_tokens"][3] = (r["output_tokens"][3] % 250) + 1
        r["reference_tokens"] = list(r["output_tokens"])


class Lossless(Rule):
    """What: when the requests table holds reference_tokens (plain greedy decoding of
    the target, from an --oracle run), output_tokens equals it.

    Why: greedy speculative decoding is lossless by construction; a difference means
    a mask, position or KV-cache bug changed the target's predictions.

    Example: output differs from the reference at token 12 of 40.
    """

    code = "SA407"
    name = "lossless"
    scope = "request"
    message = ("the output differs from plain greedy decoding (reference_tokens) at token {k} "
               "({olen} vs {rlen} tokens): the run is not lossless")

    def check(self, q):
        bad = q.has_row & (q.reference_equal == 0)
        return Hits(bad, k=q.reference_first_diff, olen=q.output_len, rlen=q.reference_len)

    def fail(self, run):
        r = run.requests[2]
        r["reference_tokens"][-1] = (r["reference_tokens"][-1] % 250) + 1


class FinishReason(Rule):
    """What: finish_reason is eos, length or abort and agrees with the output: `eos`
    ends with EOS, `length` holds exactly max_new_tokens tokens, no EOS before the
    end; the last step of a request that did not abort is finished; a request with
    no steps ended at its first token.

    Why: the finish reason is what a client sees; a "length" answer that stopped
    early, or text past EOS, is a bug that metrics alone hide.

    Example: finish_reason length with 30 of 64 tokens.
    """

    code = "SA408"
    name = "finish-reason"
    scope = "request"
    message = "finish_reason {reason}: {what}"

    def check(self, q):
        use = q.has_row & ~q.null_slot
        if not use.any():
            return None
        reason = q.finish_reason                  # [R] object: str or None
        # one comparison per reason (an object array compares value by value in Python)
        is_eos, is_len, is_abort = (reason == "eos"), (reason == "length"), (reason == "abort")
        known = is_eos | is_len | is_abort
        M = q.max_new_tokens
        eos_bad = is_eos & (q.output_last != q.eos_id)
        len_bad = is_len & (q.output_len != M) if M is not None else np.zeros(q.R, bool)
        inside = q.eos_inside >= 0
        not_fin = q.complete & q.has_steps & ~is_abort & ~q.last_finished
        nosteps = q.complete & ~q.has_steps & ~is_abort & (q.output_len != 1)
        bad = use & (~known | eos_bad | len_bad | inside | not_fin | nosteps)
        what = np.full(q.R, "", dtype=object)
        for i in np.flatnonzero(bad):
            if not known[i]:
                what[i] = "not one of eos, length, abort"
            elif inside[i]:
                what[i] = f"the output holds EOS ({q.eos_id}) at token {q.eos_inside[i]} and goes on after it"
            elif eos_bad[i]:
                what[i] = f"but the output ends with {q.output_last[i]}, not EOS ({q.eos_id})"
            elif len_bad[i]:
                what[i] = f"but the output holds {q.output_len[i]} tokens, not the limit {M}"
            elif not_fin[i]:
                what[i] = "but the request's last step is not finished"
            else:
                what[i] = f"no verify step, yet the output holds {q.output_len[i]} tokens"
        return Hits(bad, reason=reason, what=what)

    def fail(self, run):
        r = next(r for r in run.requests if r["finish_reason"] == "eos")
        r["finish_reason"] = "length"


class RequestCoverage(Rule):
    """What: in a complete run every request with step rows has a row in the
    requests table, and every request the table lists is unique.

    Why: steps without a request (or two rows for one request) make per-request
    figures and the generated-token total disagree with the steps.

    Example: steps of request 9 but no requests row for it.
    """

    code = "SA409"
    name = "request-coverage"
    scope = "request"
    message = "{what}"

    def check(self, q):
        if not q.complete:
            return None
        nrow = q.has_steps & ~q.has_row & ~q.null_slot
        dup = q.row_count > 1
        what = lambda i: ("step rows but no row in the requests table" if nrow[i]
                          else f"the requests table holds {q.row_count[i]} rows for this request")
        return Hits(nrow | dup, what=what)

    def fail(self, run):
        run.requests.pop(0)

    def passing(self, run):  # a request that ended at its first token has no steps
        run.requests.append(dict(run.requests[0], request_id="prefill-only", output_tokens=[0],
                                 first_token=0, finish_reason="eos", reference_tokens=[0]))
        rep = run.reported
        rep["generated_tokens"] += 1
        rep["gen_throughput_tps"] = rep["generated_tokens"] / rep["wall_s"]


class ClientFigures(Rule):
    """What: per-request figures a client received (optional requests-table columns:
    completion_tokens, verify_steps, accept_length) agree with the request's steps.
    accept_length follows the run's accept_length convention (includes_bonus: mean
    of accepted_depth + 1 per step; excludes_bonus: mean accepted_depth).

    Why: the server log and the per-request field must tell the same story; one
    engine logged accept length 4.00 while the per-request field returned 0.0.

    Example: accept_length 0.0 for a request whose 9 steps accepted 3.1 per step.
    """

    code = "SA410"
    name = "client-figures"
    scope = "request"
    message = "the client received {column} = {got} but the request's steps give {want}"

    def check(self, q):
        if not q.extra:
            return None
        conv = manifest_conventions(q.manifest)["accept_length"]
        ns = np.maximum(q.n_steps, 1)
        want = {
            "completion_tokens": q.output_len.astype(float),
            "verify_steps": q.n_steps.astype(float),
            "accept_length": q.sum_true_depth / ns + bonus({"accept_length": conv}),   # trace/derived.py
        }
        bad = np.zeros(q.R, dtype=bool)
        col = np.full(q.R, "", dtype=object)
        got = np.full(q.R, np.nan)
        exp = np.full(q.R, np.nan)
        for c, v in q.extra.items():
            if c not in want:
                continue
            use = q.has_row & ~np.isnan(v) & (q.has_steps | (c != "accept_length"))
            # the one comparison rule (specaudit.audit.compare), asked only where the two differ
            b = use & (v != want[c]) & ~bad
            for i in np.flatnonzero(b):
                b[i] = agrees(float(v[i]), float(want[c][i])) is False
            col[b], got[b], exp[b] = c, v[b], want[c][b]
            bad |= b
        return Hits(bad, column=col, got=np.round(got, 4), want=np.round(exp, 4))

    def passing(self, run):
        for r in run.requests:
            r["completion_tokens"] = len(r["output_tokens"])

    def fail(self, run):
        for r in run.requests:
            r["completion_tokens"] = len(r["output_tokens"])
        run.requests[0]["completion_tokens"] = 0
