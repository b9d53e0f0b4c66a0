"""The rule unit: one invariant = one `Rule` subclass (see the package docstring).

A rule is a small class with a stable code, a name, a severity, a scope, a message
template and a `check(ctx)` method. `check` is vectorised: it receives a whole frame
(a batch of step rows, all requests of a run, one run, or one source file's records)
and returns the rows that break it as a boolean mask plus the numbers the message
shows (`Hits`). Defining a subclass with a `code` registers it.
"""
from __future__ import annotations

import inspect
import re
import textwrap

import numpy as np

from specaudit.audit.findings import SEVERITIES, Finding

SCOPES = ("step", "request", "run", "source")
CODE_RE = re.compile(r"^[A-Z]{1,4}[0-9]{3,4}$")

# Every concrete Rule subclass, in definition order (code -> class). Built-in rules,
# user rules loaded from a folder and entry points all land here; the registry
# (invariants/registry.py) picks the ones a check uses.
DEFINED: dict[str, type] = {}


class RuleError(ValueError):
    """A rule unit is malformed (bad code, duplicate code, unknown scope)."""


class Hits:
    """The rows of a frame that break a rule, and the numbers for its message.

    mask:    bool [R], one entry per row of the frame the rule was given
    values:  name -> array [R], a scalar (the same for every row), or a callable
             row -> value (computed only for the hit rows that become findings: use
             it for text, so that no string is built for rows that pass)
    """

    __slots__ = ("mask", "values")

    def __init__(self, mask, **values):
        self.mask = np.asarray(mask, dtype=bool)
        self.values = values

    def rows(self) -> np.ndarray:
        return np.flatnonzero(self.mask)

    def at(self, i: int) -> dict:
        """The values of row i as plain Python numbers (for messages and JSON)."""
        out = {}
        for k, v in self.values.items():
            if callable(v):
                v = v(i)
            elif isinstance(v, np.ndarray) and v.ndim >= 1 and v.shape[0] == self.mask.shape[0]:
                v = v[i]
            out[k] = _py(v)
        return out


def _py(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


class _Missing(dict):
    def __missing__(self, key):
        return "{" + key + "}"


class Rule:
    """Base class of every invariant. Subclass it, set the class attributes, write check().

    code      stable code, e.g. "SA301"; the family is its first three characters
    name      kebab-case name, e.g. "commit-len-vs-depth"
    severity  "error" (fails the check), "warning" or "info"
    scope     what check() receives: "step" (a StepFrame: a batch of step rows),
              "request" (a RequestFrame: requests of a run, each judged on its own), "run" (a RunFrame),
              "source" (whatever a log/metrics reader passes; see the package docs)
    message   str.format template over the values check() returns, e.g.
              "{algo} committed {commit_len} tokens but accepted depth is {depth}"
    fixture_algo  "chain" or "tree": the synthetic run the fixtures mutate
    live      where else the rule runs while an engine serves, beyond `specaudit check`:
              "prom" (the Prometheus sink evaluates it on every step batch and counts
              specaudit_invariant_violations_total{code=...}: specaudit/trace/inline_rules.py)
              and/or "kernel:<flag>" (the fused Triton audit's flag <flag> of
              kernels/audit.py RULES reports it). The sink and the kernel take their codes
              from here (registry.live_rules); tests/test_one_verdict.py fails on drift.
    The docstring is the rule's documentation: What / Why / Example paragraphs.
    """

    code: str = ""
    name: str = ""
    severity: str = "error"
    scope: str = "step"
    message: str = ""
    fixture_algo: str = "chain"
    live: tuple = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if not cls.__dict__.get("code"):
            return  # an abstract helper class
        if not CODE_RE.match(cls.code):
            raise RuleError(f"{cls.__module__}.{cls.__name__}: code {cls.code!r} must look like SA301")
        if cls.scope not in SCOPES:
            raise RuleError(f"{cls.code}: scope {cls.scope!r} is not one of {', '.join(SCOPES)}")
        if cls.severity not in SEVERITIES:
            raise RuleError(f"{cls.code}: severity {cls.severity!r} is not one of {', '.join(SEVERITIES)}")
        if not cls.name or not cls.message:
            raise RuleError(f"{cls.code}: a rule needs a name and a message template")
        old = DEFINED.get(cls.code)
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise RuleError(f"{cls.code} is defined twice: {old.__module__}.{old.__qualname__} and "
                            f"{cls.__module__}.{cls.__qualname__}")
        DEFINED[cls.code] = cls

    # ------------------------------------------------------------------ check
    def check(self, ctx):
        """Return Hits (vectorised), or an iterable of Finding/dict, or None (nothing)."""
        raise NotImplementedError

    # -------------------------------------------------------------- fixtures
    # Each rule proves itself on a valid synthetic run (specaudit.trace.synth): `fail`
    # mutates it so that this rule, and this rule's code, fires; `passing` mutates it
    # (or not) into a case that must stay clean, usually the edge the rule must
    # tolerate. Both receive a FixtureRun (invariants/fixtures.py) and edit it in place.
    def passing(self, run) -> None:
        return None

    def fail(self, run) -> None:
        raise NotImplementedError(f"{self.code} has no fail fixture")

    # ------------------------------------------------------------- findings
    @property
    def family(self) -> str:
        return self.code[:3]

    def format(self, values: dict) -> str:
        try:
            return self.message.format_map(_Missing(values))
        except (ValueError, TypeError, IndexError, KeyError):
            return self.message + " " + ", ".join(f"{k}={v}" for k, v in values.items())

    def finding(self, *, run_id=None, request_id=None, step=None, file=None, line=None,
                where: str | None = None, **values) -> Finding:
        """One Finding: message = '<where>: <template formatted with values>'."""
        return self.make_finding(values, run_id=run_id, request_id=request_id, step=step, file=file,
                                 line=line, where=where)

    def make_finding(self, values: dict, *, run_id=None, request_id=None, step=None, file=None,
                     line=None, where: str | None = None) -> Finding:
        """finding() with the values as a dict (values may then use any name, even 'step')."""
        if where is None:
            where = location(run_id, request_id, step, file, line)
        text = self.format(values)
        return Finding(code=self.code, name=self.name, severity=self.severity,
                       message=f"{where}: {text}" if where else text, run_id=run_id,
                       request_id=request_id, step=step, file=file, line=line, values=values)

    @classmethod
    def doc(cls) -> str:
        return textwrap.dedent(inspect.getdoc(cls) or "").strip()

    @classmethod
    def summary(cls) -> str:
        """The first sentence of the docstring's What paragraph."""
        para = []
        for line in cls.doc().splitlines():
            if not line.strip():
                if para:
                    break
                continue
            para.append(line.strip())
        text = " ".join(para)
        if text.lower().startswith("what:"):
            text = text[5:].strip()
        end = text.find(". ")
        text = text if end < 0 else text[: end + 1]
        return text or cls.name



class FileRule(Rule):
    """Base of the rules over an engine's files (scope "source"): their findings carry
    file and line, which the formatters print, so a message starts with what is wrong,
    never with a location."""

    scope = "source"

    def finding(self, *, where: str | None = "", **kw):
        return super().finding(where=where, **kw)


class EvidenceRule(FileRule):
    """Base of the rules over one kind of gathered evidence (`evidence`: the class of the
    object check() must receive, e.g. llama.cpp's ServerEvidence): any other input (an
    engine log's Reading) is not theirs and gets None; evidence goes to findings(), which
    returns the values of each finding (dicts, with file and request where known)."""

    evidence: type = object

    def check(self, ctx):
        if not isinstance(ctx, self.evidence):
            return None
        return self.findings(ctx)

    def findings(self, ctx) -> list[dict]:
        raise NotImplementedError


def location(run_id=None, request_id=None, step=None, file=None, line=None) -> str:
    """'run r1 request 17 step 4' (the parts that are known), or 'FILE:LINE'."""
    parts = []
    if run_id is not None:
        parts.append(f"run {run_id}")
    if request_id is not None:
        parts.append(f"request {request_id}")
    if step is not None:
        parts.append(f"step {step}")
    if not parts and file is not None:
        parts.append(f"{file}:{line}" if line is not None else str(file))
    return " ".join(parts)
