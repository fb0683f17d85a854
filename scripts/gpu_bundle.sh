#!/usr/bin/env bash
# Builds the offline GPU check (issue 19) on this machine, for a GPU machine
# with torch but no compiler time to spare, no network and none of the full
# build's dependencies: cqk, cqk_tests and cqk_kernel_bench for one
# architecture (sm_90: H100/H200), Release, stripped; the shared libraries
# they load other than torch's and the system's C and C++ runtimes; the
# configs the check trains; and
# scripts/gpu_bundle/run.sh, the one command to run there (docs/KERNELS.md).
#
#   scripts/gpu_bundle.sh        -> build-gpu/bundle/ (git-ignored), at most 60 MiB
#
# The binaries are linked against the pinned torch wheel (scripts/setup.sh);
# run.sh loads the GPU machine's own copy of that wheel through its python3.
# Environment: CQK_GPU_BUILD (default build-gpu), CQK_GPU_ARCH (CMake's CUDA
# architectures, default 90-real).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$CQK_ROOT/scripts/setup.sh"
source "$CQK_ROOT/scripts/env.sh"  # CQK_VENV again: setup.sh may have installed python3

BUILD="${CQK_GPU_BUILD:-$CQK_ROOT/build-gpu}"
BUNDLE="$BUILD/bundle"
ARCH="${CQK_GPU_ARCH:-90-real}"
MAX_BYTES=$((60 << 20))
SITE="$("$CQK_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

# Machine code for sm_90 alone (no PTX), compressed for size: each of the three
# binaries carries the kernels, and together they must fit the 60 MiB.
cmake -S "$CQK_ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCQK_CUDA=ON \
  -DCQK_KERNEL_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_FLAGS="--compress-mode=size" \
  -DCMAKE_PREFIX_PATH="$SITE/torch/share/cmake" \
  -DCQK_PYTHON="$CQK_VENV/bin/python" >"$BUILD.configure.log" 2>&1 \
  || { cat "$BUILD.configure.log" >&2; echo "gpu_bundle: CMake configure failed" >&2; exit 1; }
cmake --build "$BUILD" -j "${CQK_JOBS:-$(nproc)}" --target cqk_tool cqk_tests cqk_kernel_bench

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
cp "$BUILD/cqk" "$BUILD/tests/cqk_tests" "$BUILD/cqk_kernel_bench" "$BUNDLE/bin/"
cp -r "$CQK_ROOT/configs" "$BUNDLE/"
cp "$CQK_ROOT/scripts/gpu_bundle/run.sh" "$CQK_ROOT/scripts/gpu_bundle/report.py" "$BUNDLE/"

# Every library the binaries load, as this machine resolves it with the
# wheel's libraries first (as run.sh orders them there). Torch's come from the
# GPU machine's wheel; glibc, libstdc++ and libgcc_s from its system, where
# torch's own libraries find them (a copy of glibc would not match the loader,
# and this libstdc++ needs glibc 2.36, the binaries 2.35). The rest (yaml-cpp,
# spdlog, fmt, sentencepiece) travel.
TORCH_PATH="$SITE/torch/lib$(printf ':%s' "$SITE"/nvidia/*/lib)"
LD_LIBRARY_PATH="$TORCH_PATH" ldd "$BUNDLE"/bin/* | awk '$2 == "=>" {print $1, $3}' | sort -u |
  while read -r soname path; do
    [[ "$path" == "not" ]] && { echo "gpu_bundle: $soname not found" >&2; exit 1; }
    [[ "$path" == "$SITE"/* || "$soname" =~ $CQK_SYSTEM_LIBRARIES ]] && continue
    cp -L "$path" "$BUNDLE/lib/$soname"
  done
strip --strip-all "$BUNDLE"/bin/*
strip --strip-unneeded "$BUNDLE"/lib/*
# The build tree's RPATH names this machine's torch, which would win over the
# GPU machine's: the binaries look in ../lib only (run.sh adds torch's folders).
for f in "$BUNDLE"/bin/*; do echo "file(RPATH_SET FILE \"$f\" NEW_RPATH \"\$ORIGIN/../lib\")"; done >"$BUILD/rpath.cmake"
cmake -P "$BUILD/rpath.cmake"

# What the GPU machine must have: the same torch, glibc and libstdc++ at least these.
newest() { objdump -T "$BUNDLE"/bin/* "$BUNDLE"/lib/* | grep -o "$1_[0-9.]*[0-9]" | sort -uV | tail -1; }
torch_version="$("$CQK_VENV/bin/python" -c 'import torch; print(torch.__version__)')"
cat >"$BUNDLE/BUILD_INFO" <<INFO
commit $(git -C "$CQK_ROOT" rev-parse --short HEAD)$(git -C "$CQK_ROOT" diff --quiet HEAD || echo "+changes")
built $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release && echo "$PRETTY_NAME")
kernels $ARCH
needs torch $torch_version, $(newest GLIBC), $(newest GLIBCXX)
INFO

bytes="$(du -sb "$BUNDLE" | cut -f1)"
echo "gpu_bundle: $BUNDLE: $((bytes >> 20)) MiB ($bytes bytes); $(ls "$BUNDLE/lib" | tr '\n' ' ')"
((bytes <= MAX_BYTES)) || { echo "gpu_bundle: larger than $((MAX_BYTES >> 20)) MiB" >&2; exit 1; }
