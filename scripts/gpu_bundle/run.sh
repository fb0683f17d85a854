#!/usr/bin/env bash
# The GPU check, run from the bundle that scripts/gpu_bundle.sh builds
# (docs/KERNELS.md, "Checking a GPU machine"). Needs a python with torch 2.11
# (CUDA 13) and nothing else: no compiler, no network; it writes only to
# OUTDIR and a temp folder.
#
#   run.sh [OUTDIR [STAGE...]]   OUTDIR: default $OUT, else a new folder under /tmp;
#                                STAGE...: only these (default: all but sanitize)
#
# Stages, each under its own time limit (LIMIT below); one that fails does not
# stop the others:
#   version      cqk --version (GPU, CUDA, cuDNN); every binary starts, every library resolves
#   tests        the GPU tests, one cqk_tests process per group (TEST_GROUPS)
#   kernels      the kernel table: cqk_kernel_bench, one process per path (KERNEL_PATHS) and head dim
#   train_bench  the 150M bf16 training benchmark: the base alone, then coupled against base
#   train        50 bf16 training steps at head dim 64, paused and resumed, against the fused coupling off
#   sanitize     (named only) compute-sanitizer memcheck and racecheck of cqk_kernel_bench --check --quick
# Each ends PASSED, FAILED or SKIPPED with its reason, or INTERRUPTED. Work
# that a CUDA fault could spoil (an illegal address is sticky for the rest of
# its process) runs as parts, each in processes of its own, so one fault
# costs one part.
#
# OUTDIR gets gpu_report.json and gpu_report.md, rewritten whole at the start
# (every stage PENDING), as each stage starts and ends, and on SIGTERM or
# SIGINT, so a run cut short still leaves a valid report; and one log per stage
# run (at most 8 files: a device machine returns 8 at most).
# Exit status: 0 no stage failed; 1 a stage failed; 2 usage, or report.py
# failed; 3 no torch, or not the bundle's torch (nothing run), 4 the version
# stage failed: the bundle's binaries do not run here, or not on this GPU
# (nothing else run); on 3 and 4 the caller can fall back to
# scripts/gpu_check.sh --standalone, which builds on the machine; 128+N killed
# by signal N.
#
# Test hook: CQK_GPU_CHECK_STUBS names a bash file sourced after the
# definitions below; it may redefine find_torch, stage_*, LIMIT and BIN
# (tests/gpu_bundle_test.sh).
set -uo pipefail

BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BIN="$BUNDLE/bin"
STAGES=(version tests kernels train_bench train)
# Seconds. The default stages' add up to 300, so that the first device call
# fits in timeout_s=360 and a second one in the rest of 15 minutes of device
# time; sanitize is for that second call.
declare -A LIMIT=([version]=20 [tests]=60 [kernels]=90 [train_bench]=80 [train]=50 [sanitize]=240)
TEST_GROUPS='FusedCoupling.* FusedRope.* SdpaBackend.* Runtime.OneCudaRuntimeIsLoaded:BuildInfo.*'
KERNEL_PATHS='sdpa sdpa-cudnn rope-sdpa fused-coupling-rope fused-coupling aten-coupling'
# The train stage's fused and unfused runs must end within this relative
# difference of their last training loss. Both see the same batches from the
# same initial weights; they differ in rounding only (bf16: relative 2^-8,
# about 0.4%, per element, averaged in the loss over a batch's 2,048 tokens),
# which should move the loss by a fraction of a percent in 50 steps (the
# report gives the difference). A wrong gradient in the kernels moves it
# further; the GPU tests are the finer check.
LOSS_TOLERANCE=0.02

# Torch from the first of python3, $CQK_PYTHON and the H200 image's own venv
# whose torch imports and is the bundle's version (TORCH_NEEDED; any, when the
# bundle does not say): the folders of its libraries go on LD_LIBRARY_PATH
# after the bundle's (the binaries' RPATH names only ../lib). Sets
# TORCH_PYTHON, SITE, TORCH_VERSION, GPUS; returns 1 with TORCH_ERROR set.
find_torch() {
  local py info site version gpus tried=""
  for py in python3 ${CQK_PYTHON:+"$CQK_PYTHON"} /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null || continue
    if ! info="$(timeout 30 "$py" -c 'import os, torch
print(os.path.dirname(os.path.dirname(torch.__file__)), torch.__version__, torch.cuda.device_count())' 2>"$WORK/torch.err")"; then
      tried+="${tried:+; }$py: $(tail -1 "$WORK/torch.err")"
      continue
    fi
    read -r site version gpus <<<"$info"
    if [[ -n "${TORCH_NEEDED:-}" && "$version" != "$TORCH_NEEDED" ]]; then
      tried+="${tried:+; }$py: torch $version, the bundle needs $TORCH_NEEDED"
      continue
    fi
    TORCH_PYTHON="$(command -v "$py")" SITE="$site" TORCH_VERSION="$version" GPUS="$gpus"
    local dirs="$SITE/torch/lib" d
    for d in "$SITE"/nvidia/*/lib; do [[ -d "$d" ]] && dirs+=":$d"; done
    export LD_LIBRARY_PATH="$BUNDLE/lib:$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    return 0
  done
  TORCH_ERROR="no python with the bundle's torch (${tried:-none found})"
  return 1
}

# A stage runs in a child bash with STAGE_DIR (its files), STAGE_LOG and STAGE_LIMIT set;
# exit 0 is PASSED, `skip REASON` SKIPPED, `fail REASON` or any other exit FAILED.
skip() { echo "$*" >"$STAGE_DIR/reason"; exit 77; }
fail() { echo "$*" >"$STAGE_DIR/reason"; exit 1; }

# One part of a stage (a test group, a timed path, a run) in processes of its
# own. It may use the stage's time left but RESERVE seconds for the parts
# after it and 5 for the stage's own checks, so that it ends before the
# stage does. Its output goes to the stage's log (the stage's stdout), and
# is copied to $STAGE_DIR/part.out; its name, status, seconds and reason to
# $STAGE_DIR/parts.tsv. Returns its exit status.
part() {  # NAME RESERVE COMMAND...
  local name=$1 limit=$((STAGE_LIMIT - SECONDS - 5 - $2)) t0=$SECONDS rc status=PASSED reason="" logged
  shift 2
  echo "== $name (at most ${limit}s): $*"
  logged="$(stat -c %s "$STAGE_LOG")"
  if ((limit < 1)); then
    rc=1 reason="no time left in the stage"
    : >"$STAGE_DIR/part.out"
  else
    # --foreground: the command stays in the stage's process group, which run.sh
    # ends as one. No pipe: a child it leaves behind cannot hold the stage up.
    timeout --foreground -k 2 "$limit" "$@" 2>&1
    rc=$?
    tail -c +$((logged + 1)) "$STAGE_LOG" >"$STAGE_DIR/part.out"
    if ((rc != 0 && SECONDS - t0 >= limit)); then
      reason="timeout: still running after ${limit}s"
    elif ((rc != 0)); then  # and the first line that says why: a CUDA error first
      reason="exit $rc$({ grep -m1 'CUDA error' "$STAGE_DIR/part.out" ||
        grep -m1 -E 'Failure|FAILED|ERROR|Error|error:|terminate|fault' "$STAGE_DIR/part.out"; } | cut -c1-200 | sed 's/^/: /')"
    fi
  fi
  ((rc == 0)) || status=FAILED
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" $((SECONDS - t0)) "${reason//[$'\t\n']/ }" >>"$STAGE_DIR/parts.tsv"
  return "$rc"
}

# Fails the stage, naming them, when any of its parts failed.
check_parts() {  # WHAT
  local failed
  failed="$(awk -F'\t' '$2 == "FAILED" {printf "%s%s", sep, $1; sep = "; "}' "$STAGE_DIR/parts.tsv")"
  [[ -z "$failed" ]] || fail "$1: $failed"
}

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
  [[ "$TORCH_VERSION" == "$built"* ]] || fail "$TORCH_PYTHON's torch is $TORCH_VERSION, cqk was built against $built"
  ((GPUS > 0)) || return 0
  grep -q '^gpu 0: ' "$STAGE_DIR/version.txt" || fail "torch sees $GPUS GPUs, cqk none"
  # The kernels are machine code for the bundle's architectures only (scripts/gpu_bundle.sh).
  local arch kernels
  arch="$(sed -n 's/^gpu 0: .*(sm_\([0-9]*\),.*/\1/p' "$STAGE_DIR/version.txt")"
  kernels="$(sed -n 's/^cuda kernels: //p' "$STAGE_DIR/version.txt")"
  [[ "$kernels" =~ [^0-9]$arch([^0-9]|$) ]] || fail "the GPU is sm_$arch, the kernels are $kernels"
}

stage_tests() {
  local groups i count empty=()
  read -ra groups <<<"$TEST_GROUPS"
  for i in "${!groups[@]}"; do
    part "${groups[i]}" $((5 * (${#groups[@]} - i - 1))) \
      "$BIN/cqk_tests" --gtest_filter="${groups[i]}" --gtest_output="json:$STAGE_DIR/tests-$i.json"
    count="$(grep -m1 -o '"tests": [0-9]*' "$STAGE_DIR/tests-$i.json" 2>/dev/null)"
    [[ "$count" == '"tests": 0' ]] && empty+=("${groups[i]}")
  done
  check_parts "GPU test groups failed"
  ((${#empty[@]} == 0)) || fail "no tests match ${empty[*]}"
  local skipped
  skipped="$(cat "$STAGE_DIR"/tests-*.json | grep -c '"result": "SKIPPED"')"
  ((skipped == 0)) || fail "$skipped tests skipped with a GPU visible"
}

stage_kernels() {
  local paths dim path n=0
  read -ra paths <<<"$KERNEL_PATHS"
  for dim in 64 128; do
    for path in "${paths[@]}"; do
      n=$((n + 1))
      part "$path, dim $dim" $((5 * (2 * ${#paths[@]} - n))) "$BIN/cqk_kernel_bench" --bench --json \
        --path "$path" --dtypes bf16 --times 512,1024,2048 --batch 16 --iters 10 --dim "$dim"
      grep '^{' "$STAGE_DIR/part.out" >>"$STAGE_DIR/rows.jsonl"
    done
  done
  check_parts "kernel paths failed"
  if grep '"path": "fused-coupling",' "$STAGE_DIR/rows.jsonl" | grep -q '"applies": false'; then
    fail "the fused coupling did not apply"
  fi
}

# The base alone (its MFU), then the coupled model against it, steps
# alternated in one process; that pair again with the fused coupling off if
# it fails, so that the figures come back all the same.
stage_train_bench() {
  cd "$BUNDLE" || fail "no bundle at $BUNDLE"
  local opts=(--set train.device=cuda --set train.dtype=bf16 --warmup 3 --steps 10 --json)
  local pair=("$BIN/cqk" bench train configs/bench/150m-vanilla-affine.yaml --compare configs/bench/150m-vanilla.yaml
              "${opts[@]}")
  part "base alone" 45 "$BIN/cqk" bench train configs/bench/150m-vanilla.yaml "${opts[@]}"
  grep '^{' "$STAGE_DIR/part.out" >"$STAGE_DIR/base.json"
  if ! part "coupled against base" 20 "${pair[@]}"; then
    touch "$STAGE_DIR/fused_off"
    part "coupled against base, CQK_FUSED_COUPLING=0" 0 env CQK_FUSED_COUPLING=0 "${pair[@]}"
  fi
  grep '^{' "$STAGE_DIR/part.out" >"$STAGE_DIR/bench.json"
  check_parts "cqk bench train failed"
}

last_loss() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" 2>/dev/null | tail -1 | cut -d: -f2; }

# The embedded default config at head dim 64 (4 heads of 64), where the fused
# kernels apply: 50 steps paused at 25 and resumed in a new process, and the
# same 50 steps with the fused coupling off; the two last losses must agree.
stage_train() {
  local train=("$BIN/cqk" train --set model.width=256 --set model.heads=4 --set train.steps=50
               --set train.device=cuda --set train.dtype=bf16)
  part "fused, steps 1-25" 20 "${train[@]}" --run-dir "$STAGE_DIR/fused" --max-steps 25
  part "fused, resumed" 10 "$BIN/cqk" train --resume "$STAGE_DIR/fused"
  cp "$STAGE_DIR/part.out" "$STAGE_DIR/resume.out"
  part "fused coupling off" 0 env CQK_FUSED_COUPLING=0 "${train[@]}" --run-dir "$STAGE_DIR/unfused"
  check_parts "cqk train failed"
  grep -q 'resumed from .* at step 25' "$STAGE_DIR/resume.out" || fail "the second run did not resume at step 25"
  local fused unfused
  fused="$(last_loss "$STAGE_DIR/fused")" unfused="$(last_loss "$STAGE_DIR/unfused")"
  awk -v a="$fused" -v b="$unfused" -v t="$LOSS_TOLERANCE" 'BEGIN { d = a - b; exit !(a != "" && b != "" && d * d <= t * t * b * b) }' ||
    fail "last loss with the fused coupling $fused, without $unfused: more than $LOSS_TOLERANCE apart (relative)"
}

stage_sanitize() {
  local sanitizer
  sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  [[ -x "$sanitizer" ]] || skip "no compute-sanitizer on PATH or in /usr/local/cuda/bin"
  local check=("$BIN/cqk_kernel_bench" --check --quick)
  # Torch's caching allocator carves many tensors from one cudaMalloc, inside
  # which memcheck sees no bounds: without it each tensor is an allocation.
  part memcheck $(((STAGE_LIMIT - SECONDS) / 2)) env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    "$sanitizer" --tool memcheck --error-exitcode 9 "${check[@]}"
  grep -q 'Device not supported' "$STAGE_DIR/part.out" && skip "compute-sanitizer does not support this device"
  part racecheck 0 "$sanitizer" --tool racecheck --error-exitcode 9 "${check[@]}"
  check_parts "compute-sanitizer parts failed (errors found, or a timeout: see each part)"
}

[[ -n "${CQK_GPU_CHECK_STUBS:-}" ]] && source "$CQK_GPU_CHECK_STUBS"
export -f skip fail part check_parts last_loss
for name in "${!LIMIT[@]}"; do export -f "stage_$name"; done
export BIN BUNDLE TEST_GROUPS KERNEL_PATHS LOSS_TOLERANCE

OUTDIR="${1:-${OUT:-}}"
SELECTED=("${@:2}")
((${#SELECTED[@]})) || SELECTED=("${STAGES[@]}")
for name in "${SELECTED[@]}"; do
  [[ -n "${LIMIT[$name]:-}" ]] || { echo "usage: run.sh [OUTDIR [STAGE...]]; stages: ${!LIMIT[*]}" >&2; exit 2; }
done
START=$SECONDS
WORK="$(mktemp -d "${TMPDIR:-/tmp}/cqk-gpu-check.XXXXXX")" || exit 2
trap 'rm -rf "$WORK"' EXIT
[[ -n "$OUTDIR" ]] || OUTDIR="$(mktemp -d /tmp/cqk-gpu-report.XXXXXX)"
mkdir -p "$OUTDIR" || exit 2
OUTDIR="$(cd "$OUTDIR" && pwd)"  # stages change directory (train_bench runs in the bundle)

declare -A STATUS SECS REASON
for name in "${SELECTED[@]}"; do STATUS[$name]=PENDING SECS[$name]=0 REASON[$name]=""; done
TORCH_PYTHON="" TORCH_ERROR="" SITE="" TORCH_VERSION="" GPUS=0 RUNNING="" STAGE_PID=""
TORCH_NEEDED="$(sed -n 's/^needs torch \([^,]*\).*/\1/p' "$BUNDLE/BUILD_INFO" 2>/dev/null)"
export TORCH_PYTHON TORCH_ERROR SITE TORCH_VERSION TORCH_NEEDED GPUS

# stages.tsv (name, status, seconds, limit, reason), then report.py, which
# reads it with the stages' files and replaces both report files whole.
report() {  # STATE: running | finished | interrupted
  local name
  for name in "${SELECTED[@]}"; do
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "${STATUS[$name]}" "${SECS[$name]}" "${LIMIT[$name]}" \
      "${REASON[$name]//[$'\t\n']/ }"
  done >"$WORK/stages.tsv"
  "${TORCH_PYTHON:-python3}" "$BUNDLE/report.py" "$WORK" "$OUTDIR" $((SECONDS - START)) "$1"
}

# SIGTERM or SIGINT: end the running stage's processes, mark it INTERRUPTED
# and write the report before going.
on_signal() {  # SIGNAL
  trap - TERM INT
  if [[ -n "$RUNNING" ]]; then
    [[ -n "$STAGE_PID" ]] && kill -TERM -- -"$STAGE_PID" 2>/dev/null
    STATUS[$RUNNING]=INTERRUPTED SECS[$RUNNING]=$((SECONDS - STAGE_START)) REASON[$RUNNING]="run.sh got SIG$1"
  fi
  report interrupted
  exit $((128 + $(kill -l "$1")))
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

run_stage() {  # NAME: runs it under its limit, sets its STATUS, SECS and REASON
  local name=$1 rc reason
  if ((GPUS == 0)) && [[ "$name" != version ]]; then
    STATUS[$name]=SKIPPED REASON[$name]="no CUDA device"
    return
  fi
  mkdir -p "$WORK/$name"
  STATUS[$name]=RUNNING RUNNING=$name STAGE_START=$SECONDS
  report running
  echo "gpu check: $name (at most ${LIMIT[$name]}s)"
  # In the background, so that `wait` lets the signal traps run at once.
  STAGE_DIR="$WORK/$name" STAGE_LOG="$OUTDIR/$name.log" STAGE_LIMIT="${LIMIT[$name]}" timeout -k 5 "${LIMIT[$name]}" \
    bash -o pipefail -c "stage_$name" >"$OUTDIR/$name.log" 2>&1 &
  STAGE_PID=$!
  wait "$STAGE_PID"
  rc=$?
  kill -TERM -- -"$STAGE_PID" 2>/dev/null  # what its parts left behind: timeout made the stage a process group
  RUNNING="" STAGE_PID=""
  SECS[$name]=$((SECONDS - STAGE_START))
  reason="$(cat "$WORK/$name/reason" 2>/dev/null)"
  if ((rc == 124 || (rc == 137 && SECS[$name] >= LIMIT[$name]))); then
    STATUS[$name]=FAILED REASON[$name]="timeout: still running after ${LIMIT[$name]}s"
  elif ((rc == 0)); then
    STATUS[$name]=PASSED
  elif ((rc == 77)); then
    STATUS[$name]=SKIPPED REASON[$name]="$reason"
  else
    STATUS[$name]=FAILED REASON[$name]="${reason:-exit $rc}"
  fi
}

report running
find_torch
if [[ -z "$TORCH_ERROR" && -n "$TORCH_NEEDED" && "$TORCH_VERSION" != "$TORCH_NEEDED" ]]; then
  TORCH_ERROR="$TORCH_PYTHON's torch is $TORCH_VERSION, the bundle needs $TORCH_NEEDED"
fi
echo "gpu check: bundle $BUNDLE ($(head -1 "$BUNDLE/BUILD_INFO" 2>/dev/null)); torch ${TORCH_VERSION:-none} from" \
  "${TORCH_PYTHON:-nowhere}; $GPUS GPUs; stages ${SELECTED[*]}; report to $OUTDIR"
if [[ -n "$TORCH_ERROR" ]]; then
  for name in "${SELECTED[@]}"; do STATUS[$name]=SKIPPED REASON[$name]="not run (torch)"; done
  report finished
  echo "gpu check: $TORCH_ERROR; exit 3" >&2
  exit 3
fi

for name in "${SELECTED[@]}"; do
  run_stage "$name"
  printf 'gpu check: %-12s %-7s %4ss  %s\n' "$name" "${STATUS[$name]}" "${SECS[$name]}" "${REASON[$name]}"
  report running
  # Binaries that do not start, or kernels for another GPU: every later stage would fail in seconds,
  # and the time is better spent building on the machine. A slow first start is not that: go on.
  if [[ "$name" == version && "${STATUS[version]}" == FAILED && "${REASON[version]}" != timeout:* ]]; then
    for later in "${SELECTED[@]}"; do
      [[ "${STATUS[$later]}" != PENDING ]] || STATUS[$later]=SKIPPED REASON[$later]="not run: the version stage failed"
    done
    report finished
    echo "gpu check: the bundle does not run here (${REASON[version]}); exit 4" >&2
    exit 4
  fi
done
report finished || { echo "gpu check: report.py failed; stage logs are in $OUTDIR" >&2; exit 2; }
echo "gpu check: $((SECONDS - START))s; $OUTDIR/gpu_report.md:"
cat "$OUTDIR/gpu_report.md"
for name in "${SELECTED[@]}"; do [[ "${STATUS[$name]}" != FAILED ]] || exit 1; done
