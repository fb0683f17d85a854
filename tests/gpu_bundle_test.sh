#!/usr/bin/env bash
# The GPU check's runner (scripts/gpu_bundle/run.sh) on the CPU, its stages
# stubbed through CQK_GPU_CHECK_STUBS: each stage gets its status and reason,
# one past its limit is FAILED (timeout) with its processes ended, failures do
# not stop the later stages, the report parses and at most 8 files come out;
# without a GPU every stage after the first is SKIPPED.
#   tests/gpu_bundle_test.sh scripts/gpu_bundle
set -euo pipefail
SRC="$(cd "$1" && pwd)"
export STUB_TMP="$(mktemp -d)"
trap 'rm -rf "$STUB_TMP"' EXIT
mkdir "$STUB_TMP/bundle"
cp "$SRC/run.sh" "$SRC/report.py" "$STUB_TMP/bundle/"
echo "commit stub" >"$STUB_TMP/bundle/BUILD_INFO"
cat >"$STUB_TMP/stubs.sh" <<'EOF'
find_torch() { SITE=/nowhere TORCH_VERSION=2.11.0 GPUS=$STUB_GPUS; }
LIMIT[kernels]=2
stage_version() { printf 'cqk 0.1.0\nlibtorch 2.11.0\ngpu 0: Stub GPU\n' >"$STAGE_DIR/version.txt"; }
stage_tests() { skip "stubbed out"; }
stage_kernels() { sleep 120 & echo $! >"$STUB_TMP/sleeper.pid"; wait; }
stage_train_bench() { fail "stub failure"; }
stage_train() { exit 3; }
EOF
export CQK_GPU_CHECK_STUBS="$STUB_TMP/stubs.sh"

check() {  # OUTDIR EXPECTED_EXIT ACTUAL_EXIT PYTHON_ASSERTIONS
  [[ "$2" == "$3" ]] || { echo "run.sh exited $3, expected $2" >&2; exit 1; }
  local files
  files="$(ls "$1")"
  (($(wc -l <<<"$files") <= 8)) || { echo "more than 8 files in $1: $files" >&2; exit 1; }
  ! grep -v '^[A-Za-z0-9._-]*$' <<<"$files" || { echo "file names a device machine cannot return" >&2; exit 1; }
  grep -q '^| version: ' "$1/gpu_report.md"
  python3 - "$1/gpu_report.json" "$4" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
stages = {s["name"]: s for s in report["stages"]}
assert list(stages) == ["version", "tests", "kernels", "train_bench", "train"], list(stages)
status = {name: (s["status"], s["reason"]) for name, s in stages.items()}
exec(sys.argv[2])
EOF
}

# A GPU: every stage runs.
start=$SECONDS
rc=0; STUB_GPUS=1 "$STUB_TMP/bundle/run.sh" "$STUB_TMP/gpu" >"$STUB_TMP/gpu.out" 2>&1 || rc=$?
cat "$STUB_TMP/gpu.out"
check "$STUB_TMP/gpu" 1 "$rc" '
assert status["version"] == ("PASSED", ""), status
assert status["tests"] == ("SKIPPED", "stubbed out"), status
assert status["kernels"][0] == "FAILED" and status["kernels"][1].startswith("timeout"), status
assert 2 <= stages["kernels"]["seconds"] <= 8, stages["kernels"]
assert status["train_bench"] == ("FAILED", "stub failure"), status
assert status["train"] == ("FAILED", "exit 3"), status
assert stages["version"]["figures"]["gpu 0"] == "Stub GPU" and report["machine"]["gpu"] == "Stub GPU"
assert report["passed"] is False
'
((SECONDS - start < 30)) || { echo "the stage past its limit held run.sh for $((SECONDS - start))s" >&2; exit 1; }
# A killed process may linger a moment, or as a zombie until init reaps it.
alive() { [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" =~ ^[^Z]$ ]]; }
for _ in 1 2 3 4 5; do alive "$(cat "$STUB_TMP/sleeper.pid")" && sleep 0.2; done
! alive "$(cat "$STUB_TMP/sleeper.pid")" || { echo "the timed-out stage's process lives on" >&2; exit 1; }
grep -q 'kernels *FAILED' "$STUB_TMP/gpu.out"

# No GPU: the first stage only.
rc=0; STUB_GPUS=0 "$STUB_TMP/bundle/run.sh" "$STUB_TMP/cpu" >"$STUB_TMP/cpu.out" 2>&1 || rc=$?
check "$STUB_TMP/cpu" 0 "$rc" '
assert status["version"] == ("PASSED", ""), status
for name in ("tests", "kernels", "train_bench", "train"):
    assert status[name] == ("SKIPPED", "no CUDA device"), status
assert report["passed"] is True
'
echo "gpu_bundle_test: ok"
