"""The invariant catalog: one rule unit per invariant, ruff/sqlfluff style.

Installed as `specaudit.invariants`. `specaudit rules` lists the catalog and
`specaudit rules SA301` prints one rule's documentation; `specaudit check` runs it.

Families (the first three characters of a code):

    SA1xx  shapes and tree structure          (scope step)
    SA2xx  positions and attention mask       (scope step)
    SA3xx  accepted path and per-step counters (scope step)
    SA4xx  continuity within a request, requests table, lossless (step, request)
    SA5xx  aggregates against run.json `reported`                  (run)
    SA59x  a benchmark client's per-request figures vs the trace   (source: a ClientComparison)
    SA6xx  conventions declared by other engines                   (run)
    SA7xx  engine logs and Prometheus text (specaudit.audit.sources)     (source)
    SA9xx  reserved for users' own rules (any scope); pick your own prefix if you like

How to write a rule unit
------------------------
One invariant is one subclass of `Rule` in one module (built-in rules live in
`invariants/saN_<family>.py`; a user's in any folder given to `--invariants DIR` or
in a package exposing the `specaudit.invariants` entry-point group). Defining the
class registers it; codes are unique (a duplicate is an error when loaded).

    import numpy as np
    from specaudit.invariants import Hits, Rule

    class DepthWithinBudget(Rule):
        '''What: the accepted depth never exceeds the step's draft budget.

        Why: a depth above the budget means the counter read another variable.

        Example: budget 7, accepted_depth 9 on a chain.
        '''
        code = "SA950"
        name = "depth-within-budget"
        severity = "error"            # error fails the check; warning/info do not
        scope = "step"                # step | request | run | source
        message = "accepted depth {depth} exceeds the budget {budget}"
        fixture_algo = "chain"        # the synthetic run the fixtures start from

        def check(self, f):           # f: StepFrame, a batch of step rows
            bad = f.accepted_depth > f.budget
            return Hits(bad, depth=f.accepted_depth, budget=f.budget)

        def fail(self, run):          # mutate a valid synthetic run so the rule fires
            run.steps[0]["accepted_depth"] = 99

        def passing(self, run):       # optional: an edge case that must stay clean
            pass

check(ctx) is vectorised: never loop over rows in Python (a loop over node index
up to N is fine). It returns `Hits(mask, **values)` where mask is bool [rows of
ctx] and each value is an array [rows] or a scalar; the engine formats `message`
at each hit row and prefixes the location ("run r1 request 17 step 4: ..."). A rule
may instead return an iterable of `Finding` (build them with `self.finding(run_id=...,
request_id=..., step=..., file=..., line=..., **values)`) or of dicts of values
(plus optional run_id/request_id/step/file/line keys); return None when nothing
applies. Messages show the numbers: what was recorded, what it should be, and why.

What each scope receives (all arrays are numpy; [R] = one entry per row):

  step     StepFrame (invariants/frame.py): one record batch of one run, rows
           sorted by (request, step). Per row: request_id (object), step, seq_len,
           budget, topk, batch_size, accepted_depth, commit_len, mask_hash (uint64),
           finished (bool), is_chain (algo == "chain"), algo, n (nodes), lens[col]
           (list length of each list column, -1 when null), ok (structure sound:
           the engine hides rows that are not ok from every rule outside SA1xx).
           Per node, flat over the batch (T = n.sum(); row r's nodes are
           start[r] .. start[r]+n[r]-1; node_row maps a flat node to its row):
           node_i (index in its row), tokens, parents, positions, argmax, depth,
           parent_flat (parent as a flat index, -1 at roots). Path: path (flat),
           path_start [R], path_len, path_row, path_k, path_glob, path_ok (rows
           whose path is a valid root->child walk). Commit: commit (flat),
           commit_start [R], commit_n, commit_row, commit_k, commit_last. Derived:
           true_depth (len(path) - 1), bonus, expected_commit (flat, aligned with
           path: accepted drafts then the bonus), commit_mismatch_at, commit_eos_at,
           derived_mask_hash, causal_mask_hash, children_max, chain_shaped.
           Continuity (from the request's previous step, in this batch or earlier
           ones): has_prev, prev_step, prev_seq_end, prev_last, prev_finished,
           out_before (output tokens before this step, first token included).
           Config: run_id, eos_id, max_new_tokens (None when unknown), manifest,
           conventions. Helpers: f.row_any(flat_bool) and f.row_sum(flat_values).
  request  RequestFrame: requests of a run, joined with what their steps added
           up to (see invariants/request_frame.py for the fields): all of them, or
           a range of slots at a time for a run with many (check_group), or one
           bucket of request ids on Spark, so a rule judges each request on its own.
  run      RunFrame (invariants/run_frame.py): one run: manifest, reported, conventions, complete, and
           `derived` (the aggregates re-derived from the rows, per partition too).
  source   whatever the engine-log/metrics reader passes (specaudit.audit.sources);
           such rules usually return Findings built with self.finding(file=...,
           line=..., **values). check() of a source rule is only called by that
           reader, never by the trace checker.

Every place a new rule touches
------------------------------
The catalog is the one home of a rule's identity (code, name, message, docs); nothing
else spells a code by hand without a test tying it back here. A built-in rule touches:

  1. invariants/saN_<family>.py    the Rule subclass: code, name, severity, scope,
                                   message, What / Why / Example docstring, check()
                                   (registration is automatic: registry.load_builtin)
  2. its fixtures                  fail(run) and, for an edge case, passing(run) (or
                                   fail_fixture / pass_fixture files for SA7xx source
                                   rules); tests/test_invariants.py runs every rule's
  3. the homes that compute it again (invariants/homes.py lists them; each declares
     its codes in its own module, and tests/test_rule_homes.py runs every claimed
     rule's own pass/fail fixtures through it):
     specaudit/audit/reference.py  the per-row oracle, RULES_IMPLEMENTED: every step or
                                   request rule of the greedy contract (SA1xx-SA4xx)
                                   gets its plain Python hit("SAnnn") there;
                                   tests/test_check_props.py checks that the vectorised
                                   engine flags exactly the same rows
     specaudit/trace/inline_rules.py  the live rules the Prometheus sink counts,
                                   INLINE_CODES, with live = ("prom",) on the rule:
                                   inline_violations must compute it
     kernels/audit.py              the fused kernel: live = ("kernel:<flag>",) on the
                                   rule names a flag of RULES (rule_codes reads it)
     specaudit/postmortem/view_sql.py  the figures view, FIGURE_RULES: a run rule
                                   that puts a reported figure beside a derived one
  4. specaudit/audit/compare.py    when the rule compares a reported figure with a
                                   derived one: call compare.agrees, never a tolerance
                                   of its own
  5. docs/commands/check.md         the families table names the family's codes (each
                                   rule's own page, and the rule x home matrix of
                                   docs/rules/index.md, are generated: scripts/render_docs.py)
tests/test_one_verdict.py checks that the sink's and the kernel's codes are the catalog's
live rules; tests/test_rule_homes.py checks every claim of every home on the rule's own
fixtures and that docs/rules/index.md shows the current matrix.

Fixtures: `fail(run)` and `passing(run)` receive a FixtureRun (invariants/fixtures.py):
`run.steps` and `run.requests` are lists of row dicts of a small valid synthetic run
(specaudit.trace.synth, seeded), `run.manifest` its run.json; helpers find rows
(`run.step(request_id, step)`, `run.steps_where(pred)`, `run.request(request_id)`).
tests/test_invariants.py checks every registered rule: the passing run reports no
error at all, the failing run reports this rule's code.
"""
from .base import DEFINED, SCOPES, Hits, Rule, RuleError, location  # noqa: F401  (the public rule API)
from .registry import ENTRY_POINT_GROUP, all_rules, get_rule, load_dir, load_rules  # noqa: F401  (public API)
