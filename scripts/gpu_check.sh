#!/usr/bin/env bash
# GPU check of the fused coupling kernels (docs/KERNELS.md),
# in one call on a machine with a GPU, under 8 minutes: builds cqk, runs the GPU
# tests, times 150M training steps with and without coupling (issue 9), prints
# the kernel benchmark table last. It builds on the GPU machine, so it needs
# the build's dependencies (or network) and minutes there: for a new GPU
# machine, the prebuilt bundle of scripts/gpu_bundle.sh is the way to check.
#
#   scripts/gpu_check.sh                 the check (on the GPU machine)
#   scripts/gpu_check.sh --standalone    skip the full build: kernels/standalone only
#   scripts/gpu_check.sh --fetch-deps    on a development machine with apt: download the
#                                        Debian packages of the full build (yaml-cpp, CLI11,
#                                        spdlog, sentencepiece, GoogleTest, ...) into
#                                        build-gpu-deps/, for a GPU machine without them
#                                        (carry that folder along; it is git-ignored)
#
# Torch: the machine's own when python3 imports it (within 2 minutes; its
# cmake_prefix_path; its CUDA version is checked against nvcc's), else the
# pinned LibTorch of scripts/setup.sh. Dependencies: the system's, plus
# build-gpu-deps/*.deb unpacked under /tmp/cqk-deps when present. If the full
# project cannot be configured or built, it falls back to kernels/standalone:
# the kernels, the torch wiring and cqk_kernel_bench, against torch alone, whose
# --check runs the same checks as tests/fused_coupling_test.cpp.
#
# Environment: CQK_GPU_BUDGET (seconds, default 450), CQK_GPU_BUILD (default
# build-gpu), CQK_GPU_SANITIZE=1 (also run the quick checks under
# compute-sanitizer memcheck and racecheck), OUT (logs and the table are copied
# there when set, after every stage).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEPS_DIR="$ROOT/build-gpu-deps"
DEBS=(libyaml-cpp-dev libyaml-cpp0.7 libcli11-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
      libsentencepiece-dev libsentencepiece0 libgtest-dev nlohmann-json3-dev pkgconf-bin libpkgconf3)

if [[ "${1:-}" == "--fetch-deps" ]]; then
  mkdir -p "$DEPS_DIR" && cd "$DEPS_DIR" || exit 1
  apt-get download "${DEBS[@]}" || { echo "gpu_check: apt-get download failed" >&2; exit 1; }
  echo "gpu_check: $(ls "$DEPS_DIR"/*.deb | wc -l) packages in $DEPS_DIR ($(du -sh "$DEPS_DIR" | cut -f1)); carry build-gpu-deps"
  exit 0
fi
STANDALONE=0
[[ "${1:-}" == "--standalone" ]] && STANDALONE=1

START=$SECONDS
BUDGET="${CQK_GPU_BUDGET:-450}"
BUILD="${CQK_GPU_BUILD:-$ROOT/build-gpu}"
LOGS="$BUILD-logs"
mkdir -p "$LOGS"
SUMMARY=()
STATUS=0
say() { printf '[gpu_check %3ds] %s\n' $((SECONDS - START)) "$*"; }
note() { SUMMARY+=("$*"); say "$*"; }
left() { echo $((BUDGET - (SECONDS - START))); }
fail() { STATUS=1; note "FAIL: $*"; }
# A stage's time: at most CAP seconds, and RESERVE seconds kept for what comes after it.
limit() {  # RESERVE CAP
  local t=$(( $(left) - $1 ))
  ((t > $2)) && t=$2
  ((t < 10)) && t=10
  echo "$t"
}
# The logs worth reading, copied to $OUT after every stage and on SIGTERM/SIGINT, so that a
# call cut short by its time limit still returns those of the stages it finished.
keep_logs() {
  [[ -n "${OUT:-}" && -d "${OUT:-}" ]] || return 0
  # At most 8 files come back from a device machine: the ones worth reading.
  for f in bench.md train-bench.md gpu-tests.log gpu-checks.log suite.log build.log configure.log standalone-build.log; do
    [[ -f "$LOGS/$f" ]] && cp "$LOGS/$f" "$OUT/" 2>/dev/null
  done
  return 0
}
# Each long step runs through `bounded` (timeout in the background, waited
# for): bash defers a trap while a foreground child runs, and timeout, its
# own process group, misses a group-wide signal; `wait` returns at once.
STEP=""
bounded() {  # SECONDS COMMAND...: timeout's exit status
  timeout "$@" &
  STEP=$!
  local rc=0
  wait "$STEP" || rc=$?
  STEP=""
  return "$rc"
}
on_signal() {  # EXIT_STATUS: timeout passes the TERM on to the step
  [[ -z "$STEP" ]] || kill -TERM "$STEP" 2>/dev/null
  keep_logs
  exit "$1"
}
trap 'on_signal 143' TERM
trap 'on_signal 130' INT

# --- the machine ----------------------------------------------------------------
if ! nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null; then
  echo "gpu_check: nvidia-smi finds no GPU; run this on a GPU machine" >&2
  exit 2
fi
# The GPU's own architecture only (e.g. 9.0 -> 90): half the nvcc time of the default 80;90.
ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
[[ "$ARCH" =~ ^[0-9]+$ ]] || ARCH="80;90"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[[ -x "$NVCC" ]] || { echo "gpu_check: no nvcc" >&2; exit 2; }
NVCC_CUDA="$("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
say "nvcc $NVCC_CUDA ($NVCC), kernels for sm_$ARCH, $(nproc) cores"

# Torch's cmake prefix, version, CUDA version and GPU, from PYTHON, within the
# budget (a first import on a fresh machine can be slow); tagged lines, so
# that whatever else an import prints is not read. 124: past the limit.
read_torch() {  # PYTHON
  local rc=0
  bounded "$(limit 60 120)" "$1" -c 'import torch, torch.utils
print("cqk-torch-prefix", torch.utils.cmake_prefix_path)
print("cqk-torch-version", torch.__version__, torch.version.cuda, torch.cuda.is_available())' \
    >"$LOGS/torch.txt" 2>/dev/null || rc=$?
  ((rc == 0)) || return "$rc"
  TORCH_PREFIX="$(sed -n 's/^cqk-torch-prefix //p' "$LOGS/torch.txt")"
  read -r TORCH_VERSION TORCH_CUDA TORCH_GPU < <(sed -n 's/^cqk-torch-version //p' "$LOGS/torch.txt")
  [[ -n "$TORCH_PREFIX" && -n "${TORCH_VERSION:-}" ]]
}
rc=0
read_torch python3 || rc=$?
if ((rc == 124)); then  # a torch that is there but slow: setup.sh would need the network instead
  echo "gpu_check: importing torch from python3 ran past its limit" >&2
  exit 1
elif ((rc == 0)); then
  PYTHON="$(command -v python3)"
  note "torch $TORCH_VERSION (CUDA $TORCH_CUDA, GPU visible: $TORCH_GPU) from $PYTHON"
  if [[ "${TORCH_CUDA%%.*}" != "${NVCC_CUDA%%.*}" ]]; then
    note "warning: torch is built for CUDA $TORCH_CUDA, nvcc is $NVCC_CUDA (different major versions)"
  fi
else
  say "no torch in python3: using the pinned LibTorch (scripts/setup.sh)"
  # shellcheck source=env.sh
  source "$ROOT/scripts/env.sh"
  bounded "$(limit 120 600)" "$ROOT/scripts/setup.sh" || { echo "gpu_check: setup failed" >&2; exit 1; }
  source "$ROOT/scripts/env.sh"  # CQK_VENV again: setup.sh may have installed python3
  PYTHON="$CQK_VENV/bin/python"
  read_torch "$PYTHON" || { echo "gpu_check: torch from $PYTHON does not import" >&2; exit 1; }
  note "torch $TORCH_VERSION from $CQK_VENV"
fi

# --- carried Debian packages ----------------------------------------------------
PREFIX_PATH="$TORCH_PREFIX"
EXTRA_CMAKE=()
if compgen -G "$DEPS_DIR/*.deb" >/dev/null; then
  DEPS=/tmp/cqk-deps
  rm -rf "$DEPS" && mkdir -p "$DEPS"
  for deb in "$DEPS_DIR"/*.deb; do dpkg -x "$deb" "$DEPS"; done
  # pkg-config files name prefix=/usr; point them at the unpacked tree.
  find "$DEPS" -name '*.pc' -exec sed -i "s|^prefix=/usr|prefix=$DEPS/usr|" {} +
  PREFIX_PATH="$PREFIX_PATH;$DEPS/usr"
  export PKG_CONFIG_PATH="$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export CPATH="$DEPS/usr/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! command -v pkg-config >/dev/null; then EXTRA_CMAKE+=("-DPKG_CONFIG_EXECUTABLE=$DEPS/usr/bin/pkgconf"); fi
  note "unpacked $(ls "$DEPS_DIR"/*.deb | wc -l) carried Debian packages into $DEPS"
fi

GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
JOBS="$(nproc)"

# --- build: the full project, else the standalone kernels ------------------------
MODE=full
if ((STANDALONE)); then
  MODE=standalone
else
  say "configuring the full project in $BUILD"
  if ! bounded "$(limit 200 120)" cmake -S "$ROOT" -B "$BUILD" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release -DCQK_CUDA=ON \
      -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_PREFIX_PATH="$PREFIX_PATH" -DCQK_PYTHON="$PYTHON" \
      -DCQK_KERNEL_ARCHITECTURES="$ARCH" "${EXTRA_CMAKE[@]}" >"$LOGS/configure.log" 2>&1; then
    note "full configure failed, falling back to kernels/standalone: $(grep -m2 -iE 'could not find|not found|error' \
      "$LOGS/configure.log" | tr '\n' ' ' | cut -c1-300)"
    MODE=standalone
  else
    build_limit=$(limit 200 330)
    say "building the full project (-j $JOBS, at most ${build_limit}s)"
    if ! bounded "$build_limit" cmake --build "$BUILD" -j "$JOBS" >"$LOGS/build.log" 2>&1; then
      tail -25 "$LOGS/build.log"
      note "full build failed or ran out of time (log: $LOGS/build.log), falling back to kernels/standalone"
      MODE=standalone
    else
      note "full build ok"
    fi
  fi
fi

BENCH=""
if [[ "$MODE" == standalone ]]; then
  KBUILD="$BUILD-kernels"
  say "configuring and building kernels/standalone in $KBUILD"
  if ! bounded "$(limit 120 120)" cmake -S "$ROOT/kernels/standalone" -B "$KBUILD" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DCQK_KERNEL_ARCHITECTURES="$ARCH" \
      >"$LOGS/standalone-configure.log" 2>&1 ||
     ! bounded "$(limit 90 600)" cmake --build "$KBUILD" -j "$JOBS" >"$LOGS/standalone-build.log" 2>&1; then
    tail -30 "$LOGS/standalone-configure.log" "$LOGS/standalone-build.log" 2>/dev/null
    fail "the standalone kernels did not build either"
  else
    note "standalone build ok"
    BENCH="$KBUILD/cqk_kernel_bench"
  fi
else
  BENCH="$BUILD/cqk_kernel_bench"
fi
keep_logs

# --- GPU tests --------------------------------------------------------------------
if [[ "$MODE" == full && -x "$BENCH" ]]; then
  say "GPU tests: ctest -R 'Fused|Kernel'"
  if bounded "$(limit 60 200)" ctest --test-dir "$BUILD" -R 'Fused|Kernel' --output-on-failure --timeout 180 >"$LOGS/gpu-tests.log" 2>&1; then
    note "GPU tests pass: $(grep -E 'tests passed' "$LOGS/gpu-tests.log")"
  else
    cat "$LOGS/gpu-tests.log" | tail -60
    fail "GPU tests (log: $LOGS/gpu-tests.log)"
  fi
  grep -q "Skipped" "$LOGS/gpu-tests.log" && note "warning: some GPU tests were skipped: $(grep -c Skipped "$LOGS/gpu-tests.log")"
elif [[ -x "$BENCH" ]]; then
  say "GPU checks: cqk_kernel_bench --check"
  if bounded "$(limit 60 200)" "$BENCH" --check >"$LOGS/gpu-checks.log" 2>&1; then
    note "GPU checks pass ($(grep -c '^PASS' "$LOGS/gpu-checks.log") cases; no GoogleTest in standalone mode)"
  else
    grep -v '^PASS' "$LOGS/gpu-checks.log" | tail -60
    fail "GPU checks (log: $LOGS/gpu-checks.log)"
  fi
fi
if [[ "${CQK_GPU_SANITIZE:-0}" == 1 && -x "$BENCH" ]] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    if bounded 120 compute-sanitizer --tool "$tool" --error-exitcode 9 "$BENCH" --check --quick \
        >"$LOGS/sanitize-$tool.log" 2>&1; then
      note "compute-sanitizer $tool: clean"
    else
      tail -30 "$LOGS/sanitize-$tool.log"
      fail "compute-sanitizer $tool (log: $LOGS/sanitize-$tool.log)"
    fi
  done
fi

keep_logs

# --- benchmark --------------------------------------------------------------------
if [[ -x "$BENCH" ]] && (( $(left) > 60 )); then
  say "benchmark"
  if ! bounded $(( $(left) - 30 )) "$BENCH" --bench >"$LOGS/bench.md" 2>"$LOGS/bench.err"; then
    cat "$LOGS/bench.err"
    fail "benchmark"
  fi
  keep_logs
fi

# --- training throughput (full mode): issue 9's GPU targets ---------------------------
# The 150M model in bf16 with and without coupling, steps alternated in one
# process: MFU against the datasheet peak (target 45%) and the coupled/base
# step-time ratio (target 1.03). Written to train-bench.md.
if [[ "$MODE" == full && -x "$BUILD/cqk" ]] && (( $(left) > 180 )); then
  say "training benchmark: 150M bf16, coupled vs base"
  if bounded $(( $(left) - 60 )) "$BUILD/cqk" bench train configs/bench/150m-vanilla-affine.yaml \
      --compare configs/bench/150m-vanilla.yaml --warmup 3 --steps 10 >"$LOGS/train-bench.md" 2>"$LOGS/train-bench.err"; then
    note "training benchmark: $(grep -E '^step-time ratio' "$LOGS/train-bench.md" | head -1)"
    # Both configs' MFU lines: against the measured peak and against the datasheet.
    while read -r line; do note "  $line"; done < <(grep -E '^MFU|datasheet' "$LOGS/train-bench.md")
  else
    tail -5 "$LOGS/train-bench.err"
    fail "training benchmark (log: $LOGS/train-bench.err)"
  fi
  keep_logs
fi

# --- the whole suite, in the time left (full mode) -----------------------------------
if [[ "$MODE" == full ]]; then
  t=$(( $(left) - 15 ))
  if ((t > 30)); then
    say "whole suite (ctest, consumer label excluded, ${t}s)"
    if bounded "$t" ctest --test-dir "$BUILD" -j 8 -LE consumer --timeout 240 --output-on-failure \
        >"$LOGS/suite.log" 2>&1; then
      note "whole suite: $(grep -E 'tests passed' "$LOGS/suite.log")"
    else
      grep -E '^\s*[0-9]+ - |tests passed|\(Failed\)|\(Timeout\)' "$LOGS/suite.log" | tail -30
      if grep -q 'tests passed' "$LOGS/suite.log"; then
        fail "whole suite: $(grep -E 'tests passed' "$LOGS/suite.log") (log: $LOGS/suite.log)"
      else
        note "whole suite did not finish in the time left (log: $LOGS/suite.log)"
      fi
    fi
  else
    note "no time left for the whole suite"
  fi
fi

keep_logs

echo
echo "=== gpu_check summary ($MODE mode, $((SECONDS - START))s) ==="
for line in "${SUMMARY[@]}"; do echo "- $line"; done
[[ -f "$LOGS/bench.md" ]] && cat "$LOGS/bench.md"
echo
((STATUS == 0)) && echo "gpu_check: OK" || echo "gpu_check: FAILED"
exit "$STATUS"
