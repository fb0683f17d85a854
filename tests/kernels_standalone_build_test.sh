#!/usr/bin/env bash
# kernels/standalone builds: the fallback scripts/gpu_check.sh --standalone
# takes on a GPU machine where the full project cannot be configured. Its
# source list is kept by hand, so a unit moved in src/ breaks it at link time;
# this builds it (CUDA kernels, the library units it names and
# cqk_kernel_bench) as gpu_check.sh does. Builds, runs nothing (no GPU here).
#   tests/kernels_standalone_build_test.sh SOURCE_DIR BUILD_DIR TORCH_PREFIX
set -euo pipefail
src=$1 build=$2 torch_prefix=$3
nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
if [[ ! -x "$nvcc" ]]; then
  echo "kernels_standalone_build_test: no nvcc (CUDA toolkit at /usr/local/cuda): skipped"
  exit 77
fi
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  # Paths relative to the clone in ccache's keys: a new clone elsewhere reuses the cache (minutes cold).
  export CCACHE_BASEDIR="$src"
fi
cmake -S "$src/kernels/standalone" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DCMAKE_PREFIX_PATH="$torch_prefix" "${launcher[@]}" >"$build.configure.log" 2>&1 \
  || { tail -30 "$build.configure.log"; echo "kernels_standalone_build_test: configure failed"; exit 1; }
cmake --build "$build" -j "$(nproc)"
[[ -x "$build/cqk_kernel_bench" ]] || { echo "kernels_standalone_build_test: cqk_kernel_bench was not built"; exit 1; }
