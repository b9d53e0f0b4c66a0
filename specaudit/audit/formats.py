"""Output formats shared by every auditing reader: text, json, junit, github, sarif.

    from specaudit.audit.formats import format_findings
    text = format_findings(findings, "sarif", counts=None, summary={"files_checked": 1})

`findings` is a list of specaudit.findings.Finding; `counts` (code -> total) lets a
caller that kept only the first findings of each code report the true totals. The
trace checker, the engine-log readers and the estimator all print through here so
their outputs parse the same way.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from specaudit import __version__
from specaudit.numfmt import printable  # noqa: F401  (formats' callers escape with it too)

FORMATS = ("text", "json", "junit", "github", "sarif")
INFO_URI = "https://github.com/specaudit/specaudit"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def _rules_for(codes, rules):
    """code -> Rule instance (from the registry when not given), for rule metadata."""
    out = dict(rules or {})
    missing = [c for c in codes if c not in out]
    if missing:
        try:
            from specaudit.invariants import get_rule
            for c in missing:
                r = get_rule(c)
                if r is not None:
                    out[c] = r
        except Exception:  # metadata is a nicety; never fail the output for it
            pass
    return out


def _meta(findings, counts):
    counts = Counter(counts) if counts is not None else Counter(f.code for f in findings)
    sev, names = {}, {}
    for f in findings:
        sev.setdefault(f.code, f.severity)
        names.setdefault(f.code, f.name)
    return counts, sev, names


def format_findings(findings, fmt: str = "text", *, counts=None, summary: dict | None = None,
                    statistics: bool = False, examples: int = 3, rules: dict | None = None,
                    checked: list | None = None, title: str = "specaudit check") -> str:
    """Render findings in one of FORMATS. Returns the text (ending with a newline).

    counts:   code -> total findings (default: counted from `findings`)
    summary:  numbers about what was checked (runs, steps, files_checked, ...); shown
              in text and json, and as testsuite properties in junit
    statistics: text only: one line per code with its count (ruff --statistics)
    examples: text only: findings shown per code (0 = all kept)
    rules:    code -> Rule, for names/docs (default: the registry)
    checked:  the rule codes that ran (junit lists passing rules as passing tests)
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown output format {fmt!r}; one of {', '.join(FORMATS)}")
    return {"text": _text, "json": _json, "junit": _junit, "github": _github, "sarif": _sarif}[fmt](
        list(findings), counts=counts, summary=summary or {}, statistics=statistics, examples=examples,
        rules=rules, checked=checked, title=title)


# ----------------------------------------------------------------------- text


def _plural(n, word):
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def summary_line(counts, sev, summary: dict) -> str:
    errors = sum(n for c, n in counts.items() if sev.get(c) == "error")
    warns = sum(n for c, n in counts.items() if sev.get(c) == "warning")
    codes = [c for c, n in counts.items() if n and sev.get(c) == "error"]
    parts = []
    # a Prometheus range's series groups are counted among the inputs checked, but they are no files
    live = sum(1 for d in summary.get("readings") or () if d.get("source") == "prometheus")
    n = dict(summary, files_checked=(summary.get("files_checked") or 0) - live, live=live)
    if live:
        n["windows"] = sum(d.get("windows") or 0 for d in summary["readings"] if d.get("source") == "prometheus")
    for k, word in (("runs", "run"), ("steps", "step"), ("requests", "request"), ("files_checked", "file"),
                    ("live", "Prometheus series group"), ("windows", "window")):
        if n.get(k):
            parts.append(_plural(n[k], word))
    what = f"checked {', '.join(parts)}" if parts else "checked"
    head = (f"Found {_plural(errors, 'violation')} of {_plural(len(codes), 'rule')}" if errors
            else "No violations in what could be checked (each reading's account says what that was)"
            if summary.get("readings") else "No violations")
    tail = []
    if warns:
        tail.append(_plural(warns, "warning"))
    if summary.get("incomplete_runs"):
        tail.append(f"{_plural(summary['incomplete_runs'], 'incomplete run')} (checked for what it holds)")
    if summary.get("bad_files"):
        tail.append(f"{_plural(summary['bad_files'], 'unreadable file')}")
    return f"{head}; {what}." + (f" {'; '.join(tail)}." if tail else "")


def _text(findings, *, counts, summary, statistics, examples, rules, checked, title):
    counts, sev, names = _meta(findings, counts)
    by_code: dict[str, list] = {}
    for f in findings:
        by_code.setdefault(f.code, []).append(f)
    lines = []
    if summary.get("readings"):   # engine inputs: what was read, checked and not checkable, first
        from specaudit.audit.sources.account import render
        for doc in summary["readings"]:
            lines += [printable(x) for x in render(doc)]
        lines.append("")
    if statistics:
        w = max((len(f"{n:,}") for n in counts.values()), default=1)
        nw = max((len(names.get(c, "")) for c in counts), default=1)
        for code in sorted(counts):
            lines.append(f"{counts[code]:>{w},}  {code}  {names.get(code, ''):<{nw}}  [{sev.get(code, 'error')}]")
        lines.append("")
    else:
        for code in sorted(counts):
            n = counts[code]
            items = by_code.get(code, [])
            lines.append(f"{code} {names.get(code, '')} ({sev.get(code, 'error')}): {_plural(n, 'finding')}")
            show = items if examples <= 0 else items[:examples]
            for f in show:
                loc = f"{printable(f.file)}:{f.line}: " if f.line is not None and f.file else ""
                lines.append(f"  {loc}{f.code} {printable(f.message)}")
            more = n - len(show)
            if more > 0:
                lines.append(f"  ... and {more:,} more (--output-format json lists them; "
                             f"`specaudit rules {code}` explains the rule)")
        if counts:
            lines.append("")
    lines.append(summary_line(counts, sev, summary))
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------- json


def _json(findings, *, counts, summary, statistics, examples, rules, checked, title):
    counts, sev, names = _meta(findings, counts)
    kept = Counter(f.code for f in findings)
    doc = {
        "tool": "specaudit", "version": __version__, "title": title,
        "summary": {**summary, "violations": sum(n for c, n in counts.items() if sev.get(c) == "error")},
        "counts": {c: counts[c] for c in sorted(counts)},
        "rules": {c: {"name": names.get(c), "severity": sev.get(c)} for c in sorted(counts)},
        "truncated": {c: counts[c] - kept[c] for c in sorted(counts) if counts[c] > kept[c]},
        "findings": [f.to_dict() for f in findings],
    }
    return json.dumps(doc, indent=1, default=_default) + "\n"


def _default(o):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


# ---------------------------------------------------------------------- junit


def _junit(findings, *, counts, summary, statistics, examples, rules, checked, title):
    counts, sev, names = _meta(findings, counts)
    codes = sorted(set(checked or ()) | set(counts))
    meta = _rules_for(codes, rules)
    by_code: dict[str, list] = {}
    for f in findings:
        by_code.setdefault(f.code, []).append(f)
    failures = sum(1 for c in codes
                   if counts.get(c) and sev.get(c, getattr(meta.get(c), "severity", "error")) == "error")
    title = printable(title)
    suites = ET.Element("testsuites", name=title, tests=str(len(codes)), failures=str(failures), errors="0")
    suite = ET.SubElement(suites, "testsuite", name=title, tests=str(len(codes)), failures=str(failures),
                          errors="0", skipped="0")
    if summary:
        props = ET.SubElement(suite, "properties")
        for k, v in summary.items():
            if k == "readings":   # engine inputs' accounts: one property per file, its verdict
                for doc in v:
                    ET.SubElement(props, "property", name=printable(f"reading {doc['file']}"),
                                  value=printable(doc["verdict"]))
                continue
            ET.SubElement(props, "property", name=printable(k), value=printable(v))
    for c in codes:
        r = meta.get(c)
        name = names.get(c) or getattr(r, "name", "")
        tc = ET.SubElement(suite, "testcase", classname=f"specaudit.{c[:3]}", name=f"{c} {name}".strip(),
                           time="0")
        n = counts.get(c, 0)
        if not n:
            continue
        body = "\n".join(f"{f.code} {printable(f.message)}" for f in by_code.get(c, []))
        s = sev.get(c, getattr(r, "severity", "error"))
        if s == "error":
            el = ET.SubElement(tc, "failure", message=f"{n} finding(s): {printable(by_code[c][0].message)}"[:500]
                               if by_code.get(c) else f"{n} finding(s)", type=c)
            el.text = body
        else:
            out = ET.SubElement(tc, "system-out")
            out.text = body
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


# --------------------------------------------------------------------- github


def _gh_data(s: str) -> str:
    return printable(s).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_prop(s: str) -> str:
    return _gh_data(s).replace(":", "%3A").replace(",", "%2C")


def _github(findings, *, counts, summary, statistics, examples, rules, checked, title):
    lines = []
    cmd = {"error": "error", "warning": "warning", "info": "notice"}
    for f in findings:
        props = []
        if f.file:
            props.append(f"file={_gh_prop(_rel(f.file))}")
        if f.line is not None:
            props.append(f"line={int(f.line)}")
        props.append(f"title={_gh_prop(f'{f.code} {f.name}')}")
        lines.append(f"::{cmd.get(f.severity, 'error')} {','.join(props)}::{_gh_data(f.message)}")
    counts, sev, _ = _meta(findings, counts)
    for doc in summary.get("readings") or ():   # each engine input's verdict, as a notice
        lines.append(f"::notice file={_gh_prop(_rel(doc['file']))},title={_gh_prop('specaudit reading')}::"
                     f"{_gh_data(doc['verdict'])}")
    lines.append(summary_line(counts, sev, summary))
    return "\n".join(lines) + "\n"


def _rel(path: str) -> str:
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except (ValueError, OSError):
        return Path(path).as_posix()


# ---------------------------------------------------------------------- sarif


def _sarif(findings, *, counts, summary, statistics, examples, rules, checked, title):
    codes = sorted(set(checked or ()) | {f.code for f in findings})
    meta = _rules_for(codes, rules)
    index = {c: i for i, c in enumerate(codes)}
    drules = []
    for c in codes:
        r = meta.get(c)
        doc = r.doc() if r is not None else ""
        short = r.summary() if r is not None else c
        drules.append({
            "id": c, "name": getattr(r, "name", c) or c,
            "shortDescription": {"text": short},
            "fullDescription": {"text": doc or short},
            "help": {"text": f"{doc}\n\nspecaudit rules {c}".strip()},
            "defaultConfiguration": {"level": _SARIF_LEVEL.get(getattr(r, "severity", "error"), "error")},
        })
    results = []
    for f in findings:
        loc = {}
        if f.file:
            phys = {"artifactLocation": {"uri": _rel(f.file)}}
            if f.line is not None:
                phys["region"] = {"startLine": max(int(f.line), 1)}
            loc["physicalLocation"] = phys
        logical = " ".join(x for x in (f"run {f.run_id}" if f.run_id else "",
                                       f"request {f.request_id}" if f.request_id is not None else "",
                                       f"step {f.step}" if f.step is not None else "") if x)
        if logical:
            loc["logicalLocations"] = [{"name": logical, "kind": "object"}]
        res = {"ruleId": f.code, "level": _SARIF_LEVEL.get(f.severity, "error"),
               "message": {"text": f.message}, "properties": {"values": f.values}}
        if f.code in index:
            res["ruleIndex"] = index[f.code]
        if loc:
            res["locations"] = [loc]
        results.append(res)
    doc = {
        "$schema": SARIF_SCHEMA, "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "specaudit", "version": __version__, "informationUri": INFO_URI,
                                "rules": drules}},
            "results": results,
            "properties": {"summary": summary, "counts": dict(_meta(findings, counts)[0])},
        }],
    }
    return json.dumps(doc, indent=1, default=_default) + "\n"
