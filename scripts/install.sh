#!/usr/bin/env bash
# Create .venv and install llamadecide with llama.cpp built for this CPU.
# Usage: scripts/install.sh [extras, e.g. test] ; GPU: LLAMADECIDE_CMAKE_EXTRA=-DGGML_CUDA=on scripts/install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# shellcheck disable=SC2086
scripts/install_llama_cpp.sh .venv/bin/python ${LLAMADECIDE_CMAKE_EXTRA:-}
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install --quiet -e ".[$extras]"
else
  .venv/bin/python -m pip install --quiet -e .
fi
