"""Extras by use: pyproject.toml's base dependencies and extras against what the code
imports (specaudit/commands/_extras.py), and the base commands run with every extra's
modules made unimportable (fast, in this interpreter; tests/test_ci_install.py does it for
real in a fresh venv)."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specaudit.commands._extras import EXTRA_MODULES, MODULE_EXTRA

try:
    import tomllib
except ModuleNotFoundError:   # 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
ENGINES = REPO / "tests" / "fixtures" / "engines"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
BASE_MODULES = {"numpy", "pyarrow", "duckdb", "prometheus_client", "tqdm", "tomli"}
# import name -> distribution name, where they differ
DIST = {"prometheus_client": "prometheus-client", "opentelemetry": "opentelemetry-sdk", "yaml": "pyyaml"}
# imported only by maintainers' tools, never by a command: dashboards/engines.py regenerates
# the committed alert and recording rule files with PyYAML
DEV_ONLY = {"yaml"}


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower()


def extra_dists(extra: str, seen=None) -> set[str]:
    """The distributions an extra brings, through its specaudit[...] references."""
    seen = seen if seen is not None else set()
    out = set()
    for req in PROJECT["optional-dependencies"][extra]:
        m = re.match(r"specaudit\[([^\]]+)\]", req)
        if m:
            for e in m.group(1).split(","):
                if e not in seen:
                    seen.add(e)
                    out |= extra_dists(e.strip(), seen)
        else:
            out.add(_name(req))
    return out


def third_party_imports() -> dict[str, set[str]]:
    """top-level module -> files importing it, over the package's source (every import, also in functions)."""
    out: dict[str, set[str]] = {}
    for d in ("specaudit", "invariants", "kernels", "dashboards"):
        for p in (REPO / d).rglob("*.py"):
            for n in ast.walk(ast.parse(p.read_text())):
                names = [a.name for a in n.names] if isinstance(n, ast.Import) else \
                    [n.module] if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module else []
                for m in names:
                    top = m.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "specaudit":
                        out.setdefault(top, set()).add(str(p.relative_to(REPO)))
    return out


def test_base_dependencies_are_what_reading_needs():
    assert {_name(r) for r in PROJECT["dependencies"]} == {DIST.get(m, m) for m in BASE_MODULES}


def test_every_imported_package_is_base_or_has_an_extra():
    """Each import is a base dependency, a module _extras.py names the extra of, or a
    distribution an extra brings under its own name (vllm: the plugin's engine)."""
    by_extras = set().union(*(extra_dists(e) for e in PROJECT["optional-dependencies"]))
    unknown = {m: sorted(f) for m, f in third_party_imports().items()
               if m not in BASE_MODULES and m not in MODULE_EXTRA and m not in DEV_ONLY and m not in by_extras}
    assert not unknown, f"imported, but neither a base dependency nor brought by an extra: {unknown}"


@pytest.mark.parametrize("module", sorted(MODULE_EXTRA))
def test_each_extra_installs_its_modules(module):
    extra = MODULE_EXTRA[module]
    assert DIST.get(module, module) in extra_dists(extra) or (module == "starlette" and "fastapi" in extra_dists(extra))


@pytest.mark.parametrize("extra", sorted(EXTRA_MODULES))
def test_a_command_extra_brings_what_is_checked_before_the_command(extra):
    dists = extra_dists(extra)
    assert {DIST.get(m, m) for m in EXTRA_MODULES[extra]} <= dists, (extra, dists)


# extras `all` leaves out: an inference engine the user brings (its own GPU build)
NOT_IN_ALL = {"all", "test", "vllm"}


def test_all_is_every_extra_and_the_test_command_installs_it():
    every = set(PROJECT["optional-dependencies"]) - NOT_IN_ALL
    assert extra_dists("all") == set().union(*(extra_dists(e) for e in every))
    assert 'pip install -q -e ".[all,test]"' in (REPO / "scripts" / "test.sh").read_text()


BLOCKER = textwrap.dedent("""
    import importlib.abc, sys
    BLOCK = set(sys.argv[1].split(","))
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCK:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Block())
    from specaudit.cli import main
    code = main(sys.argv[2:])
    sys.stderr.write("\\nLOADED " + ",".join(sorted({m.split(".")[0] for m in sys.modules} & BLOCK)))
    sys.exit(code)
""")
EXTRA_ONLY = sorted(set(MODULE_EXTRA) - BASE_MODULES)


def without_extras(*args, cwd=REPO, keep=()):
    """Run the CLI with every extra's modules unimportable, except those of the extras in `keep`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}   # this checkout's specaudit, from any working directory
    kept = {m for e in keep for m in EXTRA_MODULES.get(e, ())}
    r = subprocess.run([sys.executable, "-c", BLOCKER, ",".join(m for m in EXTRA_ONLY if m not in kept),
                        *map(str, args)],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    err, _, loaded = r.stderr.rpartition("\nLOADED ")
    return r.returncode, r.stdout, err, loaded.strip()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from specaudit.trace.synth import write_synthetic_dataset
    out = tmp_path_factory.mktemp("ds")
    write_synthetic_dataset(out, n_steps=400)
    return out


@pytest.mark.parametrize("argv, want", [
    (["check", "{ds}"], 0), (["check", ENGINES / "vllm_clean.log"], 0), (["check", ENGINES / "sglang_clean.prom"], 0),
    (["rules", "SA3"], 0), (["query", "{ds}", "acceptance_by_depth"], 0),
    (["estimate", ENGINES / "sglang_clean.log", "--baseline-tps", "1000", "--cost-factor", "1.5"], None),
    (["diff", "{ds}", "{ds}"], 0), (["dashboards", "--out", "{tmp}/dash"], 0),
    (["ab", ENGINES / "vllm_clean.log", ENGINES / "vllm_clean_k5.log"], None),
])
def test_base_commands_run_without_any_extra(argv, want, dataset, tmp_path):
    argv = [str(a).format(ds=dataset, tmp=tmp_path) for a in argv]
    code, out, err, loaded = without_extras(*argv)
    assert loaded == "", f"{argv[0]} imported {loaded}"
    assert "Traceback" not in err and "not installed" not in err and "internal error" not in err, err
    assert code == want if want is not None else code in (0, 1), (code, out[-500:], err)


@pytest.mark.parametrize("argv, extra", [
    (["run", "--num-prompts", "1"], "runtime"), (["demo"], "demo"), (["serve", "--trace-dir", "t"], "serve"),
    (["report", "x", "--out", "r"], "report"), (["lossless"], "runtime"), (["calibrate", "--out", "c.json"], "runtime"),
    (["check", "--engine", "spark", "x"], "spark"),
    (["ab", "--a=--algo chain", "--b=--algo tree", "--out", "ab"], "runtime"),
])
def test_missing_extra_names_it_in_one_line(argv, extra, tmp_path):
    code, out, err, _ = without_extras(*argv, cwd=tmp_path)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"pip install 'specaudit[{extra}]'" in err, err
    assert not any(tmp_path.iterdir()), "refused, yet it wrote files"


def test_an_unmapped_missing_module_is_still_an_internal_error(monkeypatch, capsys):
    """Only an extra's module gets the install hint: a module specaudit always needs, missing,
    is a broken install (exit 3, named), not a usage error."""
    from specaudit import cli
    from specaudit.commands import rules

    def boom(args):
        raise ModuleNotFoundError("No module named 'pyarrow.parquet'", name="pyarrow.parquet")
    monkeypatch.setattr(rules, "main", boom)
    assert cli.main(["rules"]) == 3
    assert "internal error" in capsys.readouterr().err


def test_check_help_lists_the_config_options():
    r = subprocess.run([sys.executable, "-m", "specaudit", "check", "--help"], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert r.returncode == 0 and "--config" in r.stdout and "--isolated" in r.stdout


def test_pool_workers_without_polars_give_the_same_report(tmp_path):
    """polars is the `fast` extra: without it check's tiny-run pool reads with Arrow, and the
    report (one run broken among clean tiny runs) is the one the polars workers give."""
    import json as _json

    import pyarrow.parquet as pq

    from specaudit.trace.synth import synth_run_rows
    ds = tmp_path / "ds"
    for i in range(8):
        s, r, m = synth_run_rows(1, run_id=f"t{i}", seed=i, max_new_tokens=8)
        if i == 5:
            m["reported"]["mean_commit_len"] = m["reported"]["mean_commit_len"] + 2
        d = ds / f"run_id=t{i}"
        d.mkdir(parents=True)
        pq.write_table(s, d / "steps-000000.parquet")
        pq.write_table(r, d / "requests.parquet")
        (d / "run.json").write_text(_json.dumps(m))
    code = textwrap.dedent(f"""
        import importlib.abc, json, sys
        if sys.argv[1] == "blocked":
            class Block(importlib.abc.MetaPathFinder):
                def find_spec(self, name, path=None, target=None):
                    if name.split(".")[0] == "polars":
                        raise ModuleNotFoundError("No module named 'polars'", name="polars")
            sys.meta_path.insert(0, Block())
        from specaudit.audit.check import check_paths, pool
        pool.POOL_RUNS = 3                                 # several tasks: worker processes start
        r = check_paths([{str(ds)!r}], workers=2)
        ex = pool._start_workers(1, [], 0, 10)
        def worker_flag():
            return pool._WORKER.get("polars")
        flag = ex.submit(worker_flag).result()
        ex.shutdown()
        print(json.dumps([flag, [f.to_dict() for f in r.findings], dict(r.counts), r.exit_code, len(r.runs)]))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    got = {}
    for mode in ("blocked", "with"):
        out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=300)
        assert out.returncode == 0, out.stderr
        got[mode] = __import__("json").loads(out.stdout)
    assert got["blocked"][0] is False and got["with"][0] is True   # Arrow without polars, polars with it
    assert got["blocked"][1:] == got["with"][1:]
    assert got["with"][2] == {"SA507": 1} and got["with"][3] == 1 and got["with"][4] == 8


def test_report_needs_only_its_extra(dataset, tmp_path):
    """`report` with the report extra alone (matplotlib; no torch, no scipy)."""
    code, out, err, loaded = without_extras("report", dataset, "--out", tmp_path / "rep", keep=("report",))
    assert code == 0 and "Traceback" not in err, (out, err)
    assert loaded == "" and (tmp_path / "rep" / "report.html").is_file()
