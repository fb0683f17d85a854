#!/usr/bin/env bash
# The fuzz targets build from fuzz/CMakeLists.txt alone, with clang and without
# LibTorch: this keeps the config loader and the token-file reader torch-free
# (a torch header reached from them fails this compile). Compiles, runs nothing.
#   tests/fuzz_build_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
cxx="$(command -v clang++ || command -v clang++-14 || true)"
if [[ -z "$cxx" ]] || [[ ! -e "$("$cxx" -print-file-name=libclang_rt.fuzzer-x86_64.a)" ]]; then
  echo "fuzz_build_test: no clang with libFuzzer (apt-get install clang-14 libclang-rt-14-dev): skipped"
  exit 77
fi
CQK_FUZZ_BUILD="$build" CQK_FUZZ_CXX="$cxx" "$src/scripts/fuzz.sh" --build-only
for target in config_loader token_file; do
  [[ -x "$build/fuzz/fuzz_$target" ]] || { echo "fuzz_build_test: fuzz_$target was not built"; exit 1; }
done
