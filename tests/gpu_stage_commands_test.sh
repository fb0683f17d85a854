#!/usr/bin/env bash
# The GPU check's default stages' commands (scripts/gpu_bundle/run.sh)
# rehearsed on the CPU with the real binaries, so that a renamed flag, config
# key, kernel path or test group fails here and not in device time. run.sh is
# told it has a GPU; each part runs, through run.sh's own part(), its real
# command, except that `cqk train` runs on the CPU in fp32 at width 64, so the
# train stage trains, pauses, resumes and runs its loss comparison (on the CPU both runs compute the
# same: the wiring is what is checked). Every other command must get past
# its argument and config checks to the line that asks for the GPU, and each
# pattern of a test group must match a test. The kernel table must have a
# part for every path the kernel bench knows, at both head dims. (sanitize,
# which needs compute-sanitizer, is not rehearsed.)
#
#   tests/gpu_stage_commands_test.sh SCRIPTS_GPU_BUNDLE CONFIGS CQK CQK_TESTS CQK_KERNEL_BENCH
set -euo pipefail
# A build without CUDA has no cqk_kernel_bench (CMake passes an empty path).
[[ -n "${5:-}" ]] || { echo "no cqk_kernel_bench: this build has no CUDA (CQK_CUDA=OFF or no nvcc)"; exit 77; }
SRC="$(cd "$1" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
BUNDLE="$WORK/bundle"
mkdir -p "$BUNDLE/bin"
cp "$SRC/run.sh" "$SRC/report.py" "$BUNDLE/"
ln -s "$(cd "$2" && pwd)" "$BUNDLE/configs"
ln -s "$(realpath "$3")" "$BUNDLE/bin/cqk"
ln -s "$(realpath "$4")" "$BUNDLE/bin/cqk_tests"
ln -s "$(realpath "$5")" "$BUNDLE/bin/cqk_kernel_bench"

cat >"$WORK/rehearsal.sh" <<'EOF'
find_torch() { TORCH_PYTHON=python3 SITE=/nowhere TORCH_VERSION=2.11.0 GPUS=1; }
for name in "${!LIMIT[@]}"; do LIMIT[$name]=300; done  # a CPU trains slower than the limits allow a GPU
# The real version stage, as on a machine without a GPU.
eval "version_without_gpu() $(declare -f stage_version | tail -n +2)"
export -f version_without_gpu
stage_version() { GPUS=0 version_without_gpu; }
# run.sh's own part(), each command run through rehearse.
eval "run_part() $(declare -f part | tail -n +2)"
part() { run_part "$1" "$2" bash -c 'rehearse "$@"' rehearse "${@:3}"; }
rehearse() {  # COMMAND...: its exit status, 0 when it ends at the line that asks for a GPU
  local command=() word filter="" pattern rc
  for word; do
    if [[ " $* " != *" bench train "* ]]; then  # bench train stops at its GPU check
      word="${word/#train.device=cuda/train.device=cpu}"
      word="${word/#train.dtype=bf16/train.dtype=fp32}"  # a CPU emulates bf16, several times slower
      word="${word/#model.width=256/model.width=64}"       # 4 heads of 16: a CPU trains it in seconds
    fi
    [[ "$word" != --gtest_filter=* ]] || filter="${word#--gtest_filter=}"
    command+=("$word")
  done
  # A group joins patterns with ':': each must match a test, not only the whole.
  for pattern in ${filter//:/ }; do
    "$BIN/cqk_tests" --gtest_list_tests --gtest_filter="$pattern" | grep -q '^  ' ||
      { echo "error: the test pattern $pattern matches no test"; return 1; }
  done
  "${command[@]}" >"$STAGE_DIR/rehearsal.out" 2>&1
  rc=$?
  cat "$STAGE_DIR/rehearsal.out"
  grep -qxE 'cqk: error: train.device: cuda requested but no GPU is visible|cqk_kernel_bench: no CUDA device' \
    "$STAGE_DIR/rehearsal.out" && rc=0
  return "$rc"
}
export -f run_part rehearse
EOF
export CQK_GPU_CHECK_STUBS="$WORK/rehearsal.sh" CQK_NUM_THREADS=2

rc=0
bash "$BUNDLE/run.sh" "$WORK/out" >"$WORK/run.log" 2>&1 || rc=$?
kernel_paths="$({ "$5" 2>&1 || true; } | sed -n 's/^paths: //p')"  # its usage line
python3 - "$WORK/out/gpu_report.json" "$WORK/run.log" "$rc" "$kernel_paths" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
stages = {s["name"]: s for s in report["stages"]}
failed_parts = [f'{name}: {p["name"]}: {p["reason"]}' for name, s in stages.items() for p in s["parts"]
                if p["status"] != "PASSED"]
problems = [f"a command does not run as run.sh calls it: {p}" for p in failed_parts]
expected = {
    "version": ("PASSED", ""),
    # Every group matched tests (else "no tests match"), and they ran, as skipped on the CPU.
    "tests": ("FAILED", None),
    "kernels": ("PASSED", ""),
    "train_bench": ("PASSED", ""),
    "train": ("PASSED", ""),
}
for name, (status, reason) in expected.items():
    got = (stages[name]["status"], stages[name]["reason"])
    if got[0] != status or (reason is not None and got[1] != reason):
        problems.append(f"stage {name}: {got}, expected {status}")
parts = {name: [p["name"] for p in s["parts"]] for name, s in stages.items()}
kernel_parts = {f"{path}, dim {dim}" for path in sys.argv[4].split(", ") for dim in (64, 128)}
if set(parts["kernels"]) != kernel_parts or not sys.argv[4]:
    problems.append(f"kernel parts {parts['kernels']}, expected every path the bench knows ({sys.argv[4]}) at dims 64, 128")
if not parts["tests"]:
    problems.append("no test group ran")
if parts["train_bench"][:2] != ["base alone", "coupled against base"]:
    problems.append(f"train_bench parts {parts['train_bench']}")
if parts["train"] != ["fused, steps 1-25", "fused, resumed", "fused coupling off"]:
    problems.append(f"train parts {parts['train']}")
if not stages["tests"]["reason"].endswith("tests skipped with a GPU visible"):
    problems.append(f"stage tests: {stages['tests']['reason']!r}")
if sys.argv[3] != "1":
    problems.append(f"run.sh exited {sys.argv[3]}, expected 1 (the tests stage)")
if problems:
    sys.exit("\n".join(problems) + "\n--- run.sh output:\n" + open(sys.argv[2]).read())
print(f"every stage command of run.sh runs as called: {sum(len(s['parts']) for s in stages.values())} parts; "
      + ", ".join(f"{name} {s['seconds']} s" for name, s in stages.items()))
EOF
