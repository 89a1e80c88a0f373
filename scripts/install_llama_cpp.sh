#!/usr/bin/env bash
# Build (once per CPU feature set) and install llama-cpp-python with safe CPU flags and one patch
# (scripts/patch_llama_cpp.py: switches for ggml's CPU flash attention, among them the batch-invariant
# kernel in scripts/llama_cpp_invariant_attention.cpp that the engine uses).
# Usage: scripts/install_llama_cpp.sh [PYTHON] [extra CMake args, e.g. -DGGML_CUDA=on]
# The wheel is kept in $LLAMADECIDE_WHEELHOUSE (default ~/.cache/llamadecide/wheels), keyed by
# version, Python, architecture, CMake arguments and the patch, so a rebuild happens only when one changes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${1:-python3}"
shift || true
version="0.3.36"
cmake_args="$("$here/llama_cmake_args.sh" "$@")"
pyver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
patch_sum="$(cat "$here/patch_llama_cpp.py" "$here/llama_cpp_invariant_attention.cpp" | sha256sum | cut -c1-16)"
key="$(printf '%s|%s|%s|%s|%s' "$version" "$pyver" "$(uname -m)" "$cmake_args" "$patch_sum" | sha256sum | cut -c1-16)"
house="${LLAMADECIDE_WHEELHOUSE:-$HOME/.cache/llamadecide/wheels}/$key"
if ! ls "$house"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $version with CMAKE_ARGS='$cmake_args' (several minutes)" >&2
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  "$python" -m pip download --quiet --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$version"
  tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
  "$python" "$here/patch_llama_cpp.py" "$work/llama_cpp_python-$version"
  mkdir -p "$house.tmp"
  CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$python" -m pip wheel --quiet --no-deps --no-cache-dir -w "$house.tmp" "$work/llama_cpp_python-$version"
  rm -rf "$house" && mv "$house.tmp" "$house"
fi
"$python" -m pip install --quiet --force-reinstall --no-deps "$house"/llama_cpp_python-*.whl
"$python" -m pip install --quiet "llama-cpp-python==$version"  # its pure-Python dependencies
