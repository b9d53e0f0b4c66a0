"""The import rules of docs/architecture.md's data-flow paragraph, enforced on the source.

Data flows one way: model -> runtime -> tracer -> sinks. Sinks never import readers;
readers never import the runtime or each other (they share the contract and the few
modules listed in SHARED); nothing imports the command layer; no import circles.
Read statically (ast), so every import counts, also the ones inside functions.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Modules every layer may use: the package root, the models, the tokenizer, the output guard,
# number formatting, the shared statistics and the busy-machine rule.
GROUND = ("specaudit", "specaudit.model", "specaudit.tokenizer", "specaudit.outfile", "specaudit.numfmt",
          "specaudit.stats", "specaudit.machine_load")
# What readers share: the contract, the finding type, the one comparison, the output
# formats and the rule catalog. Importing these is not "a reader importing a reader".
# trace.safe_io: the one bad-input error and the bounded reads and atomic writes.
# trace.rollup: the one definition of a rollup's rows, run by the writers and by the views.
SHARED = ("specaudit.trace.schema", "specaudit.trace.safe_io", "specaudit.trace.rollup", "specaudit.audit.findings",
          "specaudit.audit.compare",
          "specaudit.audit.formats", "specaudit.invariants")
# Each reader, by module prefix. A reader may import its own modules, SHARED and GROUND.
READERS = {
    "check": ("specaudit.audit.check", "specaudit.audit.reference", "specaudit.audit.spark",
              "specaudit.audit.spark_plan", "specaudit.audit.spark_tasks", "specaudit.audit.spark_session",
              "specaudit.audit.spark_runs"),
    "estimate": ("specaudit.audit.estimate", "specaudit.audit.estimate_model", "specaudit.audit.estimate_judge",
                 "specaudit.audit.cost_profile", "specaudit.audit.observed_throughput"),
    "diff": ("specaudit.audit.diff", "specaudit.audit.diff_sides"),
    "sources": ("specaudit.audit.sources",),
    "ab-evidence": ("specaudit.audit.ab_evidence",),
    "client-vs-trace": ("specaudit.audit.client_vs_trace",),
    "postmortem": ("specaudit.postmortem",),
}
# Reader-to-reader edges that are composition by design, each with its reason.
ALLOWED_READER_EDGES = {
    ("estimate", "sources"): "the estimator takes throughput and reported figures from engine logs",
    ("ab-evidence", "sources"): "A/B from evidence reads both sides' engine logs",
    ("ab-evidence", "estimate"): "throughput-derived commit length per stratum",
    ("client-vs-trace", "sources"): "a client's export (AIPerf) is read like any engine output",
    ("postmortem", "sources"): "query and report read engine outputs into the windows and findings views "
                               "through the sources' public API (iter_readings, audit_file)",
}
RUNTIME = ("specaudit.runtime", "specaudit.traced_run", "specaudit.traced_ab", "specaudit.integrations")
TRACE_SINKS = ("specaudit.trace",)
COMMAND_LAYER = ("specaudit.cli", "specaudit.commands", "specaudit.__main__")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] in ("invariants", "kernels", "dashboards"):
        parts = ["specaudit", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    """module -> the specaudit modules it imports (at module level or inside functions)."""
    files = [p for d in ("specaudit", "invariants", "kernels", "dashboards") for p in (REPO / d).rglob("*.py")
             if "__pycache__" not in p.parts]
    mods = {_module_name(p): p for p in files}
    g: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    g[m].add(t)
    return g


def _under(mod: str, prefixes) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def _reader(mod: str) -> str | None:
    for name, prefixes in READERS.items():
        if _under(mod, prefixes):
            return name
    return None


def test_no_relative_imports_and_graph_is_readable():
    g = _graph()
    assert "specaudit.audit.check" in g and "specaudit.invariants.registry" in g and len(g) > 60


def test_sinks_and_contract_never_import_readers_runtime_or_commands():
    bad = [(m, t) for m, ts in _graph().items() if _under(m, TRACE_SINKS) for t in ts
           if not (_under(t, TRACE_SINKS) or t in GROUND)]
    assert not bad, f"the trace layer imports upward: {bad}"


def test_runtime_never_imports_readers_serving_or_commands():
    bad = [(m, t) for m, ts in _graph().items() if _under(m, RUNTIME) for t in ts
           if _under(t, ("specaudit.audit", "specaudit.postmortem", "specaudit.serve", *COMMAND_LAYER))]
    assert not bad, f"the runtime imports a reader, the server or the CLI: {bad}"


def test_readers_never_import_the_runtime_or_each_other():
    bad = []
    for m, ts in _graph().items():
        r = _reader(m)
        if r is None:
            continue
        for t in ts:
            rt = _reader(t)
            if _under(t, RUNTIME) or _under(t, ("specaudit.serve", *COMMAND_LAYER)):
                bad.append((m, t, "runtime/server/CLI"))
            elif rt is not None and rt != r and (r, rt) not in ALLOWED_READER_EDGES and not _under(t, SHARED):
                bad.append((m, t, f"reader {r} -> reader {rt}"))
    assert not bad, "\n".join(map(str, bad))


def test_nothing_but_the_cli_imports_the_command_layer():
    bad = [(m, t) for m, ts in _graph().items() if not _under(m, COMMAND_LAYER) for t in ts
           if _under(t, COMMAND_LAYER)]
    assert not bad, f"library code imports the command layer: {bad}"


def test_no_import_circles_between_packages():
    """Tarjan's strongly connected components over the module graph, one node per package
    (a package's own modules may refer to each other; two packages may not)."""
    g = _graph()

    def unit(m: str) -> str:
        parts = m.split(".")
        return ".".join(parts[:3]) if len(parts) > 2 else m

    ug: dict[str, set[str]] = {}
    for m, ts in g.items():
        ug.setdefault(unit(m), set()).update(unit(t) for t in ts if unit(t) != unit(m))
    index, low, stack, on, comps = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in ug.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(comp)

    for v in list(ug):
        if v not in index:
            strong(v)
    circles = [sorted(c) for c in comps if len(c) > 1]
    assert not circles, f"import circles: {circles}"


def test_model_is_the_ground_floor():
    assert not (_graph()["specaudit.model"] - {"specaudit"}), "model.py imports the rest of specaudit"


def test_numfmt_and_stats_import_nothing_of_specaudit():
    g = _graph()
    for m in ("specaudit.numfmt", "specaudit.stats", "specaudit.machine_load"):
        assert not (g[m] - {"specaudit"}), f"{m} is ground floor and imports {g[m]}"


def test_number_formatting_has_one_home():
    """No module but specaudit/numfmt.py defines a number-formatting helper of its own."""
    import re
    pat = re.compile(r"^def _?fmt\w*\(", re.M)   # (the readers' _num helpers parse, not print)
    owners = [str(p.relative_to(REPO)) for d in ("specaudit", "invariants") for p in (REPO / d).rglob("*.py")
              if "__pycache__" not in p.parts and pat.search(p.read_text(encoding="utf-8"))]
    assert not owners, owners


# Module size: one idea per file keeps files short. A module over MAX_MODULE_LINES lines says
# why at its top: a line of its module docstring reading `Over 600 lines because: <reason>`
# (the reason may go on over the next lines). docs/architecture.md states the bound.
MAX_MODULE_LINES = 600
SIZE_REASON = "Over 600 lines because:"


def _size_problem(text: str) -> str | None:
    """None when a module's source keeps the bound (short, or long with its reason at the
    top); else what is wrong, with its line count."""
    n = len(text.splitlines())
    if n <= MAX_MODULE_LINES:
        return None
    try:
        doc = ast.get_docstring(ast.parse(text), clean=True) or ""
    except SyntaxError:
        doc = ""
    for line in doc.splitlines():
        if line.startswith(SIZE_REASON) and len(line[len(SIZE_REASON):].strip()) >= 20:
            return None
    return f"{n} lines, no `{SIZE_REASON} ...` line in its module docstring"


def test_size_problem_reads_the_marker():
    long = "x = 1\n" * MAX_MODULE_LINES
    assert _size_problem('"""Short."""\n' + long[: 6 * 10]) is None
    no_reason = _size_problem('"""A long one."""\n' + long)
    assert no_reason == f"{MAX_MODULE_LINES + 1} lines, no `{SIZE_REASON} ...` line in its module docstring"
    with_reason = f'"""A long one.\n\n{SIZE_REASON} the contract is one table, kept whole.\n"""\n' + long
    assert _size_problem(with_reason) is None
    assert _size_problem(f'"""A long one.\n\n{SIZE_REASON} \n"""\n' + long) is not None     # no reason given
    assert _size_problem(f'# {SIZE_REASON} a comment is not the docstring\n' + long) is not None


def test_every_module_over_the_bound_says_why_at_its_top():
    problems = []
    for d in ("specaudit", "invariants", "kernels"):
        for p in sorted((REPO / d).rglob("*.py")):
            if "__pycache__" in p.parts:
                continue
            why = _size_problem(p.read_text(encoding="utf-8"))
            if why:
                problems.append(f"{p.relative_to(REPO)}: {why}")
    assert not problems, "modules over the bound without a reason at their top:\n" + "\n".join(problems)
