"""SA3xx: the accepted path and the per-step counters (contract rules 5 and 6)."""
from __future__ import annotations

import numpy as np

from . import compiled
from .base import Hits, Rule

_CHUNK = 16384   # rows at a time where a rule works on [rows, K] blocks
_KERNELS = "specaudit.invariants.rule_kernels"   # compiled "anything bad?" tests (big batches)


def _lists(f, rows, flat, start, lens, width=12):
    out = np.full(f.R, "", dtype=object)
    for r in rows:
        v = flat[start[r]: start[r] + min(lens[r], width)].tolist()
        out[r] = str(v)[:-1] + (", ...]" if lens[r] > width else "]")
    return out


def _unfinished_with_depth(s):
    return not s["finished"] and s["accepted_depth"] >= 1


class CommitLenVsDepth(Rule):
    """What: an unfinished step has commit_len = accepted_depth + 1 (the accepted
    drafts plus the bonus token); a finished step commits at most that.

    Why: this is the impossibility specaudit exists to catch: a single chain that
    reported mean accepted depth 7.00 next to mean commit length 2.00. One of the two
    counters reads the wrong variable.

    Example: `SA301 run r1 request 17 step 4: chain committed 2 tokens but accepted
    depth is 7 (an unfinished step commits depth + 1 = 8)`.
    """

    code = "SA301"
    live = ("prom", "kernel:commit")
    name = "commit-len-vs-depth"
    message = "{algo} committed {commit_len} {tokens} but accepted depth is {accepted_depth} ({rule})"

    def check(self, f):
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and not kern.commit_len_bad(f.accepted_depth, f.commit_len, f.finished):
            return None   # numpy's mask would be all false
        want = f.accepted_depth + 1
        unf = ~f.finished & (f.commit_len != want)
        fin = f.finished & (f.commit_len > want)
        bad = unf | fin
        if not bad.any():
            return None
        rule = lambda i: (f"an unfinished step commits depth + 1 = {want[i]}" if unf[i]
                          else f"a finished step commits at most depth + 1 = {want[i]}")
        tokens = lambda i: "token" if f.commit_len[i] == 1 else "tokens"
        return Hits(bad, algo=f.algo, commit_len=f.commit_len, tokens=tokens,
                    accepted_depth=f.accepted_depth, rule=rule)

    def fail(self, run):
        # the commit counter reads another variable: 2 tokens beside an honest depth >= 2
        # (depth and path untouched, so every home that re-derives the depth sees it too)
        s = run.steps_where(lambda s: not s["finished"] and s["accepted_depth"] >= 2)[0]
        s["commit_len"] = 2


class DepthVsPath(Rule):
    """What: accepted_depth = len(accepted_path) - 1.

    Why: the depth counter and the path the engine accepted must describe the same
    acceptance; counting the bonus token as accepted makes the depth one too high
    (and an accept rate above one follows).

    Example: accepted_path [0, 1, 2] (depth 2) and accepted_depth 3: the bonus token
    was counted as an accepted draft.
    """

    code = "SA302"
    live = ("prom", "kernel:depth")
    name = "depth-vs-path"
    message = "accepted_depth is {accepted_depth} but the accepted path {path} has depth {path_depth}{explain}"

    def check(self, f):
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and not kern.path_depth_bad(f.path_len, f.accepted_depth):
            return None   # numpy's mask would be all false
        bad = f.path_len.astype(np.int64) - 1 != f.accepted_depth
        bad &= f.path_len >= 1
        if not bad.any():
            return None
        rows = np.flatnonzero(bad & f.ok)
        def explain(i):
            if f.accepted_depth[i] == f.path_len[i]:
                return " (the bonus token counted as an accepted draft)"
            if f.accepted_depth[i] == f.n[i] - 1:
                return " (it equals the drafted nodes: the counter reads the draft width)"
            return ""
        return Hits(bad, accepted_depth=f.accepted_depth, path_depth=f.path_len - 1, explain=explain,
                    path=_lists(f, rows, f.path, f.path_start, f.path_len))

    def fail(self, run):
        s = run.steps[2]
        s["accepted_depth"] += 1


class PathWalk(Rule):
    """What: accepted_path starts at node 0 and each next entry is a child of the one
    before, inside the tree.

    Why: greedy verification accepts a root-to-node path; anything else is not an
    acceptance the target could have made.

    Example: accepted_path [0, 2] where node 2's parent is node 1.
    """

    code = "SA303"
    live = ("prom",)
    name = "path-walk"
    message = "accepted_path {path} is not a root-to-node walk of this tree (parents {parents})"
    fixture_algo = "tree"

    def check(self, f):
        bad = f.path_struct_bad & f.ok
        rows = np.flatnonzero(bad)
        if not rows.size:
            return None
        return Hits(bad, path=_lists(f, rows, f.path, f.path_start, f.path_len),
                    parents=_lists(f, rows, f.parents, f.start, f.n))

    def fail(self, run):
        s = run.steps_where(lambda s: len(s["accepted_path"]) >= 3)[0]
        s["accepted_path"] = [0] + s["accepted_path"][2:]


class PathMatchesArgmax(Rule):
    """What: along the accepted path, target_argmax[parent] = node_tokens[child] for
    each consecutive pair.

    Why: a draft is accepted only when the target, at its parent, would have
    produced exactly that token; otherwise the output is no longer the target's
    greedy output.

    Example: node 3 (token 40) accepted although the target's argmax at node 2 is 133.
    """

    code = "SA304"
    live = ("prom",)
    name = "path-matches-argmax"
    message = ("accepted node {node} carries token {token} but the target's argmax at its parent "
               "node {parent} is {argmax}: a draft the target rejects was accepted")

    def check(self, f):
        ok = f.path_ok & ~f.sampled  # sampled rows: SA801 re-derives the test instead
        if not len(f.path) or not ok.any():
            return None
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and not _path_argmax_bad(kern, f, ok):
            return None   # no accepted draft the target rejects: numpy's mask would be all false
        k = f.path_k
        g = f.path_glob
        badp = np.zeros(len(g), dtype=bool)
        badp[1:] = (k[1:] > 0) & (f.argmax[g[:-1]] != f.tokens[g[1:]])
        badp &= ok[f.path_row]
        first = np.full(f.R, -1, dtype=np.int64)
        idx = np.flatnonzero(badp)[::-1]
        first[f.path_row[idx]] = idx
        hit = first >= 0
        node, parent, token, am = (np.full(f.R, -1, dtype=np.int64) for _ in range(4))
        j = first[hit]
        node[hit], parent[hit] = f.path[j], f.path[j - 1]
        token[hit], am[hit] = f.tokens[g[j]], f.argmax[g[j - 1]]
        return Hits(hit, node=node, parent=parent, token=token, argmax=am)

    def fail(self, run):
        s = run.steps_where(lambda s: len(s["accepted_path"]) >= 2)[0]
        p = s["accepted_path"][0]
        s["target_argmax"][p] = (s["target_argmax"][p] + 1) % 250 + 1


class PathMaximal(Rule):
    """What: the accepted path is maximal: no child of its last node carries the
    target's argmax at that node.

    Why: greedy verification keeps walking while a child matches; stopping early
    throws accepted tokens away and understates acceptance (or the path was cut to
    make a counter fit).

    Example: path [0, 1] stops at node 1 while its child node 2 carries the target's
    argmax at node 1.
    """

    code = "SA305"
    live = ("prom",)
    name = "path-maximal"
    message = ("the accepted path stops at node {last} but its child node {child} carries the target's "
               "argmax {token}: acceptance stopped early")

    def check(self, f):
        ok = f.path_ok & ~f.sampled  # sampled rows: a rejection may stop before any child
        if f.T == 0 or not ok.any():
            return None
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and not _path_not_maximal(kern, f, ok):
            return None   # every path is maximal: numpy's mask would be all false
        last = f.last_node
        if f.chain_shaped.all():
            # a chain node's only child is the next node
            nxt = last + 1
            has = ok & (nxt - f.start < f.n)
            hit = np.zeros(f.R, dtype=bool)
            hit[has] = f.tokens[nxt[has]] == f.bonus[has]
            child = np.where(hit, nxt - f.start, -1)
            return Hits(hit, last=last - f.start, child=child, token=f.bonus)
        if f.uniform_n and f._shapes is not None:
            # the last node's children from its shape's table ([R, K], K the most children
            # of a node, not [R, N0]); flat node b * N0 + i is node i of batch row b
            R, inv = f.R, f.inv
            N0 = f.T // R
            lastl = (last - f.start)[inv]
            use = ok[inv] & (lastl >= 0) & (lastl < N0)
            at = np.where(use, lastl, 0)
            C, ids, tok, bonus = f.shape_children, f._shapes[0], f.tokens.reshape(R, N0), f.bonus[inv]
            child = np.empty(R, dtype=np.int64)
            for c in range(0, R, _CHUNK):                 # by chunks of rows: small temporaries
                sl = slice(c, c + _CHUNK)
                cand = C[ids[sl], at[sl]]                 # [rows, K]
                t = np.take_along_axis(tok[sl], np.maximum(cand, 0), axis=1)
                m = (cand >= 0) & (t == bonus[sl, None]) & use[sl, None]
                first = m.argmax(axis=1)                  # children ascending: the first match
                child[sl] = np.where(m.any(axis=1), cand[np.arange(len(cand)), first], -1)
            child = child[f.order]
        elif f.uniform_n:
            # [R, N0] blocks in batch order: a child of the last node carrying the bonus
            R, inv = f.R, f.inv
            ps = f.parent_in_row.reshape(R, -1)
            lastl = (last - f.start)[inv]
            lastl = np.where(lastl >= 0, lastl, -2)[:, None]   # (-1 is a root's parent)
            m = (ps == lastl) & (f.tokens.reshape(R, -1) == f.bonus[inv][:, None]) & ok[inv][:, None]
            child = np.where(m.any(axis=1), m.argmax(axis=1), -1)[f.order]
        else:
            isc = (f.parent_flat >= 0) & (f.parent_flat == last[f.node_row]) & (f.tokens == f.bonus[f.node_row])
            isc &= ok[f.node_row]
            child = f.first_node(isc)
        hit = child >= 0
        return Hits(hit, last=last - f.start, child=child, token=f.bonus)

    def fail(self, run):
        s = run.steps_where(lambda s: 2 <= len(s["accepted_path"]) and not s["finished"])[0]
        # drop the last accepted node: the path now stops before a matching child
        s["accepted_path"] = s["accepted_path"][:-1]
        s["accepted_depth"] -= 1
        s["commit_len"] -= 1
        s["committed_tokens"] = s["committed_tokens"][:-1]


def _path_argmax_bad(kern, f, ok) -> bool:
    """SA304's mask has a hit (compiled): a uniform-N batch of chains on [R, N0] blocks
    (an ok row's path is 0, 1, 2, ..: no path entry read), any other by its path."""
    if f.uniform_n and f.chain_shaped.all():   # (chain_shaped: set by the frame for a uniform batch)
        return _chain_answers(kern, f, ok)[0]
    if f.uniform_n and f.__dict__.get("_shapes") is not None:
        return _tree_answers(kern, f, ok)[0]
    return kern.path_argmax_bad(ok, f.path, f.path_start, f.path_len, f.start, f.argmax, f.tokens, f.inv)


def _chain_answers(kern, f, ok) -> tuple[bool, bool]:
    """(SA304's, SA305's) answers on a uniform-N batch of chains: one pass over tokens and
    argmax (path_chain_bad), made by the first of the two rules to ask and kept on the
    frame for the other (both pass the same ok: path_ok & ~sampled)."""
    got = f.__dict__.get("_path_chain_answers")
    if got is None:
        R = f.R
        got = kern.path_chain_bad(ok, f.path_len, f.inv, f.tokens.reshape(R, -1), f.argmax.reshape(R, -1))
        f.__dict__["_path_chain_answers"] = got
    return got


def _tree_answers(kern, f, ok) -> tuple[bool, bool]:
    """(SA304's, SA305's) answers on a uniform-N batch of shapes the frame grouped already:
    one pass over each row's path and its tokens and argmax (path_tree_bad), made by the
    first of the two rules to ask and kept on the frame for the other (same ok)."""
    got = f.__dict__.get("_path_tree_answers")
    if got is None:
        R = f.R
        got = kern.path_tree_bad(ok, f.path, f.path_start, f.path_len, f.inv, f._shapes[0], f.shape_children,
                                 f.tokens.reshape(R, -1), f.argmax.reshape(R, -1))
        f.__dict__["_path_tree_answers"] = got
    return got


def _path_not_maximal(kern, f, ok) -> bool:
    """SA305's mask has a hit (compiled): a uniform-N batch of chains (the next node is the
    only child) or of shapes the frame grouped already (by their children tables), any
    other by the safe parents."""
    if f.uniform_n:
        if f.chain_shaped.all():   # (set by the frame for a uniform batch: no cost)
            return _chain_answers(kern, f, ok)[1]
        shapes = f.__dict__.get("_shapes")   # grouped by the frame when every row is ok
        if shapes is not None:
            return _tree_answers(kern, f, ok)[1]
    return kern.path_not_maximal(ok, f.path, f.path_start, f.path_len, f.start, f.n, f.parent_in_row,
                                 f.tokens, f.argmax, f.inv)


class CommitLenVsTokens(Rule):
    """What: commit_len = len(committed_tokens).

    Why: the counter must count the tokens the engine actually appended.

    Example: committed_tokens holds 4 tokens and commit_len says 2.
    """

    code = "SA306"
    live = ("prom",)
    name = "commit-len-vs-tokens"
    message = "commit_len is {commit_len} but committed_tokens holds {n} tokens"

    def check(self, f):
        return Hits(f.commit_len != f.commit_n, commit_len=f.commit_len, n=f.commit_n)

    def fail(self, run):
        run.steps[3]["commit_len"] += 1


class CommittedTokens(Rule):
    """What: an unfinished step commits exactly the accepted draft tokens then the
    bonus (target_argmax at the path's last node); a finished step commits a prefix
    of that.

    Why: the commit is what the user receives; a commit that is not the accepted
    drafts + bonus is not the target's greedy output.

    Example: path tokens [95, 184] and bonus 40, committed [95, 184, 41].
    """

    code = "SA307"
    live = ("prom",)
    name = "committed-tokens"
    message = "committed_tokens {got} are not the accepted drafts + bonus {want}: {what}"

    def check(self, f):
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and not kern.committed_tokens_bad(f.path_ok, f.finished, f.commit_n, f.path_len,
                                                              f.commit_mismatch_at):
            return None   # numpy's mask would be all false
        ok = f.path_ok
        mis = f.commit_mismatch_at
        short = ~f.finished & (f.commit_n < f.path_len) & (mis < 0)
        bad = ok & ((mis >= 0) | short)
        if not bad.any():
            return None
        rows = np.flatnonzero(bad)
        what = lambda i: ("the commit is shorter but the step is not finished" if short[i]
                          else f"first difference at index {mis[i]}")
        return Hits(bad, got=_lists(f, rows, f.commit, f.commit_start, f.commit_n),
                    want=_lists(f, rows, f.expected_commit, f.path_start, f.path_len), what=what)

    def fail(self, run):
        s = run.steps_where(lambda s: not s["finished"])[1]
        s["committed_tokens"][-1] = (s["committed_tokens"][-1] % 250) + 1


class CommitEndsAtEos(Rule):
    """What: a commit holds no token after an EOS.

    Why: the request ends at EOS; drafts accepted past it must not be committed (or
    counted). Engines that forget the cut emit text after the end and inflate the
    committed and accepted counts.

    Example: EOS 10 at commit index 1 of [7, 10, 33, 12]: three tokens past EOS.
    """

    code = "SA308"
    live = ("prom", "kernel:eos")
    name = "commit-ends-at-eos"
    message = "the commit holds EOS ({eos}) at index {k} but goes on for {extra} more token(s)"

    def check(self, f):
        k = f.commit_eos_at
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and not kern.eos_inside_commit(k, f.commit_n):
            return None   # no token committed after an EOS: numpy's mask would be all false
        bad = (k >= 0) & (k < f.commit_n - 1)
        return Hits(bad, eos=f.eos_id, k=k, extra=f.commit_n - 1 - k)

    def fail(self, run):
        # the target's argmax at the root is EOS and the draft matched it, yet the commit
        # goes on past it: the tokens stay the accepted drafts then the bonus (SA307 holds),
        # so a home that re-derives the commit from the tree sees the same EOS
        s = run.steps_where(_unfinished_with_depth)[0]
        s["target_argmax"][0] = s["node_tokens"][s["accepted_path"][1]] = run.eos_id
        s["committed_tokens"][0] = run.eos_id
        s["finished"] = True


class EosFinishes(Rule):
    """What: a step whose commit holds EOS is finished.

    Why: EOS ends the request; a step after it generates text past the end.

    Example: committed [5, 0] with EOS 0 and finished false.
    """

    code = "SA309"
    live = ("prom",)
    name = "eos-finishes"
    message = "the commit holds EOS ({eos}) at index {k} but the step is not finished"

    def check(self, f):
        k = f.commit_eos_at
        return Hits((k >= 0) & ~f.finished, eos=f.eos_id, k=k)

    def fail(self, run):
        s = run.steps_where(lambda s: s["finished"] and s["committed_tokens"]
                            and s["committed_tokens"][-1] == 0)[0]
        s["finished"] = False


class CountersSign(Rule):
    """What: accepted_depth >= 0 and commit_len >= 1.

    Why: every step commits at least the bonus token; a negative or empty count is
    the "empty commit" bug that reported -1 accepted tokens and crashed a counter.

    Example: accepted_depth -1, commit_len 0.
    """

    code = "SA310"
    live = ("prom",)
    name = "counters-sign"
    message = "accepted_depth {accepted_depth} and commit_len {commit_len}: a step commits at least one token"

    def check(self, f):
        bad = (f.accepted_depth < 0) | (f.commit_len < 1) | (f.commit_n < 1)
        return Hits(bad, accepted_depth=f.accepted_depth, commit_len=f.commit_len)

    def fail(self, run):
        s = run.steps[1]
        s["accepted_depth"], s["commit_len"] = -1, 0


class FinishCause(Rule):
    """What: a request finishes exactly when its commit ends at EOS or its output
    reaches the token limit (config.max_new_tokens), never past the limit.

    Why: finishing for no reason truncates a user's answer; not finishing at the
    limit lets the output overrun it. The output length is known from the first
    token and every earlier commit of the request.

    Example: a finished step that commits [5, 9] with no EOS when the output holds 30
    of 64 tokens.
    """

    code = "SA311"
    name = "finish-cause"
    message = "{what}"

    def check(self, f):
        if f.max_new_tokens is None:
            return None
        M = f.max_new_tokens
        kern = compiled.kernels(_KERNELS, rows=f.R)
        if kern is not None and not kern.token_limit_bad(M, f.eos_id, f.out_before, f.commit_n, f.commit_last,
                                                         f.contiguous, f.path_ok, f.finished):
            return None   # numpy's mask would be all false
        out = f.out_before + f.commit_n
        ends_eos = f.commit_last == f.eos_id
        usable = f.contiguous & f.path_ok
        no_cause = f.finished & ~ends_eos & (out != M)
        over = out > M
        missed = ~f.finished & (out >= M) & ~over
        bad = usable & (no_cause | over | missed)
        if not bad.any():
            return None
        what = np.full(f.R, "", dtype=object)
        r = np.flatnonzero(bad & no_cause & ~over)
        for i in r:
            what[i] = (f"the step finished after committing {f.commit_n[i]} token(s) but the commit does not "
                       f"end at EOS ({f.eos_id}) and the output holds {out[i]} of {M} tokens")
        for i in np.flatnonzero(bad & over):
            what[i] = f"the output reaches {out[i]} tokens, past the token limit {M}"
        for i in np.flatnonzero(bad & missed):
            what[i] = f"the output reached the token limit ({out[i]} of {M}) but the step is not finished"
        return Hits(bad, what=what)

    def fail(self, run):
        s = run.steps_where(lambda s: s["finished"] and s["committed_tokens"]
                            and s["committed_tokens"][-1] != 0)[0]
        s["finished"] = False
