#!/usr/bin/env bash
# Configures (once) and builds cqk with Ninja and ccache into $CQK_BUILD.
# Extra arguments go to the CMake configure step, e.g. -DCQK_SANITIZE=ON.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$CQK_ROOT/scripts/setup.sh"
source "$CQK_ROOT/scripts/env.sh"  # CQK_VENV again: setup.sh may have installed python3

torch_prefix="$("$CQK_VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
if [[ ! -f "$CQK_BUILD/build.ninja" || $# -gt 0 ]]; then
  cmake -S "$CQK_ROOT" -B "$CQK_BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE="${CQK_BUILD_TYPE:-Release}" \
    -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DCQK_PYTHON="$CQK_VENV/bin/python" "$@" >"$CQK_BUILD.configure.log" 2>&1 \
    || { cat "$CQK_BUILD.configure.log" >&2; echo "build: CMake configure failed" >&2; exit 1; }
fi
# CQK_TARGET narrows the build (scripts/cqk builds only the tool).
cmake --build "$CQK_BUILD" -j "${CQK_JOBS:-$(nproc)}" ${CQK_TARGET:+--target "$CQK_TARGET"}
