"""The corpus of real engine output: every excerpt audited, zero false alarms, every
broken one caught with its code; the rendered fixtures and the docs' table (docs/reading-engines.md) are current."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from specaudit.audit.sources import audit_file, detect
from specaudit.trace.safe_io import InputError

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "engines" / "corpus"
sys.path.insert(0, str(CORPUS))
sys.path.insert(0, str(ROOT / "scripts"))
import engine_corpus  # noqa: E402  (after the sys.path / importorskip set-up above)
import render  # noqa: E402  (after the sys.path / importorskip set-up above)

CASES = render.load_cases()
IDS = [c["id"] for c in CASES]
FORMAT_SOURCE = {"log": None, "prom": "prom-text", "json": "json-records"}
LOG_FORMAT_SOURCE = {"vllm-spec-decode-example": "vllm-bench"}   # text formats read by another reader


def test_ids_unique_and_facts_complete():
    assert len(IDS) == len(set(IDS))
    for c in CASES:
        for key in ("id", "engine", "format", "version", "date", "url", "expect", "reason", "facts"):
            assert c.get(key) not in (None, ""), (c["id"], key)
        assert re.match(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull|blob)/", c["url"]), c["id"]
        assert set(c["expect"]) <= {"errors", "warnings", "input_error"}
        assert c["engine"] in render.ENGINES


def _source(url: str) -> str:
    """A case's source: repository + issue or PR number, or repository + file path."""
    m = re.match(r"https://github\.com/([\w.-]+/[\w.-]+)/(issues|pull)/(\d+)", url)
    if m:
        return f"{m.group(1)}#{m.group(3)}"
    m = re.match(r"https://github\.com/([\w.-]+/[\w.-]+)/blob/[^/]+/(.+)$", url)
    assert m, url
    return f"{m.group(1)}:{m.group(2)}"


def test_variety_is_counted_by_distinct_sources():
    """Issue 31: at least 40 distinct sources (repository + issue or PR, or a repository's
    file) over at least five engines, and no source carries more than 3 cases (real and
    mutated together), so variety cannot be inflated by slicing one excerpt."""
    by_source: dict = {}
    for c in CASES:
        by_source.setdefault(_source(c["url"]), []).append(c["id"])
    crowded = {s: ids for s, ids in by_source.items() if len(ids) > 3}
    assert not crowded, crowded
    assert len(by_source) >= 40, len(by_source)
    engines = {c["engine"] for c in CASES}
    assert len(engines) >= 5, engines
    assert _source("https://github.com/vllm-project/vllm/pull/26498") == "vllm-project/vllm#26498"
    assert _source("https://github.com/vllm-project/vllm/issues/26498") == "vllm-project/vllm#26498"


def test_at_least_ten_real_excerpts_per_engine():
    for eng in ("vllm", "sglang", "trtllm", "llamacpp"):   # the four with a log reader each
        real = [c for c in CASES if c["engine"] == eng and "mutation" not in c]
        assert len(real) >= 10, (eng, len(real))


def test_rendered_fixtures_are_current():
    want = render.render_all(dest=None)
    for name, text in want.items():
        assert (render.RENDERED / name).read_text() == text, f"{name} is stale: python {CORPUS / 'render.py'}"
    assert {p.name for p in render.RENDERED.iterdir()} == set(want)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_case_verdict(case):
    """Clean excerpts: no finding at all. Broken ones: exactly the expected errors, and the
    expected warnings among those raised. Unusable ones: one clear line."""
    path = render.RENDERED / render.filename(case)
    exp = case["expect"]
    if "input_error" in exp:
        with pytest.raises(InputError) as ei:
            audit_file(path)
        assert exp["input_error"] in ei.value.reason and "\n" not in str(ei.value)
        return
    fs = audit_file(path)
    errs = {f.code for f in fs if f.severity == "error"}
    warns = {f.code for f in fs if f.severity == "warning"}
    assert errs == set(exp["errors"]), [f.message for f in fs]
    assert set(exp["warnings"]) <= warns, [f.message for f in fs]
    if not exp["errors"] and not exp["warnings"]:
        assert fs == [], [f.message for f in fs]
    for f in fs:  # every finding names the file, a line, the engine and its version (or says none)
        assert f.file == str(path) and f.line and f.line >= 1
        assert f.values.get("engine") and f.values.get("version")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_detected_as_its_source(case):
    path = render.RENDERED / render.filename(case)
    kind = render.filename(case).rsplit(".", 1)[1]
    want = LOG_FORMAT_SOURCE.get(case["format"]) or FORMAT_SOURCE[kind] or f"{case['engine']}-log"
    assert detect(path) == want


def test_convention_is_named_in_the_finding():
    f = [x for x in audit_file(render.RENDERED / "sglang-fastrl-pr4-spec-off-bs48.log") if x.code == "SA720"][0]
    assert "counts the bonus token" in f.message and "1.00" in f.message and "0.11" in f.message
    assert "PR 11572" in f.values["version"]
    assert "bonus" in f.values["conventions"]["accept_rate"]


def test_docs_table_matches_the_corpus():
    md, tot = engine_corpus.table(render)
    assert tot["false"] == 0 and tot["caught"] == tot["flagged"] and tot["mut_caught"] == tot["mutated"]
    assert engine_corpus.docs_table() == md, "docs/reading-engines.md table is stale: scripts/engine_corpus.py --write"
    for f in engine_corpus.table_files():   # any other page (or README.md) holding the markers
        assert engine_corpus.readme_table(f) == md, f"{f.name}: table stale: python scripts/engine_corpus.py --write"
