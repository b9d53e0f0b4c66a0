"""`specaudit report`: one self-contained HTML page (and a PNG per plot) for a post-mortem.

    from specaudit.postmortem.report import build_report
    html = build_report(["traces/"], "report/", findings=res.findings, summary=res.summary())

The page has the run configs (each run's mean accepted depth, mean commit length, accept
rate and tokens/s derived from the raw tensors, beside the engine's reported figure and the
verdict of specaudit.audit.compare, from the `figures` view) and the checker's summary on top, then six plots, each also
written as a PNG beside report.html:
    acceptance_by_depth.png            reach and conditional acceptance rate per depth
    commit_length_histogram.png        share of steps per commit length
    acceptance_vs_draft_confidence.png drafter calibration: accept rate vs draft probability
    latency_breakdown.png              draft / verify / other time per step
    commit_length_over_time.png        mean commit length and tokens/s over each run's time
    violations_by_code.png             the checker's findings per rule code
Every number comes from the canned queries in specaudit/queries/ over the read-only
DuckDB views (specaudit.query), so `specaudit query PATH NAME` prints the data behind a
plot. The page loads nothing: CSS is inline and the images are data: URIs.
"""
from __future__ import annotations

import base64
import html
import io
import threading
import time
from pathlib import Path

from specaudit.numfmt import cell
from specaudit.trace.safe_io import atomic_write_bytes

PLOTS = [
    # (file stem, title, canned query, what the reader should look for)
    ("acceptance_by_depth", "Acceptance by depth", "acceptance_by_depth",
     "Left: share of steps whose accepted path reaches each depth (sums to the mean accepted "
     "depth). Right: share of steps at depth d-1 that go on to d. A sudden drop at one depth "
     "points at that draft position, or at a position/mask bug there."),
    ("commit_length_histogram", "Commit-length histogram", "commit_length_histogram",
     "Share of verify steps committing 1, 2, ... tokens, counted from the committed tokens (the "
     "query's counter_disagrees column counts steps whose commit_len counter says otherwise). "
     "Mass at 1 is a drafter that never lands; anything above budget + 1 is impossible."),
    ("acceptance_vs_draft_confidence", "Acceptance against draft confidence",
     "acceptance_vs_draft_logprob",
     "Reached draft nodes binned by draft probability: accept rate against the mean draft "
     "probability of the bin. A calibrated drafter sits on the diagonal; a flat line means its "
     "confidence carries no information."),
    ("latency_breakdown", "Draft / verify / other latency", "latency_breakdown",
     "Mean wall time per step: drafting, verifying, and everything else. Acceptance cannot win "
     "back time spent outside the two forwards."),
    ("commit_length_over_time", "Commit length over time", "throughput_over_time",
     "Each run's wall time in equal buckets: mean commit length (top; solid: derived from the "
     "committed tokens, dashed: the engine's commit_len counter) and committed tokens per second "
     "(bottom). A step change marks when something happened; solid and dashed apart is a counter bug."),
    ("violations_by_code", "Violations by code", "violations_by_code",
     "The checker's findings per rule code, colored by severity (`specaudit rules` explains "
     "each code)."),
]
SEVERITY_COLORS = {"error": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}
PX_W, PX_H, DPI = 900, 460, 100        # every PNG is 900 x 460 px, shown at natural size
FIG_W, FIG_H = PX_W / DPI, PX_H / DPI


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# Fixed margins instead of constrained_layout: the layout engine measures every tick label
# in extra draw passes, about a third of a report's plotting time; these fit the labels the
# plots draw (left grows for the horizontal bars' category names).
MARGINS = dict(left=0.07, right=0.985, bottom=0.11, top=0.93, wspace=0.2, hspace=0.12)


def _subplots(nrows: int = 1, ncols: int = 1, left: float | None = None, **kw):
    plt = _plt()
    fig, axes = plt.subplots(nrows, ncols, figsize=(FIG_W, FIG_H), **kw)
    fig.subplots_adjust(**{**MARGINS, **({"left": left} if left is not None else {})})
    return fig, axes


def _png(fig) -> bytes:
    buf = io.BytesIO()
    # zlib level 1: the same pixels, ~10% more bytes; encoding the six plots took 0.22 s
    # of CPU at the default level 6, 0.15 s at level 1 (of ~1.7 s drawing them)
    fig.savefig(buf, format="png", dpi=DPI, pil_kwargs={"compress_level": 1})
    _plt().close(fig)
    return buf.getvalue()


def _groups(rows: list[dict], key: str = "config") -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(r[key], []).append(r)
    return out


def _legend(ax, n: int) -> None:
    if n:
        ax.legend(fontsize=7 if n > 4 else 8, loc="best", ncol=1 if n <= 6 else 2)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=12, color="#555",
            transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


# ------------------------------------------------------------------------- plots

def plot_acceptance_by_depth(rows):
    fig, (a1, a2) = _subplots(1, 2)
    g = _groups(rows)
    for cfg, rs in g.items():
        d = [r["depth"] for r in rs]
        a1.plot(d, [r["reach_rate"] for r in rs], marker="o", ms=3, label=cfg)
        a2.plot(d, [r["conditional_rate"] for r in rs], marker="o", ms=3, label=cfg)
    for ax, t in ((a1, "reach rate: P(accepted depth >= d)"), (a2, "conditional: P(>= d | >= d-1)")):
        ax.set_xlabel("depth d")
        ax.set_title(t, fontsize=10)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    if not g:
        _empty(a1, "no steps")
    _legend(a1, len(g))
    return fig


def plot_commit_hist(rows):
    fig, ax = _subplots()
    g = _groups(rows)
    n = max(len(g), 1)
    w = 0.8 / n
    for i, (cfg, rs) in enumerate(g.items()):
        ax.bar([r["commit_len"] + (i - (n - 1) / 2) * w for r in rs], [r["share"] for r in rs],
               width=w, label=cfg)
    ax.set_xlabel("tokens committed in the step (len(committed_tokens))")
    ax.set_ylabel("share of steps")
    ax.grid(alpha=0.3, axis="y")
    if not g:
        _empty(ax, "no steps")
    _legend(ax, len(g))
    return fig


def plot_calibration(rows):
    fig, ax = _subplots()
    ax.plot([0, 1], [0, 1], ls="--", color="#888", lw=1, label="calibrated")
    g = _groups(rows)
    for cfg, rs in g.items():
        tot = max(sum(r["reached"] for r in rs), 1)
        ax.plot([r["mean_draft_p"] for r in rs], [r["accept_rate"] for r in rs], marker="o", ms=3, lw=1)
        ax.scatter([r["mean_draft_p"] for r in rs], [r["accept_rate"] for r in rs],
                   s=[8 + 200 * r["reached"] / tot for r in rs], alpha=0.6, label=cfg)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("mean draft probability in the bin, exp(draft_logprob)")
    ax.set_ylabel("accept rate of reached nodes")
    ax.grid(alpha=0.3)
    if not g:
        _empty(ax, "no draft_logprob in the trace")
    _legend(ax, len(g) + 1)
    return fig


def plot_latency(rows):
    cfgs = [r["config"] for r in rows]
    fig, ax = _subplots(left=min(0.45, 0.05 + 0.0075 * max((len(str(c)) for c in cfgs), default=0)))
    y = list(range(len(rows)))
    left = [0.0] * len(rows)
    for key, label, color in (("mean_draft_s", "draft", "#42a5f5"), ("mean_verify_s", "verify", "#66bb6a"),
                              ("mean_other_s", "other", "#bdbdbd")):
        vals = [max((r[key] or 0.0) * 1e3, 0.0) for r in rows]
        ax.barh(y, vals, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(y, cfgs, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("mean milliseconds per step")
    ax.grid(alpha=0.3, axis="x")
    if not rows:
        _empty(ax, "no steps")
    else:
        ax.legend(fontsize=8, loc="lower right")
    return fig


def plot_over_time(rows):
    fig, (a1, a2) = _subplots(2, 1, left=0.1, sharex=True)
    g = _groups(rows, "run_id")
    for rid, rs in g.items():
        t = [r["t_rel_s"] + r["bucket_s"] / 2 for r in rs]
        label = f"{rs[0]['config']} ({rid})" if rs[0]["config"] != rid else rid
        line, = a1.plot(t, [r["mean_commit_len"] for r in rs], lw=1.2, label=label)
        rep = [r.get("reported_mean_commit_len") for r in rs]
        if any(v is not None for v in rep):
            a1.plot(t, rep, lw=1.0, ls="--", color=line.get_color())
        a2.plot(t, [r["tokens_per_s"] for r in rs], lw=1.2)
    a1.set_ylabel("mean commit len\n(solid derived,\ndashed reported)", fontsize=8)
    a2.set_ylabel("tokens / s")
    a2.set_xlabel("seconds since the run's first step")
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
    if not g:
        _empty(a1, "no steps")
    _legend(a1, len(g))
    return fig


def plot_violations(rows, checked: bool):
    fig, ax = _subplots(left=0.4 if rows else None)
    if not rows:
        _empty(ax, "no findings: every rule held" if checked else "checker not run (no findings passed in)")
        return fig
    rows = rows[:30]
    y = list(range(len(rows)))
    ax.barh(y, [r["findings"] for r in rows],
            color=[SEVERITY_COLORS.get(r["severity"], "#777") for r in rows])
    ax.set_yticks(y, [f"{r['code']} {r['name'] or ''}"[:48] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("findings")
    if max(r["findings"] for r in rows) > 50 * max(min(r["findings"] for r in rows), 1):
        ax.set_xscale("log")
    for sev, c in SEVERITY_COLORS.items():
        if any(r["severity"] == sev for r in rows):
            ax.barh([], [], color=c, label=sev)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, axis="x")
    return fig


# ------------------------------------------------------------------------- html

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
 max-width:960px;color:#222;background:#fff;padding:0 16px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#666;font-size:12px}
table{border-collapse:collapse;font-size:12px;margin:6px 0;width:100%}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums} th{background:#f5f5f5}
.bad{color:#c62828;font-weight:600} .ok{color:#2e7d32;font-weight:600}
figure{margin:14px 0 22px} figure img{display:block;border:1px solid #eee}
figcaption{color:#555;font-size:12px;max-width:900px;margin-top:4px}
code{background:#f5f5f5;padding:0 3px}
"""


def _escape(x) -> str:
    return html.escape("" if x is None else str(x))


def _table(headers, rows, numeric=()) -> str:
    h = "".join(f"<th>{_escape(x)}</th>" for x in headers)
    body = []
    for r in rows:
        cells = []
        for i, v in enumerate(r):
            if isinstance(v, tuple):           # (text, css class)
                cells.append(f'<td class="n {v[1]}">{_escape(v[0])}</td>')
            else:
                cells.append(f'<td class="n">{_escape(v)}</td>' if i in numeric else f"<td>{_escape(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{h}</tr>{''.join(body)}</table>"


FIGURE_COLUMNS = (("mean_accepted_depth", "mean accepted depth"), ("mean_commit_len", "mean commit len"),
                  ("accept_rate", "accept rate"), ("tokens_per_s", "tokens/s"))


def _pair(fig: dict | None):
    """(text, css class) of one figures-view row: derived, then the reported figure and the
    verdict of specaudit.audit.compare (computed once, in the view)."""
    if not fig or fig.get("derived") is None:
        return ("", "")
    der = cell(fig["derived"])
    if fig.get("reported") is None:
        return (f"{der} (nothing reported)", "")
    text = f"{der} / {cell(fig['reported'])}"
    return (text + (" ✓" if fig["verdict"] == "agrees" else " ✗"), "" if fig["verdict"] == "agrees" else "bad")


def _runs_section(runs: list[dict], figures: list[dict] | None = None) -> str:
    by_run: dict = {}
    for f in figures or ():
        by_run.setdefault(f["run_id"], {})[f["metric"]] = f
    rows = []
    for r in runs:
        figs = by_run.get(r["run_id"], {})
        rows.append([
            r["config"] or "", r["run_id"], f"{r['engine'] or ''} {r['engine_version'] or ''}".strip(),
            f"{r['target_model'] or ''} / {r['drafter_model'] or ''}",
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["started_at"])) if r["started_at"] else "",
            cell(r["steps"]), cell(r["requests"]),
            *[_pair(figs.get(k)) for k, _ in FIGURE_COLUMNS],
            "yes" if r["complete"] else "no",
        ])
    t = _table(["config", "run_id", "engine", "target / drafter", "started (UTC)", "steps", "requests",
                *[f"{label}: derived / reported" for _, label in FIGURE_COLUMNS], "complete"],
               rows, numeric={5, 6})
    problems = [f"{r['run_id']}: {r['problems']}" for r in runs if r.get("problems")]
    if problems:
        t += ('<p class="bad">Left out of this report (the checker reports them as SA000):</p><ul>'
              + "".join(f"<li>{_escape(p)}</li>" for p in problems) + "</ul>")
    return (t + '<p class="meta">derived = re-derived from the raw tensors (len(committed_tokens), '
            'len(accepted_path) - 1, the requests\' output tokens over the run\'s clock); reported = the '
            'engine\'s own figure from run.json, the thing under audit. A pair in <span class="bad">red</span> '
            'disagrees under specaudit\'s one comparison rule (a printed figure carries its printed '
            'precision; the view <code>figures</code> holds the same verdicts; the checker says which '
            'rule).</p>')


def _checker_section(findings_rows, summary, checked: bool) -> str:
    if not checked:
        return "<p>The checker was not run (no findings passed in): run <code>specaudit check PATH</code>.</p>"
    parts = []
    errors = sum(r["findings"] for r in findings_rows if r["severity"] == "error")
    verdict = ('<span class="ok">clean: no rule broken</span>' if errors == 0
               else f'<span class="bad">{errors:,} error finding(s)</span>')
    parts.append(f"<p>Verdict: {verdict}</p>")
    if summary:
        items = summary.items() if isinstance(summary, dict) else [("summary", summary)]
        parts.append(_table(["", ""], [[k, cell(v)] for k, v in items]))
    if findings_rows:
        parts.append(_table(["code", "name", "severity", "findings", "runs", "requests", "example"],
                            [[r["code"], r["name"], r["severity"], cell(r["findings"]), cell(r["runs"]),
                              cell(r["requests"]), r["example"]] for r in findings_rows[:40]],
                            numeric={3, 4, 5}))
    return "".join(parts)


RUNS_SQL = """
WITH s AS (SELECT run_id, sum(n) AS steps FROM rollup_request GROUP BY run_id),
q AS (SELECT run_id, sum(n) AS requests FROM rollup_outputs GROUP BY run_id)
SELECT r.run_id, r.config, r.engine, r.engine_version, r.target_model, r.drafter_model, r.problems,
       r.started_at, r.complete, s.steps, q.requests
FROM runs AS r LEFT JOIN s USING (run_id) LEFT JOIN q USING (run_id)
ORDER BY r.config, r.started_at, r.run_id
"""
FIGURES_SQL = "SELECT run_id, metric, derived, reported, verdict FROM figures ORDER BY run_id, i"


def build_report(paths, out_dir, findings=None, summary=None, *, threads: int | None = None,
                 title: str | None = None, ab: dict | None = None, rollups: bool = True,
                 extra: tuple[str, dict] | None = None) -> Path:
    """Write out_dir/report.html and one PNG per plot; return the report's path.

    paths: dataset folders / run folders / files (as `specaudit query`). findings: the
    checker's findings (Finding objects, dicts or an Arrow table; None = checker not run).
    summary: the checker's summary (CheckResult.summary(), a dict) shown on top.
    Raises InputError when paths hold no trace, ValueError when out_dir is a file.
    rollups=False: every figure from the raw rows (the files' rollups ignored).
    extra: (HTML, {stem: png}) of a section to add (engine outputs: engine_report).
    """
    from specaudit.postmortem.canned import canned
    from specaudit.postmortem.dataset import find_dataset
    from specaudit.postmortem.sql_guard import fetch_arrow
    from specaudit.postmortem.views import connect

    t0 = time.time()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    # DuckDB runs the queries on a thread of its own, releasing the GIL; meanwhile this
    # thread imports matplotlib (about half a second of Python) and draws each plot as soon
    # as its query is done, so queries and drawing overlap on two cores. Files are written
    # only once every query has succeeded (bad input leaves nothing behind).
    ds = find_dataset(paths, rollups=rollups)
    con = connect(paths, findings, threads=threads, dataset=ds)
    names = list(dict.fromkeys(p[2] for p in PLOTS)) + ["_runs", "_figures"]
    sqls = {q: canned(q).sql for q in names[:-2]} | {"_runs": RUNS_SQL, "_figures": FIGURES_SQL}
    data: dict = {}
    ready = {q: threading.Event() for q in names}
    failed: list = []

    def fetch():
        try:
            for q in names:
                data[q] = fetch_arrow(con, sqls[q]).to_pylist()
                ready[q].set()
        except BaseException as e:   # re-raised below, in the caller's thread
            failed.append(e)
            for ev in ready.values():
                ev.set()

    worker = threading.Thread(target=fetch, name="specaudit-report-queries", daemon=True)
    worker.start()

    def wait(q):
        ready[q].wait()
        if failed:
            raise failed[0]
        return data[q]

    checked = findings is not None
    try:
        _plt()
        makers = {
            "acceptance_by_depth": lambda: plot_acceptance_by_depth(wait("acceptance_by_depth")),
            "commit_length_histogram": lambda: plot_commit_hist(wait("commit_length_histogram")),
            "acceptance_vs_draft_confidence": lambda: plot_calibration(wait("acceptance_vs_draft_logprob")),
            "latency_breakdown": lambda: plot_latency(wait("latency_breakdown")),
            "commit_length_over_time": lambda: plot_over_time(wait("throughput_over_time")),
            "violations_by_code": lambda: plot_violations(wait("violations_by_code"), checked),
        }
        pngs = {stem: _png(makers[stem]()) for stem, *_ in PLOTS}
        runs, figure_rows = wait("_runs"), wait("_figures")
    finally:
        worker.join()
        con.close()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot create the folder: {e.strerror or e}") from None
    figures = []
    for stem, heading, _query, caption in PLOTS:
        png = pngs[stem]
        atomic_write_bytes(out / f"{stem}.png", png)
        b64 = base64.b64encode(png).decode("ascii")
        w, h = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # IHDR
        figures.append(
            f'<h2 id="h-{stem}">{_escape(heading)}</h2><figure>'
            f'<img id="{stem}" class="plot" alt="{_escape(heading)}" width="{w}" height="{h}" '
            f'src="data:image/png;base64,{b64}">'
            f"<figcaption>{_escape(caption)} Data: <code>specaudit query PATH {_escape(_query)}</code>; "
            f"image: <code>{stem}.png</code>.</figcaption></figure>")
    n_steps = sum(r["steps"] or 0 for r in runs)
    head = title or "specaudit post-mortem report"
    src = ", ".join(str(p) for p in paths)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_escape(head)}</title><style>{CSS}</style></head><body>
<h1>{_escape(head)}</h1>
<p class="meta">{_escape(src)} · {len(runs)} run(s), {n_steps:,} steps ·
generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} in {{build_s}} s</p>
<h2>Runs</h2>{_runs_section(runs, figure_rows)}
<h2>Checker</h2>{_checker_section(data['violations_by_code'], summary, checked)}
{''.join(figures)}
{ab_section(ab, out) if ab else ''}
{extra[0] if extra else ''}
</body></html>
"""
    page = page.replace("{build_s}", f"{time.time() - t0:.1f}")
    for stem, png in (extra[1] if extra else {}).items():
        atomic_write_bytes(out / f"{stem}.png", png)
    path = out / "report.html"
    atomic_write_bytes(path, page.encode("utf-8"))
    return path


# ------------------------------------------------------------------ A/B results

AB_LABEL = {"accept_len": "accept length", "accept_rate": "accept rate", "tokens_per_s": "tokens/s",
            "commit_len_tput": "commit length (throughput)", "accepted_depth": "mean accepted depth",
            "commit_len": "mean commit length"}


def _ab_groups(res: dict) -> tuple[list, list, dict]:
    """An A/B result (evidence `specaudit ab A B` or runtime ab.json) -> (metrics, group
    labels, {metric: {label: metric block}}). Evidence: one group per compared stratum,
    then matched and pooled; runtime: one group."""
    if res.get("kind") == "specaudit-ab-evidence":
        blocks = [(s["label"], s["metrics"]) for s in res.get("strata", [])]
        blocks += [("matched", res.get("matched") or {}), ("pooled", res.get("pooled") or {})]
    else:
        blocks = [("runs", res.get("metrics") or {})]
    metrics = [m for m in AB_LABEL if any(m in b for _, b in blocks)]
    data = {m: {lab: b[m] for lab, b in blocks if m in b} for m in metrics}
    return metrics, [lab for lab, _ in blocks], data


def plot_ab(res: dict):
    """A and B per group with their 95% intervals, one panel per metric; the verdict on top."""
    plt = _plt()
    metrics, labels, data = _ab_groups(res)
    n = max(len(metrics), 1)
    fig, axes = plt.subplots(1, n, figsize=(FIG_W, FIG_H), constrained_layout=True, squeeze=False)
    for ax, m in zip(axes[0], metrics):
        xs = [i for i, lab in enumerate(labels) if lab in data[m]]
        for off, side, color in ((-0.12, "a", "#1565c0"), (0.12, "b", "#ef6c00")):
            ys = [data[m][labels[i]][side]["mean"] for i in xs]
            lo = [y - data[m][labels[i]][side]["ci95"][0] for y, i in zip(ys, xs)]
            hi = [data[m][labels[i]][side]["ci95"][1] - y for y, i in zip(ys, xs)]
            ax.errorbar([x + off for x in xs], ys, yerr=[lo, hi], fmt="o", ms=4, capsize=3, color=color,
                        label=side.upper())
        for i in xs:
            top = max(data[m][labels[i]]["a"]["ci95"][1], data[m][labels[i]]["b"]["ci95"][1])
            ax.annotate(data[m][labels[i]]["verdict"], (i, top), textcoords="offset points", xytext=(0, 4),
                        ha="center", fontsize=7)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_title(AB_LABEL[m], fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.margins(x=0.15, y=0.15)
    if not metrics:
        _empty(axes[0][0], "no metric compared")
    else:
        axes[0][0].legend(fontsize=8)
    return fig


def ab_section(res: dict, out: Path) -> str:
    """The A/B part of a report: the plot (also out/ab.png), the conclusion and warnings."""
    png = _png(plot_ab(res))
    atomic_write_bytes(Path(out) / "ab.png", png)
    b64 = base64.b64encode(png).decode("ascii")
    notes = [p["message"] for p in res.get("paradox") or []] + list(res.get("warnings") or [])
    items = "".join(f'<li class="bad">{_escape(w)}</li>' for w in notes)
    concl = res.get("conclusion") or f"verdict ({res.get('primary', '')}): {res.get('verdict', '')}"
    one = res.get("one_sided") or []
    sided = ("<p>On one side only (never compared): " + "; ".join(
        f"{_escape(o['label'])} ({o['side']}, {o['windows']} windows)" for o in one) + "</p>") if one else ""
    metrics, labels, data = _ab_groups(res)

    def cell(v, sign=False):
        f = "+.4g" if sign else ".4g"
        return f"{v['mean']:{f}} [{v['ci95'][0]:{f}}, {v['ci95'][1]:{f}}]"
    rows = [[lab, AB_LABEL[m], cell(data[m][lab]["a"]), cell(data[m][lab]["b"]),
             cell(data[m][lab]["diff_b_minus_a"], True), data[m][lab]["verdict"]]
            for lab in labels for m in metrics if lab in data[m]]
    table = _table(["group", "metric", "A [95% CI]", "B [95% CI]", "B - A [95% CI]", "verdict"], rows)
    conf = [c for c in res.get("confounders") or [] if c.get("key") != "all matched keys"]
    if conf:
        def dist(d):
            return ", ".join(f"{v} {x:.0%}" for v, x in d.items())
        table += _table(["differs", "A", "B", "share of the pooled gap it explains"],
                        [[c["key"], dist(c["a"]), dist(c["b"]),
                          f"{c['explains']:.0%}" if c.get("explains") is not None else c.get("note", "")]
                         for c in conf])
    return (f'<h2 id="h-ab">A/B</h2>{"<ul>" + items + "</ul>" if items else ""}<p><b>{_escape(concl)}</b></p>{sided}'
            f'<figure><img id="ab" class="plot" alt="A/B" src="data:image/png;base64,{b64}">'
            "<figcaption>A (blue) and B (orange) with bootstrap 95% intervals per compared stratum, then the "
            "matched strata pooled and every window pooled (strata ignored); the verdict above each pair. "
            f"image: <code>ab.png</code>.</figcaption></figure>{table}")


def build_ab_report(res: dict, out_dir, *, title: str | None = None) -> Path:
    """A report page holding only an A/B result (no trace datasets given)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot create the folder: {e.strerror or e}") from None
    head = title or "specaudit A/B report"
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_escape(head)}</title>'
            f"<style>{CSS}</style></head><body><h1>{_escape(head)}</h1>"
            f'<p class="meta">generated {time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}</p>'
            f"{ab_section(res, out)}</body></html>\n")
    path = out / "report.html"
    atomic_write_bytes(path, page.encode("utf-8"))
    return path
