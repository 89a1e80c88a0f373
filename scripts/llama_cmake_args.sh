#!/usr/bin/env bash
# CMAKE_ARGS for building llama-cpp-python's bundled llama.cpp on this machine's CPU.
# We do not use GGML_NATIVE: -march=native also enables AMX, and ggml's AMX matmul crashes
# (SIGSEGV in ggml_backend_amx_mul_mat) on virtual machines that advertise AMX without
# granting it. Instead every x86 feature the CPU reports is turned on explicitly, AMX excepted.
# The multimodal library (mtmd, formerly LLAVA) is not built: the engine never loads it, and it is
# a large share of the compile. Extra arguments (e.g. -DGGML_CUDA=on) are appended.
# LLAMADECIDE_PORTABLE_CPU=1 (the Docker images) builds for any x86-64 with AVX2/FMA/F16C instead of
# this machine's features, so an image runs on every instance family whatever machine built it.
set -euo pipefail
args=(-DLLAVA_BUILD=OFF)
if [ "${LLAMADECIDE_PORTABLE_CPU:-0}" = "1" ]; then
  args+=(-DGGML_NATIVE=OFF)
elif [ "$(uname -m)" = "x86_64" ] && [ -r /proc/cpuinfo ]; then
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  has() { [[ "$flags" == *" $1 "* ]]; }
  args+=(-DGGML_NATIVE=OFF)
  has avx2 || args+=(-DGGML_AVX2=OFF)
  has fma || args+=(-DGGML_FMA=OFF)
  has f16c || args+=(-DGGML_F16C=OFF)
  has bmi2 || args+=(-DGGML_BMI2=OFF)
  has avx_vnni && args+=(-DGGML_AVX_VNNI=ON)
  if has avx512f && has avx512bw && has avx512vl && has avx512dq; then
    args+=(-DGGML_AVX512=ON)
    has avx512vbmi && args+=(-DGGML_AVX512_VBMI=ON)
    has avx512_vnni && args+=(-DGGML_AVX512_VNNI=ON)
    has avx512_bf16 && args+=(-DGGML_AVX512_BF16=ON)
  fi
fi
echo "${args[*]} $*" | sed 's/^ *//; s/ *$//'
