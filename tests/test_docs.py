"""The docs site: it builds with `mkdocs build --strict` (a broken link, a missing anchor or
a page outside the nav fails), its generated pages (rules/, benchmarks.md) are current, and
every measured figure comes from a benchmark's JSON (docs/benchmarks/*.json), never typed."""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import render_docs  # noqa: E402  (scripts/ on the path first)


def _build(root: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})


def test_site_builds_strict(tmp_path):
    r = _build(REPO, tmp_path / "site")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "rules" / "SA301" / "index.html").exists()
    assert (tmp_path / "site" / "benchmarks" / "index.html").exists()


@pytest.fixture
def site_copy(tmp_path):
    """mkdocs.yml, docs/ and the hook in a scratch folder, to break on purpose."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    shutil.copy(REPO / "scripts" / "mkdocs_hooks.py", root / "scripts" / "mkdocs_hooks.py")
    shutil.copytree(REPO / "docs", root / "docs")
    return root


def test_broken_link_fails_the_build(site_copy, tmp_path):
    page = site_copy / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    r = _build(site_copy, tmp_path / "site")
    assert r.returncode != 0 and "no-such-page.md" in r.stdout + r.stderr, r.stdout + r.stderr


def test_page_outside_the_nav_fails_the_build(site_copy, tmp_path):
    (site_copy / "docs" / "orphan.md").write_text("# Orphan\n\nNo nav entry.\n")
    r = _build(site_copy, tmp_path / "site")
    assert r.returncode != 0 and "orphan.md" in r.stdout + r.stderr, r.stdout + r.stderr


def test_missing_anchor_fails_the_build(site_copy, tmp_path):
    page = site_copy / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[gone](benchmarks.md#no-such-benchmark)\n")
    r = _build(site_copy, tmp_path / "site")
    assert r.returncode != 0 and "no-such-benchmark" in r.stdout + r.stderr, r.stdout + r.stderr


def test_generated_pages_are_current():
    stale = render_docs.stale(render_docs.render_all())
    assert stale == [], f"stale: {stale}; run python3 scripts/render_docs.py"


def test_every_rule_has_its_page_with_what_why_example_and_fixtures():
    from specaudit.invariants.registry import builtin_codes
    pages = {p.stem for p in (REPO / "docs" / "rules").glob("SA*.md")}
    assert pages == builtin_codes()
    for code in ("SA301", "SA702", "SA804"):
        text = (REPO / "docs" / "rules" / f"{code}.md").read_text()
        for head in ("## What", "## Why", "## Example", "## Message", "## Fixtures"):
            assert head in text, (code, head)
    assert "def fail(self, run)" in (REPO / "docs" / "rules" / "SA301.md").read_text()
    assert "vllm_accepted_over_drafted.prom" in (REPO / "docs" / "rules" / "SA702.md").read_text()


# ------------------------------------------------------------------ benchmarks

def _flat_values(x) -> list:
    """Every value of a JSON tree, and every key (a label such as chain-b7-k1 holds numbers)."""
    if isinstance(x, dict):
        return [*x, *(v for y in x.values() for v in _flat_values(y))]
    if isinstance(x, list):
        return [v for y in x for v in _flat_values(y)]
    return [x]


def test_every_figure_on_the_benchmarks_page_is_in_a_json():
    """Each value cell of the page is a value its benchmark's JSON holds (nothing typed in)."""
    page = (REPO / "docs" / "benchmarks.md").read_text()
    docs = {p.stem: json.loads(p.read_text()) for p in (REPO / "docs" / "benchmarks").glob("*.json")}
    sections = re.split(r"^## ", page, flags=re.M)[1:]
    checked = 0
    for sec in sections:
        anchor = re.search(r"\{#([\w-]+)\}", sec).group(1).replace("-", "_")
        rows = re.findall(r"^\| .*? \(`(\w+)`\) \| (.*) \|$", sec, flags=re.M)
        if not rows:
            assert "Not recorded yet" in sec, sec[:200]
            continue
        figs = docs[anchor]["figures"]
        for key, cell in rows:
            assert cell == render_docs._fmt(figs[key]), (anchor, key, cell)
            for num in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", cell):
                assert any(str(v) == num or (isinstance(v, str) and num in v)      # a label: tree-b15-k4
                           or (isinstance(v, (int, float)) and not isinstance(v, bool) and float(num) == v)
                           for v in _flat_values(figs[key])), (anchor, key, num)
            checked += 1
    assert checked > 0 or not docs


def _sample_doc() -> dict:
    keys = dict((k, 1.0) for k, _ in render_docs.BENCHMARKS[0][4])
    return {"benchmark": "runtime", "command": "python3 scripts/bench_runtime.py", "commit": "0" * 40,
            "dirty": False, "date": "2026-12-02T00:00:00Z",
            "machine": {"cores": 2, "load_avg_1m": 0.5, "machine_quiet": True, "cpu": "x"}, "figures": keys}


@pytest.mark.parametrize("drop", ["figures.trace_overhead", "machine.load_avg_1m", "commit", "figures"])
def test_a_benchmark_json_missing_a_key_fails_with_the_key_name(tmp_path, drop):
    name, title, script, what, keys = render_docs.BENCHMARKS[0]
    doc = copy.deepcopy(_sample_doc())
    render_docs.render_benchmark(name, doc, title, script, what, keys)       # complete: renders
    head, _, leaf = drop.rpartition(".")
    (doc[head] if head else doc).pop(leaf)
    (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    with pytest.raises(render_docs.BenchmarkError, match=re.escape(f"docs/benchmarks/{name}.json: missing key "
                                                                   f"'{drop}'")):
        render_docs.render_benchmarks(tmp_path)


def test_render_docs_check_passes_on_the_repository():
    """The command the docs name, once: the repository's own JSON files are complete and
    every generated page is current (exit 0)."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "render_docs.py"), "--check"], capture_output=True,
                       text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr


def test_withheld_figures_say_so():
    name, title, script, what, keys = render_docs.BENCHMARKS[0]
    doc = _sample_doc()
    doc["figures"]["trace_overhead"] = None
    doc["figures"]["withheld"] = "trace_overhead: load average 3 above 1.5 while measuring; rerun on a quiet machine"
    text = render_docs.render_benchmark(name, doc, title, script, what, keys)
    assert "| trace overhead (pooled) (`trace_overhead`) | withheld |" in text and "Withheld: trace_overhead" in text


# A figure someone measured: a rate, a latency or a speed-up ratio written as a number.
MEASURED = re.compile(r"\b\d[\d,]*(?:\.\d+)?\s?(?:tokens/s|steps/s|rows/s|windows/s|MiB/s|MB/s|ms|us)\b"
                      r"|\b\d+\.\d+x\b")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (program output there is an example, not a figure)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _computed() -> set[str]:
    """Figures of the prose that are arithmetic, not measurements: computed here."""
    tps, base, r = 109.0, 98.0, 1.5          # the worked example of docs/commands/estimate.md (its inputs)
    return {f"{tps / base:.2f}x",            # a chain step that runs this much faster than plain decoding
            f"{8 / r * base:.0f} tokens/s",  # the throughput a commit length of 8 would need
            f"{tps:.0f} tokens/s", f"{base:.0f} tokens/s",  # the seed's own inputs (docs/estimate.md)
            "20 us"}                          # the fused audit's target (docs/kernels.md), not a measurement


def test_no_measured_figure_typed_into_prose():
    """Outside docs/benchmarks.md, a measured figure in prose must be one a benchmark JSON holds
    or one a test computes."""
    known = {str(v) for p in (REPO / "docs" / "benchmarks").glob("*.json")
             for v in _flat_values(json.loads(p.read_text())["figures"])}
    computed = _computed()
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    bad = []
    for page in pages:
        rel = page.relative_to(REPO)
        if rel.as_posix() in ("docs/benchmarks.md",) or rel.parts[:2] == ("docs", "rules"):
            continue
        for m in MEASURED.finditer(_prose(page.read_text())):
            num = re.match(r"[\d,.]+", m.group(0)).group(0).replace(",", "").rstrip(".")
            if num not in known and m.group(0) not in computed:
                bad.append(f"{rel}: {m.group(0)!r}")
    assert bad == [], "measured figures typed into the docs (put them in a benchmark's JSON):\n" + "\n".join(bad)


def test_the_lint_catches_a_typed_figure():
    assert MEASURED.search(_prose("the chain ran at 987.6 tokens/s, 2.72x plain greedy"))
    assert not MEASURED.search(_prose("```\n987.6 tokens/s\n```\nthe chain, 4 x cores"))
