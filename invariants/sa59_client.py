"""SA590-SA591: a benchmark client's per-request figures against the trace they describe.

Scope "source", with their own input: check(ctx) gets a ClientComparison, what the
client reported per request (AIPerf's profile_export.jsonl, read by
specaudit/audit/client_vs_trace.py) beside the same figures re-derived from the trace's
step rows. Any other source (an engine log's Reading) is not theirs: check returns None.
`specaudit check EXPORT TRACE_DIR` runs them; one verdict per figure comes from
specaudit.audit.compare (AIPerf writes computed floats at full precision, so they agree
within summation order; counts compare exactly).

Matching: `specaudit serve` names each request `cmpl-<X-Request-ID>` or
`chatcmpl-<X-Request-ID>`; a client record meets the trace request whose id is one of
these prefixes plus the record's x_request_id. vLLM's engine names them
`cmpl-<X-Request-ID>-<prompt index>-<8 hex>` and `chatcmpl-<X-Request-ID>-<8 hex>`: for a
trace of vLLM (Figures.convention "vllm") the X-Request-ID is taken from that form too.

Counting verify steps: as the engine that wrote the client's figures counts them. Our
runtime counts every verify step (convention "rows": every step row); vLLM's
per-request block counts only the steps that had drafts (convention "vllm": rows with
more than one node). The finding's message says which count it used.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from specaudit.audit.compare import agrees

from .base import EvidenceRule

PREFIXES = ("cmpl-", "chatcmpl-")
# vLLM's engine request id: the API's id, then "-<prompt index>" (completions only), then
# "-" and 8 hex digits it adds to make the id unique
VLLM_ID = {"cmpl-": re.compile(r"^cmpl-(.+)-\d+-[0-9a-f]{8}$"), "chatcmpl-": re.compile(r"^chatcmpl-(.+)-[0-9a-f]{8}$")}
# how each convention counts verify steps, as the finding's message says it
STEPS_COUNTED = {"rows": "verify steps", "vllm": "verify steps with drafts (vLLM's count)"}
# (figure, is a count): counts compare exactly, fractions at full precision
FIGURES = (("steps", True), ("drafted", True), ("accepted", True), ("accept_len", False), ("accept_rate", False))


@dataclass
class Figures:
    """One request's figures, re-derived from its step rows."""
    steps: int
    drafted: int
    accepted: int
    accept_len: float | None = None     # 1 + accepted / steps (bonus included)
    accept_rate: float | None = None    # accepted / drafted (a fraction)
    convention: str = "rows"            # how steps were counted: STEPS_COUNTED's keys

    @classmethod
    def of(cls, steps: int, drafted: int, accepted: int, convention: str = "rows") -> Figures:
        return cls(steps, drafted, accepted, 1.0 + accepted / steps if steps else None,
                   accepted / drafted if drafted else None, convention)


def client_id(rid: str, convention: str = "rows") -> str | None:
    """The X-Request-ID a trace request id carries, or None: `cmpl-X` / `chatcmpl-X`, and
    for a vLLM trace vLLM's engine form (`cmpl-X-0-1a2b3c4d`, `chatcmpl-X-1a2b3c4d`)."""
    for pre in PREFIXES:
        if rid.startswith(pre):
            if convention == "vllm":
                m = VLLM_ID[pre].match(rid)
                if m:
                    return m.group(1)
            return rid[len(pre):]
    return None


@dataclass
class ClientComparison:
    """records: {x_request_id: {figure: value}} as the client reported them (accept_rate a
    fraction); derived: {trace request_id: Figures}; file: the client's export."""
    records: dict = field(default_factory=dict)
    derived: dict = field(default_factory=dict)
    file: str | None = None

    def pairs(self):
        """-> ([(trace request id, record, Figures)] matched, [x_request_id] unmatched), in record order."""
        by_client = {}
        for rid, fig in self.derived.items():
            xid = client_id(rid, getattr(fig, "convention", "rows"))
            if xid is not None:
                by_client[xid] = rid
        matched, unmatched = [], []
        for xid, rec in self.records.items():
            rid = by_client.get(xid)
            if rid is None:
                unmatched.append(xid)
            else:
                matched.append((rid, rec, self.derived[rid]))
        return matched, unmatched

    @classmethod
    def example(cls) -> ClientComparison:
        """A small healthy comparison, the fixtures' starting point: two requests, one
        over the completions and one over the chat route, each as AIPerf reports it."""
        derived = {"cmpl-a": Figures.of(4, 28, 12), "chatcmpl-b": Figures.of(3, 21, 9)}
        records = {rid.split("-", 1)[1]: {k: getattr(f, k) for k, _ in FIGURES} for rid, f in derived.items()}
        return cls(records, derived, "profile_export.jsonl")


class _ClientRule(EvidenceRule):
    evidence = ClientComparison   # an engine log's Reading is not this rule's input


class ClientVsTrace(_ClientRule):
    """What: a figure a benchmark client reported for one request (AIPerf's spec-decode
    steps, drafted and accepted tokens, acceptance length, draft acceptance rate) equals
    the same figure re-derived from that request's step rows: verify steps = rows (for
    vLLM, whose per-request block counts only steps that had drafts: rows with more than
    one node), drafted = nodes - 1 per row, accepted = the accepted path's depth (the path the target
    really accepted, never the reported accepted_depth).

    Why: the client copies what the server put in its responses, so a server counter that
    lies reaches every benchmark table built on it; the trace holds the raw tensors that
    decide which figure is right. AIPerf also drops, without saying so, the requests whose
    inflated accepted count exceeds their drafted tokens.

    Example: with `--inject bonus-double-count` AIPerf reports acceptance length 5 for
    request chatcmpl-b while the trace re-derives 4 (9 accepted of 21 drafted in 3 verify
    steps): the bonus token counted as an accepted draft.
    """

    code = "SA590"
    name = "client-vs-trace"
    severity = "error"
    message = ("AIPerf {figure} {reported:g} for request {request}, the trace re-derives {derived:g} "
               "(from the accepted paths: {accepted} accepted of {drafted} drafted in {steps} {counted})")

    def findings(self, ctx):
        out = []
        for rid, rec, d in ctx.pairs()[0]:
            for fig, counter in FIGURES:
                rep, der = rec.get(fig), getattr(d, fig)
                if agrees(rep, der, counter=counter) is False:
                    out.append(dict(figure=fig, reported=rep, derived=der, request=rid, accepted=d.accepted,
                                    drafted=d.drafted, steps=d.steps, request_id=rid, file=ctx.file,
                                    counted=STEPS_COUNTED.get(getattr(d, "convention", "rows"), "verify steps")))
        return out

    def fail(self, ctx: ClientComparison) -> None:
        ctx.records["b"]["accepted"] += ctx.derived["chatcmpl-b"].steps   # the bonus counted, once per step
        ctx.records["b"]["accept_len"] += 1.0

    def passing(self, ctx: ClientComparison) -> None:
        ctx.records["a"]["accept_len"] = 1 + 12 / 4 * (1 + 1e-15)         # summation order: still agrees


class ClientVsTraceUnmatched(_ClientRule):
    """What: every per-request record of a benchmark client's export meets a request of
    the trace it is checked against; the records that meet none are counted once.

    Why: a record without its trace request cannot be checked, and guessing its partner
    would invent evidence: it is said, not compared. Usually the export and the trace are
    of two different runs, or the server did not name its requests after X-Request-ID.

    Example: 3 AIPerf records, one of them (x_request_id `ghost`) with no `cmpl-ghost` or
    `chatcmpl-ghost` in the trace: `1 of 3 AIPerf records have no request in the trace
    (first: ghost); they are not compared`.
    """

    code = "SA591"
    name = "client-vs-trace-unmatched"
    severity = "warning"
    message = ("{unmatched} of {records} AIPerf records have no request in the trace (first: {first}); "
               "they are not compared")

    def findings(self, ctx):
        unmatched = ctx.pairs()[1]
        if not unmatched:
            return []
        return [dict(unmatched=len(unmatched), records=len(ctx.records), first=unmatched[0], file=ctx.file)]

    def fail(self, ctx: ClientComparison) -> None:
        ctx.records["ghost"] = dict(ctx.records["a"])

    def passing(self, ctx: ClientComparison) -> None:
        ctx.derived["cmpl-trace-only"] = Figures.of(2, 14, 3)   # a trace request no record names is fine
