"""The one line a traced run ends with: each figure derived from the rows, the runtime's
own counter beside it and the verdict of specaudit.audit.compare (`specaudit run`, the demo).

    chain-b7-...: 24 requests, 310 steps, mean accepted depth 4.86 (reported 5.86, DISAGREES), ...
"""
from __future__ import annotations

from specaudit.audit.compare import verdict
from specaudit.numfmt import fixed


def beside(s: dict, key: str, nd: int) -> str:
    """'5.86 (reported 7.00, DISAGREES)': the derived figure s[key], then the runtime's own
    counter s['reported_' + key] and the verdict when it is not 'agrees'."""
    der, rep = s.get(key), s.get(f"reported_{key}")
    text = fixed(der, nd)
    if rep is None:
        return text
    v = verdict(rep, der) if der is not None else "no verdict"
    return f"{text} (reported {fixed(rep, nd)}{'' if v == 'agrees' else ', ' + v.upper()})"


def summary_line(s: dict) -> str:
    """The run's summary (run_traced(...).summary) as one line."""
    line = (f"{s['run_id']}: {s['requests']} requests, {s['steps']} steps, "
            f"mean accepted depth {beside(s, 'mean_accepted_depth', 2)}, "
            f"mean commit length {beside(s, 'mean_commit_len', 2)}, {beside(s, 'tokens_per_s', 1)} tokens/s")
    if "speedup" in s:
        line += (f", {fixed(s['speedup'])}x plain greedy ({fixed(s['greedy_tokens_per_s'], 1)} tokens/s), "
                 f"lossless: {'yes' if s['lossless'] else 'NO'}")
    return line
