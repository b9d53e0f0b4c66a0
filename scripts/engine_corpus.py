"""The corpus of real engine output, audited: one row per engine and format.

    python scripts/engine_corpus.py            # print the Markdown table (docs/reading-engines.md) and a JSON line
    python scripts/engine_corpus.py --render   # rewrite tests/fixtures/engines/corpus/rendered/ first
    python scripts/engine_corpus.py --write    # and rewrite the table in every file that holds its
                                               # markers (docs/reading-engines.md, any docs/*.md, README.md)

Every case of tests/fixtures/engines/corpus/*.json is rendered back to the engine's text
and audited with specaudit.audit.sources.audit_file. A case is
    caught       when it expects findings (a bug, a convention, a collapse, an input
                 error) and exactly its expected errors fire with its expected warnings;
    a false alarm when it is clean and any finding fires, or when an unexpected error fires.
Real cases are excerpts of engine output; mutated ones (a real excerpt changed to break
one identity, the rules' fail fixtures) are counted apart, and so are transpositions (real
figures rendered in a format no public excerpt shows, said so in their `mutation` text):
those count as handled when they stay clean.

Formats searched for and not found in public material (so not in the corpus as excerpts):
    llama.cpp /metrics spec_decode_* scrapes (PR 26389, Aug 2026): the series names are
        verified in tools/server (server-task.cpp to_metrics) but no real scrape with values
        was found (llama.cpp PRs 26389, 23328, 25327, 24850, issue 26516; public code for
        llamacpp:spec_decode_num_drafts_total: only mocks and a hand-written fixture whose
        position-0 count exceeds its verify steps); one transposition stands in for it.
    vLLM SpecDecoding lines with an `Engine 00N:` prefix on the SpecDecoding line itself:
        vLLM prints the prefix on the engine stats line only, the SpecDecoding line follows
        it (PR 24049's data-parallel log); the reader pairs them.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "engines" / "corpus"
BEGIN = "<!-- engine-corpus-table:begin -->"
END = "<!-- engine-corpus-table:end -->"
NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "llamacpp": "llama.cpp",
         "fastdeploy": "FastDeploy", "mlxvlm": "mlx-vlm"}


def _render():
    sys.path.insert(0, str(CORPUS))
    import render
    return render


def verdict(case, path) -> tuple[bool, bool, list]:
    """(caught, false_alarm, codes) of one rendered case."""
    from specaudit.audit.sources import audit_file
    from specaudit.trace.safe_io import InputError
    exp = case["expect"]
    try:
        fs = audit_file(path)
    except InputError as e:
        want = exp.get("input_error")
        return bool(want and want in e.reason), not want, ["input-error"]
    errs = {f.code for f in fs if f.severity == "error"}
    warns = {f.code for f in fs if f.severity == "warning"}
    codes = sorted(errs | warns)
    expected = bool(exp["errors"] or exp["warnings"] or exp.get("input_error"))
    if not expected:
        return False, bool(fs), codes
    caught = errs == set(exp["errors"]) and set(exp["warnings"]) <= warns and "input_error" not in exp
    false_alarm = bool(errs - set(exp["errors"]))
    return caught, false_alarm, codes


def table(render=None) -> tuple[str, dict]:
    render = render or _render()
    rows: dict = defaultdict(lambda: {"real": 0, "clean": 0, "flagged": 0, "caught": 0, "false": 0, "mutated": 0,
                                      "mut_caught": 0})
    for case in render.load_cases():
        path = render.RENDERED / render.filename(case)
        caught, false_alarm, _ = verdict(case, path)
        r = rows[(case["engine"], case["format"])]
        exp = case["expect"]
        flagged = bool(exp["errors"] or exp["warnings"] or exp.get("input_error"))
        if "mutation" in case:
            r["mutated"] += 1
            r["mut_caught"] += int(caught if flagged else not false_alarm)
        else:
            r["real"] += 1
            r["clean"] += int(not flagged)
            r["flagged"] += int(flagged)
            r["caught"] += int(caught)
        r["false"] += int(false_alarm)
    lines = ["| engine | format | real excerpts | clean | with a finding expected | caught | false alarms "
             "| mutated (handled) |", "|---|---|---|---|---|---|---|---|"]
    tot = defaultdict(int)
    for (eng, fmt), r in sorted(rows.items(), key=lambda kv: (list(NAMES).index(kv[0][0]), kv[0][1])):
        lines.append(f"| {NAMES[eng]} | {fmt} | {r['real']} | {r['clean']} | {r['flagged']} | {r['caught']} | "
                     f"{r['false']} | {r['mutated']} ({r['mut_caught']}) |")
        for k, v in r.items():
            tot[k] += v
    lines.append(f"| **all** | | **{tot['real']}** | {tot['clean']} | {tot['flagged']} | {tot['caught']} | "
                 f"**{tot['false']}** | {tot['mutated']} ({tot['mut_caught']}) |")
    return "\n".join(lines) + "\n", dict(tot)


def table_files() -> list[Path]:
    """The Markdown files that hold the table between BEGIN and END: README.md and any
    docs/*.md page (the README's content moves into docs/; the table goes with it)."""
    out = []
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        try:
            text = p.read_text()
        except OSError:
            continue
        if BEGIN in text and END in text:
            out.append(p)
    return out


def readme_table(readme: Path | None = None) -> str | None:
    """The table as one file holds it (default: the first of table_files()), or None."""
    if readme is None:
        files = table_files()
        if not files:
            return None
        readme = files[0]
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def docs_table(page: Path = ROOT / "docs" / "reading-engines.md") -> str | None:
    """The table as docs/reading-engines.md holds it (the site's page for it), or None."""
    return readme_table(page) if page.exists() else None


def write_tables(md: str) -> list[Path]:
    """Rewrite the table between the markers in every file that holds it; -> files changed."""
    changed = []
    for p in table_files():
        text = p.read_text()
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        new = f"{head}{BEGIN}\n{md}{END}{tail}"
        if new != text:
            p.write_text(new)
            changed.append(p)
    return changed


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    render = _render()
    if "--render" in argv:
        render.render_all()
    md, tot = table(render)
    if "--write" in argv:
        for p in write_tables(md):
            print(f"wrote the table into {p.relative_to(ROOT)}", file=sys.stderr)
    sys.stdout.write(md)
    print(json.dumps({"real_cases": tot["real"], "caught": tot["caught"], "flagged": tot["flagged"],
                      "false_alarms": tot["false"], "mutated": tot["mutated"], "mutated_caught": tot["mut_caught"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
