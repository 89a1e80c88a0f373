#!/usr/bin/env bash
# GPU checks in one call, for a machine with an NVIDIA GPU (e.g. the device lent to a session):
# builds llama-cpp-python with CUDA (the README's command), runs the engine and scoring tests with
# every layer offloaded (their determinism and batching checks measure what CUDA's kernels hold), the
# prompt-format benchmark, `llamadecide bench --gpu on` and its batched throughput at concurrency
# 1/8/32 with decisions one at a time and sharing calls, and writes
# every figure and log under OUTDIR. On a machine without a GPU it says so and exits 0.
# Usage: scripts/gpu-check.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/gpu-check.sh OUTDIR}"
mkdir -p "$out"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no NVIDIA GPU on this machine: nothing to check" | tee "$out/summary.txt"
  exit 0
fi
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
status=0
step() {  # step NAME COMMAND...: run, log to OUTDIR/NAME.log, record the exit status
  local name="$1"; shift
  local began=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local code=$?
  echo "$name: exit $code in $((SECONDS - began)) s" | tee -a "$out/summary.txt"
  [ "$code" -eq 0 ] || status=1
}
step build env LLAMADECIDE_CMAKE_EXTRA=-DGGML_CUDA=on bash scripts/install.sh test
step models .venv/bin/python -m pip install --quiet -e ".[test,models]"
step offload .venv/bin/python -c "import llama_cpp; assert llama_cpp.llama_supports_gpu_offload(), 'no GPU offload in this build'"
step tests env LLAMADECIDE_N_GPU_LAYERS=-1 .venv/bin/python -m pytest -q tests/test_engine_model.py \
  tests/test_scoring_model.py tests/test_prompt_formats.py tests/test_demonstrations.py tests/test_determinism.py tests/test_batching.py
step prompt_formats .venv/bin/python -m benchmarks.prompt_formats --dataset agnews sst2 banking77 --items 40 --n-gpu-layers -1 \
  --json "$out/layouts-gpu.json"
step bench .venv/bin/llamadecide bench --gpu on --model qwen2.5-coder-1.5b-instruct --out "$out/bench"
# Shared decode calls: throughput by concurrency with requests evaluated one at a time and together.
step batched .venv/bin/llamadecide bench --gpu on --no-chat --model qwen2.5-coder-1.5b-instruct --concurrency 1 \
  --concurrency 8 --concurrency 32 --requests 64 --decision-batch 1 --decision-batch 32 --out "$out/batched"
exit $status
