"""The report's section on engine outputs (logs, scrapes, AIPerf / JSON records).

    html, pngs = engine_section(windows, findings)     # windows: engine_views.windows_table
    path = build_engine_report(windows, findings, "report/")   # a page with only this section

What a post-mortem of a production log needs first: which engine and format version each
file is, how many windows at which concurrency, the figures the engine printed there
(means over windows; the same numbers as `specaudit query FILE "SELECT ... FROM windows"`),
the readers' findings by code, and one plot of accept length and throughput per window.
"""
from __future__ import annotations

import base64
import time
from pathlib import Path

import pyarrow as pa

from specaudit.numfmt import cell
from specaudit.postmortem.report import CSS, _empty, _escape, _legend, _png, _subplots, _table
from specaudit.trace.safe_io import atomic_write_bytes

SUMMARY_KEYS = ("file", "engine", "version", "concurrency")


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def summary_rows(windows: pa.Table) -> list[list]:
    """One row per (file, engine, version, concurrency): windows and mean figures."""
    groups: dict = {}
    for r in windows.to_pylist():
        groups.setdefault(tuple(r[k] for k in SUMMARY_KEYS), []).append(r)
    out = []
    for key, rs in sorted(groups.items(), key=lambda kv: tuple("" if v is None else str(v) for v in kv[0])):
        f, eng, ver, c = key
        out.append([f, eng or "", ver or "not inferable", "not printed" if c is None else cell(c), cell(len(rs)),
                    cell(_mean(r["accept_len"] for r in rs)), cell(_mean(r["accept_rate"] for r in rs)),
                    cell(_mean(r["gen_tps"] for r in rs))])
    return out


def plot_windows(windows: pa.Table):
    """accept length (top) and generation throughput (bottom) per window, one line per file."""
    fig, (top, bottom) = _subplots(2, 1, sharex=True)
    rows = windows.to_pylist()
    if not rows:
        _empty(top, "no windows")
        return fig
    files = list(dict.fromkeys(r["file"] for r in rows))
    for f in files:
        rs = [r for r in rows if r["file"] == f]
        name = Path(f).name
        top.plot(range(len(rs)), [r["accept_len"] for r in rs], marker=".", lw=1, label=name)
        bottom.plot(range(len(rs)), [r["gen_tps"] for r in rs], marker=".", lw=1, label=name)
    top.set_ylabel("accept length")
    bottom.set_ylabel("gen tokens/s")
    bottom.set_xlabel("window (log line or scrape interval, in file order)")
    _legend(top, len(files))
    return fig


def _findings_rows(findings) -> list[list]:
    by: dict = {}
    for f in findings:
        d = f.to_dict() if hasattr(f, "to_dict") else dict(f)
        by.setdefault((d.get("code"), d.get("severity")), []).append(d)
    return [[code, sev, cell(len(ds)), f"{Path(str(ds[0].get('file'))).name} line {ds[0].get('line')}: "
             f"{ds[0].get('message')}"] for (code, sev), ds in sorted(by.items(), key=lambda kv: str(kv[0]))]


def engine_section(windows: pa.Table, findings) -> tuple[str, dict]:
    """(the section's HTML, {stem: png bytes}). findings None: the readers' rules not run."""
    png = _png(plot_windows(windows))
    b64 = base64.b64encode(png).decode("ascii")
    parts = ["<h2 id=\"h-engine-outputs\">Engine outputs</h2>",
             _table(["file", "engine", "version", "concurrency", "windows", "mean accept len", "mean accept rate",
                     "mean gen tokens/s"], summary_rows(windows), numeric={4, 5, 6, 7}),
             '<p class="meta">Means over windows as the engine printed them; each row is what '
             '<code>specaudit query FILE "SELECT ... FROM windows GROUP BY file, engine, version, concurrency"'
             "</code> gives. Windows at different concurrencies are never pooled here.</p>"]
    if findings is None:
        parts.append("<p>The readers' rules were not run (--no-check): run <code>specaudit check FILE</code>.</p>")
    elif not findings:
        parts.append('<p>Readers\' rules (SA7xx): <span class="ok">no identity these outputs hold is broken</span>'
                     " (what could not be checked is listed by <code>specaudit check FILE</code>).</p>")
    else:
        parts.append(_table(["code", "severity", "findings", "first"], _findings_rows(findings), numeric={2}))
    parts.append(f'<figure><img id="engine_windows" class="plot" alt="accept length and throughput per window" '
                 f'src="data:image/png;base64,{b64}"><figcaption>Accept length and generation throughput per '
                 "window, in file order. Data: the <code>windows</code> view; image: "
                 "<code>engine_windows.png</code>.</figcaption></figure>")
    return "".join(parts), {"engine_windows": png}


def build_engine_report(windows: pa.Table, findings, out_dir, *, title: str | None = None,
                        sources: str = "") -> Path:
    """A report page holding only engine outputs (no trace datasets given)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    html, pngs = engine_section(windows, findings)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot create the folder: {e.strerror or e}") from None
    for stem, png in pngs.items():
        atomic_write_bytes(out / f"{stem}.png", png)
    head = title or "specaudit post-mortem report"
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_escape(head)}</title>'
            f"<style>{CSS}</style></head><body><h1>{_escape(head)}</h1>"
            f'<p class="meta">{_escape(sources)} · {windows.num_rows:,} windows · generated '
            f'{time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}</p>{html}</body></html>\n')
    path = out / "report.html"
    atomic_write_bytes(path, page.encode("utf-8"))
    return path
