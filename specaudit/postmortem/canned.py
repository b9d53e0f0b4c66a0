"""The canned post-mortem queries: the documented SQL files of specaudit/postmortem/queries/,
their header comment parsed into a title, a description and the --param names."""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources


@dataclass
class Canned:
    """One documented SQL file from specaudit/postmortem/queries/."""

    name: str
    title: str
    doc: str            # the header comment, without the leading '-- '
    params: dict        # name -> description (with its default)
    sql: str            # the whole file (header included: it is a comment)


def _parse_canned(name: str, text: str) -> Canned:
    head = []
    for line in text.splitlines():
        if line.startswith("--"):
            head.append(line[2:].removeprefix(" "))
        elif line.strip():
            break
        else:
            head.append("")
    title = head[0].strip() if head else name
    params = {}
    for ln in head:
        m = re.match(r"^param\s+([A-Za-z_]\w*)\s*:\s*(.*)$", ln.strip())
        if m:
            params[m.group(1)] = m.group(2)
    return Canned(name=name, title=title, doc="\n".join(head).strip(), params=params, sql=text)


def canned_queries() -> dict[str, Canned]:
    """All canned queries by name (file stem), in file-name order."""
    root = resources.files("specaudit.postmortem").joinpath("queries")
    out = {}
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".sql"):
            name = entry.name[:-4]
            out[name] = _parse_canned(name, entry.read_text(encoding="utf-8"))
    return out


def canned(name: str) -> Canned:
    """The canned query called name; ValueError listing the known ones otherwise."""
    qs = canned_queries()
    if name not in qs:
        raise ValueError(f"unknown canned query {name!r}; known: {', '.join(qs)} "
                         "(specaudit query --list describes them)")
    return qs[name]


def describe_canned() -> str:
    """The --list text: name, title, parameters."""
    lines = []
    for q in canned_queries().values():
        lines.append(f"{q.name:30s} {q.title}")
        for p, d in q.params.items():
            lines.append(f"{'':30s}   --param {p}=...  {d}")
    return "\n".join(lines)
