"""`pip install .` (a real wheel, not the editable tree) ships everything the CLI needs."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from a copy of the sources (scripts/base_install.py), never in the
    checkout: an in-tree build writes build/ there, where another build (a second worker,
    or README command 1's `pip install .`) collided with it ("File exists: build/bdist...")
    and a stale build/lib would ship modules deleted since."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import base_install
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return base_install.build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_contents(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for need in ["specaudit/weights/target.safetensors", "specaudit/weights/drafter.safetensors",
                 "specaudit/data/prompts.jsonl", "specaudit/invariants/__init__.py",
                 "specaudit/kernels/__init__.py", "specaudit/dashboards/__init__.py",
                 "specaudit/runtime/engine.py", "specaudit/commands/run.py",
                 "specaudit/audit/sources/__init__.py", "specaudit/audit/sources/sglang.py",
                 "specaudit/integrations/transformers.py", "specaudit/postmortem/queries/a_vs_b.sql"]:
        assert need in names, need
    for d in ("invariants", "kernels", "dashboards"):
        kinds = (".py", ".json", ".yml", ".yaml", ".sql", ".c", ".h")
        src = {p.relative_to(REPO / d).as_posix() for p in (REPO / d).rglob("*")
               if p.is_file() and "__pycache__" not in p.parts and p.suffix in kinds}
        shipped = {n.split(f"specaudit/{d}/", 1)[1] for n in names if n.startswith(f"specaudit/{d}/")}
        assert src <= shipped, f"{d}/ files missing from the wheel: {sorted(src - shipped)}"
    # every Python file under specaudit/ ships (a subpackage missing from pyproject's
    # package list would only show up outside the editable dev install)
    pkg = {p.relative_to(REPO).as_posix() for p in (REPO / "specaudit").rglob("*.py")
           if "__pycache__" not in p.parts}
    assert pkg <= names, f"missing from the wheel: {sorted(pkg - names)}"
    # the compiled kernels' C sources: built on the user's machine, so they must ship
    csrc = {p.relative_to(REPO).as_posix() for p in (REPO / "specaudit").rglob("*.c")}
    assert csrc and csrc <= names, f"C sources missing from the wheel: {sorted(csrc - names)}"
    sql = {p.name for p in (REPO / "specaudit" / "postmortem" / "queries").glob("*.sql")}
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith("specaudit/postmortem/queries/")} >= sql
    assert not any(n.endswith((".pt", ".pth", ".bin", ".pkl")) for n in names), "pickle weights shipped"


@pytest.fixture(scope="module")
def wheel_site(wheel, tmp_path_factory):
    """The wheel installed (not editable) into its own folder, and the environment that
    imports it: that folder plus this interpreter's site-packages for the dependencies,
    run with `python -S` so the dev checkout's editable .pth hook is not loaded."""
    import site
    import sysconfig
    target = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(target), str(wheel)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    paths = [str(target), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
             *site.getsitepackages()]
    return target, {"PYTHONPATH": ":".join(dict.fromkeys(paths)), "PATH": "/usr/bin:/bin"}


@pytest.mark.parametrize("where", ["repo-root", "elsewhere"])
def test_readme_commands_from_the_clone_root(wheel_site, tmp_path, where):
    """README command 1 is typed in the clone's root: there `python -m specaudit` imports
    the source folder specaudit/, not the installed copy, and invariants/, kernels/ and
    dashboards/ (top-level folders) must still be found as specaudit.* subpackages."""
    target, env = wheel_site
    cwd = REPO if where == "repo-root" else tmp_path

    def sa(*args):
        return subprocess.run([sys.executable, "-S", "-m", "specaudit", *map(str, args)],
                              capture_output=True, text=True, cwd=cwd, env=env, timeout=300)

    r = sa("rules", "SA301")
    assert r.returncode == 0 and "SA301" in r.stdout and "What" in r.stdout, r.stdout + r.stderr
    r = sa("run", "--num-prompts", "1", "--max-new-tokens", "16", "--out", tmp_path / "t")
    assert r.returncode == 0, r.stderr
    r = sa("check", tmp_path / "t")
    assert r.returncode == 0 and "No violations" in r.stdout, r.stdout + r.stderr
    r = sa("demo", "--help")
    assert r.returncode == 0 and "--device" in r.stdout, r.stderr
    loc = subprocess.run([sys.executable, "-S", "-c", "import specaudit, specaudit.invariants as m, "
                          "specaudit.kernels as k; print(specaudit.__file__, m.__file__, k.__file__)"],
                         capture_output=True, text=True, cwd=cwd, env=env).stdout.split()
    if where == "repo-root":  # the source tree, all three from the repository
        assert loc == [str(REPO / "specaudit" / "__init__.py"), str(REPO / "invariants" / "__init__.py"),
                       str(REPO / "kernels" / "__init__.py")], loc
    else:  # the wheel's copy, all three from the install folder
        assert all(x.startswith(str(target)) for x in loc), loc


@pytest.mark.parametrize("installed", [True, False])
def test_an_installed_top_level_kernels_wins_over_the_clone_root(tmp_path, installed):
    """transformers >= 5.25 depends on Hugging Face's `kernels` and imports it at import
    time; in the clone's root (on sys.path with `python -m`) our kernels/ folder answered
    for that name and every model load failed (ImportError: CUDAProperties). Once specaudit
    is imported, a top-level name installed elsewhere on the path is that package; with
    none installed, the folder still answers (the tests' `from dashboards import ...`),
    and specaudit.kernels is ours either way. (`python -S`: this interpreter's own
    site-packages, which may hold Hugging Face's kernels, stay out; find_spec runs nothing.)"""
    site = tmp_path / "site"
    site.mkdir()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}
    if installed:   # an installed distribution's top-level package of the same name
        (site / "kernels").mkdir()
        (site / "kernels" / "__init__.py").write_text("CUDAProperties = 'hub'\n")
    code = ("import specaudit, importlib.util as u\n"
            "print(u.find_spec('kernels').origin, u.find_spec('specaudit.kernels').origin)\n"
            f"if u.find_spec('kernels').origin.startswith({str(site)!r}):\n"
            "    from kernels import CUDAProperties; print(CUDAProperties)")
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    got = r.stdout.split()
    ours = str(REPO / "kernels" / "__init__.py")
    if installed:
        assert got == [str(site / "kernels" / "__init__.py"), ours, "hub"], r.stdout
    else:
        assert got == [ours, ours], r.stdout


@pytest.mark.parametrize("device", ["tpu", "meta", "cuda:0", "mps", "cpuu", ""])
@pytest.mark.parametrize("command", ["run", "serve", "calibrate", "demo"])
def test_unusable_device_is_one_line_and_exit_2(command, device, tmp_path, capsys):
    """Every command that takes --device refuses one this torch cannot use with one line."""
    import torch

    from specaudit.cli import main
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    extra = {"run": ["--out", str(tmp_path / "t")], "serve": ["--port", "0", "--trace-dir", str(tmp_path / "t")],
             "calibrate": ["--out", str(tmp_path / "c.json")], "demo": ["--out", str(tmp_path / "d")]}[command]
    code = main([command, "--device", device, *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "--device" in err and "Traceback" not in err, err
    assert not (tmp_path / "t").exists() and not (tmp_path / "d").exists() and not (tmp_path / "c.json").exists()


def test_ab_arm_with_unusable_device_is_one_line(tmp_path, capsys):
    from specaudit.cli import main
    code = main(["ab", "--a=--algo chain --device tpu", "--b=--algo tree", "--out", str(tmp_path / "ab")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--a: --device" in err, err


def test_installed_wheel_runs_outside_the_repo(wheel, tmp_path):
    """Install the wheel into its own folder and run the CLI from there.

    The dev checkout is installed editable, and its import hook is set up by a .pth
    file; `python -S` skips .pth processing, so only the wheel's copy can be imported.
    Dependencies come from this interpreter's site-packages.
    """
    import site
    import sysconfig
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(target), str(wheel)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "specaudit = specaudit.cli:main" in (
        next(target.glob("specaudit-*.dist-info")) / "entry_points.txt").read_text()
    paths = [str(target), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
             *site.getsitepackages()]
    env = {"PYTHONPATH": ":".join(dict.fromkeys(paths)), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-S", "-m", "specaudit", "run", "--num-prompts", "1",
                        "--max-new-tokens", "16", "--oracle", "--out", str(tmp_path / "t")],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "lossless: yes" in r.stdout
    # the readers of other engines' logs ship too
    fx = REPO / "tests" / "fixtures" / "engines"
    r = subprocess.run([sys.executable, "-S", "-m", "specaudit", "check", str(fx / "vllm_clean.log")],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-S", "-m", "specaudit", "check", str(fx / "vllm_rate_above_one.log")],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    where = subprocess.run([sys.executable, "-S", "-c", "import specaudit.invariants as m; print(m.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=env).stdout
    assert where.startswith(str(target)), f"imported from the repo, not the wheel: {where}"
