"""specaudit where CI lives: the base install in a fresh venv (no torch), the GitHub Action
(action.yml's steps run as a script) and the pre-commit hook (.pre-commit-hooks.yaml, run
by pre-commit in a temporary repository on a broken trace).

The base dependencies are downloaded once into $SPECAUDIT_CACHE/wheels (scripts/base_install.py)
and installed offline from there: the first run needs the package registry, later ones do not.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ENGINES = REPO / "tests" / "fixtures" / "engines"
sys.path.insert(0, str(REPO / "scripts"))
import base_install  # noqa: E402  (scripts/ on the path first)

pytestmark = pytest.mark.slow
GIT = ["git", "-c", "user.name=specaudit-test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false",
       "-c", "init.defaultBranch=main"]


@pytest.fixture(scope="module")
def house():
    return base_install.wheelhouse()


@pytest.fixture(scope="module")
def venv(tmp_path_factory, house):
    """A fresh venv with the base install: specaudit's wheel and pyproject's base dependencies."""
    tmp = tmp_path_factory.mktemp("base")
    return base_install.make_venv(tmp / "venv", base_install.build_wheel(tmp / "wheel"), house)


def offline_env(house: Path, **extra) -> dict:
    """An environment whose pip installs only from the wheelhouse (the machine's pip.conf left out)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(house),
               PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """(a clean trace dataset, the same with run.json's reported mean_commit_len wrong: SA507)."""
    from specaudit.trace.synth import write_synthetic_dataset
    tmp = tmp_path_factory.mktemp("traces")
    clean = tmp / "clean"
    run = write_synthetic_dataset(clean, n_steps=600)
    broken = tmp / "broken"
    shutil.copytree(clean, broken)
    manifest = broken / run.name / "run.json"
    d = json.loads(manifest.read_text())
    d["reported"]["mean_commit_len"] = round(d["reported"]["mean_commit_len"] + 1.5, 3)
    manifest.write_text(json.dumps(d))
    return clean, broken


def sa(venv: Path, *args, cwd):
    """The venv's console script, with nothing of this interpreter's environment."""
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([str(venv / "bin" / "specaudit"), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


# ------------------------------------------------------------------ the base install


def test_base_install_has_no_extra_packages(venv):
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    r = subprocess.run([str(base_install.venv_python(venv)), "-c", probe, *base_install.HEAVY],
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", f"the base install brings an extra's packages: {r.stdout}"


def test_base_install_checks_queries_and_lists(venv, datasets, tmp_path):
    clean, broken = datasets
    r = sa(venv, "check", clean, cwd=tmp_path)
    assert r.returncode == 0 and "No violations" in r.stdout, r.stdout + r.stderr
    r = sa(venv, "check", broken, "--output-format", "json", cwd=tmp_path)
    assert r.returncode == 1 and json.loads(r.stdout)["counts"] == {"SA507": 1}, r.stdout + r.stderr
    r = sa(venv, "check", ENGINES / "vllm_clean.log", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = sa(venv, "check", ENGINES / "vllm_rate_above_one.log", cwd=tmp_path)
    assert r.returncode == 1 and "SA7" in r.stdout, r.stdout + r.stderr
    r = sa(venv, "rules", "SA507", cwd=tmp_path)
    assert r.returncode == 0 and "SA507" in r.stdout and "What" in r.stdout, r.stdout + r.stderr
    r = sa(venv, "query", clean, "SELECT count(*) AS n FROM steps", "--output-format", "json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)[0]["n"] > 0, r.stdout + r.stderr
    r = sa(venv, "query", broken, "violations_by_code", "--output-format", "csv", cwd=tmp_path)
    assert r.returncode == 0 and "SA507" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("argv, extra", [
    (["run", "--num-prompts", "1"], "runtime"), (["demo"], "demo"), (["serve", "--trace-dir", "t"], "serve"),
    (["report", "x", "--out", "r"], "report"), (["calibrate", "--out", "c.json"], "runtime"),
    (["check", "--engine", "spark", "x"], "spark"),
])
def test_missing_extra_is_one_line(venv, tmp_path, argv, extra):
    r = sa(venv, *argv, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert f"pip install 'specaudit[{extra}]'" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not any(tmp_path.iterdir()), "a command refused for a missing extra wrote files"


def test_check_help_imports_no_numeric_library(venv, tmp_path):
    """`check --help` starts fast because it imports none of numpy, pyarrow, duckdb (the
    start-up time itself is measured by scripts/base_install.py, not asserted on a busy machine)."""
    probe = ("import sys; sys.argv = ['specaudit', 'check', '--help']\nfrom specaudit.cli import main\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "sys.stderr.write(repr(sorted({m.split('.')[0] for m in sys.modules} & "
             "{'numpy', 'pyarrow', 'duckdb', 'polars', 'torch'})))")
    r = subprocess.run([str(base_install.venv_python(venv)), "-c", probe], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and "--config" in r.stdout, r.stderr
    assert r.stderr.strip() == "[]", r.stderr


def test_measurement_script_prints_json(venv):
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "base_install.py"), "--venv", str(venv), "--runs", "3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    print(r.stdout)
    assert m["heavy_present"] == [] and {"pyarrow", "numpy", "specaudit"} <= set(m["largest_mb"])
    # a regression guard, not the target: numpy + pyarrow + duckdb alone are ~300 MB here
    assert 20 < m["base_install_mb"] < 400, m
    assert 0 < m["check_help_s_median"] < 30 and m["date"] and m["machine"] and "load_avg_1m" in m


# ---------------------------------------------------------------- the integrations


@pytest.fixture(scope="module")
def source_repo(tmp_path_factory):
    """This checkout's package as its own git repository (what `uses:` / `repo:` fetch):
    the files a build needs plus action.yml and .pre-commit-hooks.yaml, committed."""
    d = tmp_path_factory.mktemp("hookrepo") / "specaudit"
    d.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in base_install.SOURCES + ("action.yml", ".pre-commit-hooks.yaml"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, d / name, ignore=skip)
        else:
            shutil.copy(REPO / name, d / name)
    subprocess.run([*GIT, "init", "-q", str(d)], check=True)
    subprocess.run([*GIT, "-C", str(d), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(d), "commit", "-q", "-m", "specaudit"], check=True)
    sha = subprocess.run(["git", "-C", str(d), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    return d, sha


def _expr(text: str, ctx: dict) -> str:
    """${{ inputs.x }} / ${{ github.action_path }} / ${{ steps.check.outputs.x }} from ctx."""
    def sub(m):
        key = m.group(1).strip()
        assert key in ctx, f"action.yml uses ${{{{ {key} }}}}, which the test does not provide"
        return ctx[key]
    return re.sub(r"\$\{\{\s*([^}]*?)\s*\}\}", sub, str(text))


def run_action(source: Path, venv: Path, house: Path, work: Path, inputs: dict, *, install: bool = True) -> dict:
    """Run action.yml's steps as GitHub's runner would run a composite action: each `run`
    step with `bash --noprofile --norc -eo pipefail`, its env expanded, outputs through
    $GITHUB_OUTPUT; `uses` steps are checked, not run (setup-python: the venv is the
    python; upload-sarif: the file it names must be valid SARIF). -> the step results."""
    action = yaml.safe_load((source / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    ctx = {f"inputs.{k}": str(v.get("default", "")) for k, v in action["inputs"].items()}
    ctx.update({f"inputs.{k}": v for k, v in inputs.items()})
    ctx["github.action_path"] = str(source)
    out = {"logs": [], "uploaded": None, "exit": None}
    for step in action["runs"]["steps"]:
        if "uses" in step:
            if step["uses"].startswith("github/codeql-action/upload-sarif"):
                out["uploaded"] = Path(work, _expr(step["with"]["sarif_file"], ctx))
            else:
                assert step["uses"].startswith("actions/setup-python"), step["uses"]
            continue
        if not install and step.get("name", "").startswith("Install"):
            continue
        assert "${{" not in step["run"], f"step {step.get('name')}: expressions go through env, not the script"
        assert step.get("shell") == "bash", step
        gh_out = work / f"github_output_{len(out['logs'])}"
        gh_out.write_text("")
        env = offline_env(house, PATH=f"{venv / 'bin'}:/usr/bin:/bin", GITHUB_OUTPUT=str(gh_out),
                          GITHUB_ACTION_PATH=str(source), HOME=os.environ.get("HOME", "/tmp"))
        env.update({k: _expr(v, ctx) for k, v in (step.get("env") or {}).items()})
        script = work / "step.sh"
        script.write_text(step["run"])
        r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], capture_output=True,
                           text=True, cwd=work, env=env, timeout=600)
        out["logs"].append((step.get("name"), r.returncode, r.stdout, r.stderr))
        for line in gh_out.read_text().splitlines():
            k, _, v = line.partition("=")
            ctx[f"steps.{step.get('id')}.outputs.{k}"] = v
        if step.get("name", "").startswith("Exit"):
            out["exit"] = r.returncode
        elif r.returncode != 0:
            raise AssertionError(f"step {step.get('name')!r} failed ({r.returncode}): {r.stdout}{r.stderr}")
    return out


def test_github_action_steps(source_repo, venv, house, datasets, tmp_path):
    src, _ = source_repo
    clean, broken = datasets
    work = tmp_path / "ws"
    work.mkdir()
    res = run_action(src, venv, house, work, {"paths": f"{broken} {ENGINES / 'vllm_rate_above_one.log'}"})
    name, code, stdout, _ = res["logs"][1]
    assert res["exit"] == 1, res["logs"]
    assert "::error" in stdout and "SA507" in stdout and "vllm_rate_above_one.log" in stdout, stdout
    sarif = json.loads(res["uploaded"].read_text())
    assert sarif["version"] == "2.1.0"
    codes = {r["ruleId"] for run in sarif["runs"] for r in run["results"]}
    assert "SA507" in codes and any(c.startswith("SA7") for c in codes), codes
    # the install step put this source tree's copy in the venv (not a cached one); asked without
    # this interpreter's PYTHONPATH (a checkout on it would answer instead of the venv)
    r = subprocess.run([str(base_install.venv_python(venv)), "-c", "import specaudit; print(specaudit.__file__)"],
                       capture_output=True, text=True, cwd=tmp_path, env=offline_env(house))
    assert str(venv) in r.stdout, r.stdout
    # clean inputs: exit 0, no annotations; a path that does not exist: exit 2; settings and args honoured
    res = run_action(src, venv, house, work, {"paths": f"{clean} {ENGINES / 'vllm_clean.log'}"}, install=False)
    assert res["exit"] == 0 and "::error" not in res["logs"][0][2], res["logs"]
    res = run_action(src, venv, house, work, {"paths": str(tmp_path / "missing")}, install=False)
    assert res["exit"] == 2, res["logs"]
    (work / "specaudit.toml").write_text('ignore = ["SA507"]\n')
    res = run_action(src, venv, house, work, {"paths": str(broken), "args": "--statistics"}, install=False)
    assert res["exit"] == 0, res["logs"]


def test_pre_commit_hook_on_a_broken_trace(source_repo, house, datasets, tmp_path):
    src, sha = source_repo
    clean, broken = datasets
    repo = tmp_path / "user-repo"
    (repo / "traces").mkdir(parents=True)
    shutil.copytree(next(broken.iterdir()), repo / "traces" / next(broken.iterdir()).name)
    shutil.copy(ENGINES / "vllm_clean.log", repo / "server.log")
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump({"repos": [{
        "repo": str(src), "rev": sha, "hooks": [{"id": "specaudit-check"}, {"id": "specaudit-check-logs"}]}]}))
    subprocess.run([*GIT, "init", "-q", str(repo)], check=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "-A"], check=True)
    env = offline_env(house, PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"), HOME=str(tmp_path),
                      PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin")

    def pre_commit():
        return subprocess.run([sys.executable, "-m", "pre_commit", "run", "--all-files", "--color", "never"],
                              capture_output=True, text=True, cwd=repo, env=env, timeout=900)

    r = pre_commit()
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert re.search(r"specaudit check \(trace datasets\)\.+Failed", out) and "SA507" in out, out
    assert re.search(r"specaudit check \(engine logs and Prometheus scrapes\)\.+Passed", out), out
    # the trace fixed: the hook passes
    run = next(clean.iterdir())
    shutil.copy(run / "run.json", repo / "traces" / run.name / "run.json")
    r = pre_commit()
    assert r.returncode == 0 and re.search(r"specaudit check \(trace datasets\)\.+Passed", r.stdout), \
        r.stdout + r.stderr
