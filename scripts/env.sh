# Shared settings for the scripts: the pinned versions and where the cached
# Python environment that carries LibTorch lives (outside the clone, so CI and
# new clones reuse it). Sourced, not executed.
CQK_TORCH_VERSION="2.11.0"          # CUDA 13.0 build on PyPI, same as the GPU machine
CQK_PYTHON="${CQK_PYTHON:-python3}"
CQK_CACHE="${CQK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cqk}"
# Named by the Python version, so it is known only once python3 is there: scripts
# that run setup.sh source this file again after it.
CQK_VENV="$CQK_CACHE/torch-$CQK_TORCH_VERSION-$("$CQK_PYTHON" -c 'import sys; print(f"py{sys.version_info[0]}.{sys.version_info[1]}")' 2>/dev/null || echo unknown)"
CQK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CQK_BUILD="${CQK_BUILD:-$CQK_ROOT/build}"
# pkgconf: CMake's find_package(PkgConfig); python3-dev: Python.h, for torch.compile's
# CPU kernels (bench_pytorch.compile, bench_compare.tiny_round).
CQK_DEBIAN_PACKAGES=(cmake ninja-build ccache g++ pkgconf python3-venv python3-dev libyaml-cpp-dev libcli11-dev
                     libspdlog-dev libsentencepiece-dev libgtest-dev nlohmann-json3-dev clang-14 libclang-rt-14-dev)
# Libraries a machine with torch has from its system, so the GPU bundle
# (scripts/gpu_bundle.sh) does not carry them: glibc's, libstdc++, libgcc_s.
CQK_SYSTEM_LIBRARIES='^(ld-linux-x86-64|libc|libm|libmvec|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s)\.so'
