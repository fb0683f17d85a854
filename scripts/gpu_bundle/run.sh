#!/usr/bin/env bash
# The GPU check in one command, run from the bundle that scripts/gpu_bundle.sh
# builds (docs/KERNELS.md, "Checking a GPU machine"). Needs python3 with torch
# 2.11 (CUDA 13) and nothing else: no compiler, no network; it writes only to
# OUTDIR and a temp folder.
#
#   run.sh [OUTDIR]        OUTDIR: default $OUT, else a new folder under /tmp
#
# Stages, in order, each under its own time limit (LIMIT below); one that
# fails does not stop the others:
#   version      cqk --version (GPU, CUDA, cuDNN); every binary starts, every library resolves
#   tests        the GPU tests of cqk_tests (TESTS below)
#   kernels      the kernel table: cqk_kernel_bench --bench, head dim 64 and 128
#   train_bench  the 150M bf16 training benchmark, coupled against base, steps alternated
#   train        a short bf16 training run on CUDA whose loss must fall, paused and resumed
# Each ends PASSED, FAILED or SKIPPED with its reason. OUTDIR gets
# gpu_report.json, gpu_report.md and one log per stage (7 files: a device
# machine returns 8 at most). Exit status 0 when no stage failed.
#
# Test hook: CQK_GPU_CHECK_STUBS names a bash file sourced after the
# definitions below; it may redefine find_torch, stage_* and LIMIT
# (tests/gpu_bundle_test.sh).
set -uo pipefail

BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BIN="$BUNDLE/bin"
STAGES=(version tests kernels train_bench train)
# Seconds; they add up to 7 minutes, the budget of the whole check on an H200.
declare -A LIMIT=([version]=40 [tests]=120 [kernels]=90 [train_bench]=110 [train]=60)
TESTS='FusedCoupling.*:FusedAttention.*:Kinds/FusedAttentionModule.*:Runtime.OneCudaRuntimeIsLoaded:BuildInfo.*'

# Torch from the machine's python3: the folders of its libraries go on
# LD_LIBRARY_PATH after the bundle's (the binaries' RPATH names only
# ../lib). Sets SITE, GPUS, TORCH_VERSION; returns 1 with TORCH_ERROR set.
find_torch() {
  local info
  if ! command -v python3 >/dev/null; then TORCH_ERROR="no python3 on PATH"; return 1; fi
  if ! info="$(timeout 60 python3 -c 'import os, torch
print(os.path.dirname(os.path.dirname(torch.__file__)), torch.__version__, torch.cuda.device_count())' 2>"$WORK/torch.err")"; then
    TORCH_ERROR="python3 cannot import torch: $(tail -1 "$WORK/torch.err")"
    return 1
  fi
  read -r SITE TORCH_VERSION GPUS <<<"$info"
  local dirs="$SITE/torch/lib" d
  for d in "$SITE"/nvidia/*/lib; do [[ -d "$d" ]] && dirs+=":$d"; done
  export LD_LIBRARY_PATH="$BUNDLE/lib:$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# A stage runs in a child bash with STAGE_DIR (its files) set; exit 0 is
# PASSED, `skip REASON` SKIPPED, `fail REASON` or any other exit FAILED.
skip() { echo "$*" >"$STAGE_DIR/reason"; exit 77; }
fail() { echo "$*" >"$STAGE_DIR/reason"; exit 1; }

stage_version() {
  "$BIN/cqk" --version | tee "$STAGE_DIR/version.txt" || fail "cqk --version failed"
  "$BIN/cqk_tests" --gtest_list_tests >/dev/null || fail "cqk_tests does not start"
  { "$BIN/cqk_kernel_bench" 2>&1 || true; } | grep -q '^usage:' || fail "cqk_kernel_bench does not start"
  # Where every library comes from: the bundle, torch's wheels, or the system (the C and C++ runtimes).
  if command -v ldd >/dev/null; then
    ldd "$BIN"/* | awk '$2 == "=>" {print $1, $3}' | sort -u >"$STAGE_DIR/libraries.txt"
    grep -q ' not$' "$STAGE_DIR/libraries.txt" &&
      fail "libraries not found: $(awk '$2 == "not" {print $1}' "$STAGE_DIR/libraries.txt" | tr '\n' ' ')"
  fi
  local built
  built="$(sed -n 's/^libtorch //p' "$STAGE_DIR/version.txt")"
  [[ "$TORCH_VERSION" == "$built"* ]] || fail "python3's torch is $TORCH_VERSION, the bundle was built against $built"
  ((GPUS > 0)) || return 0
  grep -q '^gpu 0: ' "$STAGE_DIR/version.txt" || fail "torch sees $GPUS GPUs, cqk none"
  # The kernels are machine code for the bundle's architectures only (scripts/gpu_bundle.sh).
  local arch kernels
  arch="$(sed -n 's/^gpu 0: .*(sm_\([0-9]*\),.*/\1/p' "$STAGE_DIR/version.txt")"
  kernels="$(sed -n 's/^cuda kernels: //p' "$STAGE_DIR/version.txt")"
  [[ "$kernels" =~ [^0-9]$arch([^0-9]|$) ]] || fail "the GPU is sm_$arch, the kernels are $kernels"
}

stage_tests() {
  "$BIN/cqk_tests" --gtest_filter="$TESTS" --gtest_output="json:$STAGE_DIR/tests.json"
  local rc=$?
  ((rc == 0)) || fail "GPU tests failed (exit $rc)"
  local skipped
  skipped="$(grep -c '"result": "SKIPPED"' "$STAGE_DIR/tests.json")"
  ((skipped == 0)) || fail "$skipped tests skipped with a GPU visible"
}

stage_kernels() {
  local dim
  for dim in 64 128; do
    "$BIN/cqk_kernel_bench" --bench --json --dtypes bf16 --times 512,1024,2048 --dim "$dim" \
      | tee -a "$STAGE_DIR/rows.jsonl" || fail "cqk_kernel_bench --bench --dim $dim failed"
  done
  if grep -q '"fused_applies": false' "$STAGE_DIR/rows.jsonl"; then fail "the fused coupling did not apply"; fi
  return 0
}

stage_train_bench() {
  (cd "$BUNDLE" && "$BIN/cqk" bench train configs/bench/150m-vanilla-affine.yaml \
    --compare configs/bench/150m-vanilla.yaml --set train.device=cuda --set train.dtype=bf16 \
    --warmup 3 --steps 10 --json) | tee "$STAGE_DIR/bench.json" || fail "cqk bench train failed"
}

# The embedded default config (tiny model, generated recall task, 300 steps):
# 150 steps, a checkpoint, then the rest resumed from it in a new process.
stage_train() {
  local run="$STAGE_DIR/run"
  "$BIN/cqk" train --set train.device=cuda --set train.dtype=bf16 --run-dir "$run" --max-steps 150 ||
    fail "cqk train (first 150 steps) failed"
  "$BIN/cqk" train --resume "$run" || fail "cqk train --resume failed"
  grep -q 'resumed from .* at step 150' "$STAGE_DIR/log" || fail "the second run did not resume at step 150"
  local first last
  first="$(grep -o '"loss":[^,}]*' "$run/metrics.jsonl" | head -1 | cut -d: -f2)"
  last="$(grep -o '"loss":[^,}]*' "$run/metrics.jsonl" | tail -1 | cut -d: -f2)"
  awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < 0.8 * f) }' || fail "loss did not fall: $first -> $last"
}

[[ -n "${CQK_GPU_CHECK_STUBS:-}" ]] && source "$CQK_GPU_CHECK_STUBS"
export -f skip fail "${STAGES[@]/#/stage_}"
export BIN BUNDLE TESTS

START=$SECONDS
WORK="$(mktemp -d "${TMPDIR:-/tmp}/cqk-gpu-check.XXXXXX")" || exit 1
trap 'rm -rf "$WORK"' EXIT
OUTDIR="${1:-${OUT:-}}"
[[ -n "$OUTDIR" ]] || OUTDIR="$(mktemp -d /tmp/cqk-gpu-report.XXXXXX)"
mkdir -p "$OUTDIR" || exit 1

TORCH_ERROR="" SITE="" TORCH_VERSION="" GPUS=0
find_torch
export SITE TORCH_VERSION GPUS
echo "gpu check: bundle $BUNDLE ($(head -1 "$BUNDLE/BUILD_INFO" 2>/dev/null)); torch ${TORCH_VERSION:-none} from" \
  "${SITE:-nowhere}; $GPUS GPUs; report to $OUTDIR"

# stages.tsv: name, status, seconds, limit, reason; report.py reads it with the stages' files.
for name in "${STAGES[@]}"; do
  dir="$WORK/$name"
  mkdir -p "$dir"
  t0=$SECONDS
  if [[ -n "$TORCH_ERROR" ]]; then
    status=FAILED reason="$TORCH_ERROR"
  elif [[ "$name" != version ]] && ((GPUS == 0)); then
    status=SKIPPED reason="no CUDA device"
  else
    echo "gpu check: $name (at most ${LIMIT[$name]}s)"
    STAGE_DIR="$dir" timeout -k 5 "${LIMIT[$name]}" bash -o pipefail -c "stage_$name" >"$dir/log" 2>&1
    rc=$?
    reason="$(cat "$dir/reason" 2>/dev/null)"
    if ((rc == 124 || (rc == 137 && SECONDS - t0 >= LIMIT[$name]))); then
      status=FAILED reason="timeout: still running after ${LIMIT[$name]}s"
    elif ((rc == 0)); then
      status=PASSED
    elif ((rc == 77)); then
      status=SKIPPED
    else
      status=FAILED reason="${reason:-exit $rc}"
    fi
    cp "$dir/log" "$OUTDIR/$name.log"
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" $((SECONDS - t0)) "${LIMIT[$name]}" "${reason//$'\t'/ }" \
    >>"$WORK/stages.tsv"
  printf 'gpu check: %-12s %-7s %4ss  %s\n' "$name" "$status" $((SECONDS - t0)) "$reason"
done

if ! python3 "$BUNDLE/report.py" "$WORK" "$OUTDIR" "$((SECONDS - START))"; then
  echo "gpu check: report.py failed; stage logs are in $OUTDIR" >&2
  exit 2
fi
echo "gpu check: $((SECONDS - START))s; $OUTDIR/gpu_report.md:"
cat "$OUTDIR/gpu_report.md"
! grep -q $'\tFAILED\t' "$WORK/stages.tsv"
