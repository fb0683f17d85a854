#!/usr/bin/env bash
# The GPU check's runner (scripts/gpu_bundle/run.sh) and report
# (report.py) on the CPU, with stub binaries in the bundle and stub stages
# through CQK_GPU_CHECK_STUBS:
# - a test group that dies of a sticky CUDA error fails its own group only,
#   and a child it leaves behind ends with its stage; a kernel path that
#   fails is recorded and the next one runs; the training pair is retried
#   with the fused coupling off; the report's tables are built;
# - the default stages' limits add up to at most 300 s;
# - `run.sh OUT STAGE` runs that stage only; one past its limit is FAILED
#   (timeout) with its processes ended;
# - SIGTERM and SIGKILL in the middle of a stage leave a report that parses,
#   with the finished stages in it;
# - a torch that is not the bundle's exits 3; binaries that do not start
#   (the version stage fails) exit 4 with nothing else run;
# - without a GPU every stage after the first is SKIPPED;
# - at most 8 files come out, with names a device machine returns;
# - device.sh (the first device call) falls back to gpu_check.sh --standalone
#   on exit 3 and 4 only, in the call's time left, and restores lost file modes.
#   tests/gpu_bundle_test.sh scripts/gpu_bundle
set -euo pipefail
SRC="$(cd "$1" && pwd)"
STUB_TMP="$(mktemp -d)"
export STUB_TMP TMPDIR="$STUB_TMP"  # run.sh's work folders too, that of the run killed by SIGKILL among them
trap 'rm -rf "$STUB_TMP"' EXIT
BUNDLE="$STUB_TMP/bundle"
mkdir -p "$BUNDLE/bin" "$STUB_TMP/sanitizer"
cp "$SRC/run.sh" "$SRC/report.py" "$BUNDLE/"
printf 'commit stub\nneeds torch 2.11.0+cu130, GLIBC_2.35, GLIBCXX_3.4.30\n' >"$BUNDLE/BUILD_INFO"

cat >"$STUB_TMP/stubs.sh" <<'EOF'
find_torch() { TORCH_PYTHON=python3 SITE=/nowhere TORCH_VERSION=${STUB_TORCH:-2.11.0+cu130} GPUS=$STUB_GPUS; }
stage_version() {
  [[ -z "${STUB_NO_START:-}" ]] || fail "cqk_tests does not start"
  printf 'cqk 0.1.0\nlibtorch 2.11.0\ngpu 0: Stub GPU\n' >"$STAGE_DIR/version.txt"
}
if [[ -n "${STUB_SLOW_START:-}" ]]; then  # the version stage outlives its limit of 1 s
  LIMIT[version]=1
  stage_version() { sleep 5; }
fi
if [[ -n "${STUB_ODD_BYTES:-}" ]]; then  # a reason cut inside a UTF-8 character, a parts line cut short
  stage_train() {
    printf 'odd\tFAILED\t1\tcut \xe2\x80\rhere\ncut-sh' >>"$STAGE_DIR/parts.tsv"
    fail $'bad \xe2\x80'
  }
fi
if [[ -n "${STUB_HANG:-}" ]]; then  # the train stage hangs, with a limit of STUB_HANG seconds
  LIMIT[train]=$STUB_HANG
  stage_train() { sleep 120 & echo $! >"$STUB_TMP/sleeper.pid"; wait; }
fi
EOF
export CQK_GPU_CHECK_STUBS="$STUB_TMP/stubs.sh"

# cqk_tests: the group FusedRope.* dies as after an illegal address, leaving a child behind; the others pass.
cat >"$BUNDLE/bin/cqk_tests" <<'EOF'
#!/usr/bin/env bash
for a; do case $a in --gtest_filter=*) filter=${a#*=} ;; --gtest_output=json:*) json=${a#*json:} ;; esac; done
if [[ $filter == FusedRope.* ]]; then
  sleep 60 & echo $! >"$STUB_TMP/stray.pid"
  echo "CUDA error: an illegal memory access was encountered" >&2
  exit 1
fi
printf '{\n  "tests": 1,\n  "testsuites": [{"name": "%s", "testsuite": [{"name": "Case", "time": "0.1s"}]}]\n}\n' \
  "${filter%%.*}" >"$json"
EOF
# cqk_kernel_bench: a row per T for --path and --dim, times scaled per path; aten-coupling fails at dim 128;
# the coupled path costs 9.1% over its base at T=512 and 1.8% at the longer T.
cat >"$BUNDLE/bin/cqk_kernel_bench" <<'EOF'
#!/usr/bin/env bash
[[ $1 != --check ]] || { echo "PASS quick"; exit 0; }
while (($#)); do case $1 in --path) path=$2 ;; --dim) dim=$2 ;; esac; shift; done
[[ $path != aten-coupling || $dim != 128 ]] || { echo "CUDA error: unspecified launch failure" >&2; exit 1; }
declare -A ms=([sdpa]=1.0 [sdpa-cudnn]=0.9 [rope-sdpa]=1.1 [fused-coupling-rope]=1.2 [fused-coupling]=1.15 [aten-coupling]=1.5)
extra=""
[[ $path != *-coupling ]] || extra+=', "coupling_fwd_bwd_ms": 0.1'
[[ $path != fused-coupling ]] || extra+=', "kernel_fwd_ms": 0.02, "kernel_fwd_gbs": 3000, "kernel_bwd_ms": 0.03, "kernel_bwd_gbs": 3100'
for T in 512 1024 2048; do
  [[ $path != fused-coupling-rope || $T == 512 ]] || ms[$path]=1.12
  printf '{"path": "%s", "dtype": "bf16", "T": %d, "batch": 8, "heads": 12, "dim": %d, "hidden": 8, "steps": 2, ' "$path" "$T" "$dim"
  printf '"fwd_flops": 1e11, "fwd_bwd_flops": 3.5e11, "applies": true, "fwd_ms": 0.4, "fwd_bwd_ms": %s, ' "${ms[$path]}"
  printf '"sdpa_backend": "flash"%s}\n' "$extra"
done
EOF
# cqk: `bench train` prints its JSON (the pair fails unless CQK_FUSED_COUPLING=0);
# `train` writes metrics.jsonl, whose last loss the resumed run adds (2.0) or the unfused one (2.02).
cat >"$BUNDLE/bin/cqk" <<'EOF'
#!/usr/bin/env bash
model='{"name": "%s", "device_name": "Stub GPU", "dtype": "bf16", "sdpa_backend": "flash", "params": 1,
 "tokens_per_step": 1, "tokens_per_s": 1e5, "step_time_s": {"median": 0.1}, "achieved_flops": 4e14,
 "mfu_measured": 0.5, "measured_peak_flops": 8e14, "mfu_datasheet": 0.4, "datasheet_peak_flops": 9.89e14, "cuda_peak_bytes": 1}'
model="${model//$'\n'/}"
case "$1 $2" in
"bench train")
  if [[ " $* " != *" --compare "* ]]; then printf "$model\n" base; exit; fi
  [[ ${CQK_FUSED_COUPLING:-1} == 0 ]] || { echo "CUDA error: an illegal memory access was encountered"; exit 1; }
  printf "{\"a\": $model, \"b\": $model, \"step_time_ratio\": {\"median\": 1.02, \"min\": 1.0, \"max\": 1.05}, \"step_time_ratios\": [1.02]}\n" coupled base ;;
"train --resume")
  echo "resumed from $3/checkpoints/step25 at step 25"
  echo '{"loss":2.0,"step":50}' >>"$3/metrics.jsonl" ;;
*)
  while (($#)); do [[ $1 != --run-dir ]] || dir=$2; shift; done
  mkdir -p "$dir" && echo '{"loss":4.0,"step":1}' >"$dir/metrics.jsonl"
  [[ ${CQK_FUSED_COUPLING:-1} != 0 ]] || echo '{"loss":2.02,"step":50}' >>"$dir/metrics.jsonl" ;;
esac
EOF
# compute-sanitizer --tool T --error-exitcode 9 COMMAND...: notes the tool and the caching allocator's switch
printf '#!/usr/bin/env bash\necho "$2 ${PYTORCH_NO_CUDA_MEMORY_CACHING:-unset}" >>"$STUB_TMP/sanitizer.log"\nshift 4\nexec "$@"\n' \
  >"$STUB_TMP/sanitizer/compute-sanitizer"
chmod +x "$BUNDLE"/bin/* "$STUB_TMP/sanitizer/compute-sanitizer"

check() {  # OUTDIR EXPECTED_EXIT ACTUAL_EXIT PYTHON_ASSERTIONS
  [[ "$2" == "$3" ]] || { echo "run.sh exited $3, expected $2" >&2; exit 1; }
  local files
  files="$(ls -A "$1")"
  (($(wc -l <<<"$files") <= 8)) || { echo "more than 8 files in $1: $files" >&2; exit 1; }
  ! grep -v '^[A-Za-z0-9][A-Za-z0-9._-]*$' <<<"$files" || { echo "file names a device machine cannot return" >&2; exit 1; }
  python3 - "$1" "$4" <<'EOF'
import json, os, sys
report = json.load(open(os.path.join(sys.argv[1], "gpu_report.json")))
md = open(os.path.join(sys.argv[1], "gpu_report.md")).read()
assert "(not shown" not in md, md
stages = {s["name"]: s for s in report["stages"]}
status = {name: (s["status"], s["reason"]) for name, s in stages.items()}
parts = {(name, p["name"]): (p["status"], p["reason"]) for name, s in stages.items() for p in s["parts"]}
exec(sys.argv[2])
EOF
}
# A killed process may linger a moment, or as a zombie until init reaps it.
alive() { [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" =~ ^[^Z]$ ]]; }
ended() {  # PID
  for _ in 1 2 3 4 5 6 7 8 9 10; do alive "$1" && sleep 0.2; done
  ! alive "$1" || { echo "process $1 of the stage lives on" >&2; exit 1; }
}

# A GPU, the default stages: each part in its own process.
rc=0; STUB_GPUS=1 "$BUNDLE/run.sh" "$STUB_TMP/gpu" >"$STUB_TMP/gpu.out" 2>&1 || rc=$?
cat "$STUB_TMP/gpu.out"
check "$STUB_TMP/gpu" 1 "$rc" '
assert list(stages) == ["version", "tests", "kernels", "train_bench", "train"], list(stages)
assert sum(s["limit_s"] for s in stages.values()) <= 300, stages
assert report["state"] == "finished" and report["passed"] is False and report["machine"]["gpu"] == "Stub GPU"
assert status["version"] == ("PASSED", ""), status
assert status["tests"] == ("FAILED", "GPU test groups failed: FusedRope.*"), status
rope = parts[("tests", "FusedRope.*")]
assert rope[0] == "FAILED" and "illegal memory access" in rope[1], rope
for group in ("FusedCoupling.*", "SdpaBackend.*", "Runtime.OneCudaRuntimeIsLoaded:BuildInfo.*"):
    assert parts[("tests", group)] == ("PASSED", ""), parts
assert stages["tests"]["figures"]["tests"] == 3, stages["tests"]["figures"]
assert status["kernels"] == ("FAILED", "kernel paths failed: aten-coupling, dim 128"), status
assert sum(name == "kernels" for name, _ in parts) == 12, parts
kernels = stages["kernels"]["figures"]
assert [(s["dim"], s["T"]) for s in kernels["shapes"]] == [(d, t) for d in (64, 128) for t in (512, 1024, 2048)]
assert abs(kernels["max_coupling_share"] - (1.2 / 1.1 - 1)) < 1e-9, kernels
# One shape over 5% does not decide it: the median shape does.
assert abs(kernels["median_coupling_share"] - (1.12 / 1.1 - 1)) < 1e-9 and not kernels["share_exceeds_threshold"]
assert kernels["shapes"][0]["faster_sdpa"] == "cudnn" and "aten-coupling" not in kernels["shapes"][-1]["paths"]
assert "is not worth building" in md and "did not apply" not in md
bench = stages["train_bench"]["figures"]
assert status["train_bench"][0] == "FAILED" and bench["fused_coupling_off"], (status, bench)
assert bench["base_alone"]["mfu_790"] == 4e14 / 790e12 and bench["coupled"]["config"] == "coupled"
assert "fused coupling off after a failure" in md
assert status["train"] == ("PASSED", ""), status
train = stages["train"]["figures"]
assert train["resumed_at_step"] == 25 and abs(train["last_loss_difference"] - 0.02 / 2.02) < 1e-9, train
'
grep -q 'tests *FAILED' "$STUB_TMP/gpu.out"
ended "$(cat "$STUB_TMP/stray.pid")"

# One stage by name, past its limit.
start=$SECONDS
rc=0; STUB_GPUS=1 STUB_HANG=2 "$BUNDLE/run.sh" "$STUB_TMP/hang" train >"$STUB_TMP/hang.out" 2>&1 || rc=$?
check "$STUB_TMP/hang" 1 "$rc" '
assert list(stages) == ["train"], list(stages)
assert status["train"][0] == "FAILED" and status["train"][1].startswith("timeout"), status
assert 2 <= stages["train"]["seconds"] <= 8, stages["train"]
'
((SECONDS - start < 30)) || { echo "the stage past its limit held run.sh for $((SECONDS - start))s" >&2; exit 1; }
ended "$(cat "$STUB_TMP/sleeper.pid")"
[[ "$(ls "$STUB_TMP/hang")" == $'gpu_report.json\ngpu_report.md\ntrain.log' ]]

# Killed in the middle of a stage: the report has the stages before it.
for signal in TERM KILL; do
  out="$STUB_TMP/kill-$signal"
  rm -f "$STUB_TMP/sleeper.pid"
  STUB_GPUS=1 STUB_HANG=60 "$BUNDLE/run.sh" "$out" version train tests >"$out.out" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    [[ -s "$STUB_TMP/sleeper.pid" ]] && grep -q '"RUNNING"' "$out/gpu_report.json" && break
    sleep 0.1
  done
  kill -"$signal" "$pid"
  rc=0; { wait "$pid"; } 2>/dev/null || rc=$?  # no "Killed" notice
  if [[ $signal == TERM ]]; then
    check "$out" 143 "$rc" '
assert report["state"] == "interrupted" and report["passed"] is False
assert [s["status"] for s in stages.values()] == ["PASSED", "INTERRUPTED", "PENDING"], status
'
    ended "$(cat "$STUB_TMP/sleeper.pid")"
  else
    check "$out" 137 "$rc" '
assert report["state"] == "running"
assert [s["status"] for s in stages.values()] == ["PASSED", "RUNNING", "PENDING"], status
'
    kill "$(cat "$STUB_TMP/sleeper.pid")"  # the orphaned stage would run on to its limit
  fi
done

# compute-sanitizer, named only: both tools.
rc=0; STUB_GPUS=1 PATH="$STUB_TMP/sanitizer:$PATH" "$BUNDLE/run.sh" "$STUB_TMP/sanitize" sanitize \
  >"$STUB_TMP/sanitize.out" 2>&1 || rc=$?
check "$STUB_TMP/sanitize" 0 "$rc" '
assert status == {"sanitize": ("PASSED", "")}, status
assert parts == {("sanitize", "memcheck"): ("PASSED", ""), ("sanitize", "racecheck"): ("PASSED", "")}, parts
'''
# memcheck without torch's caching allocator, which hides overruns inside its blocks.
[[ "$(cat "$STUB_TMP/sanitizer.log")" == $'memcheck 1\nracecheck unset' ]]

# A relative report folder: the train_bench stage runs in the bundle, and its figures still come back.
rc=0; (cd "$STUB_TMP" && STUB_GPUS=1 "$BUNDLE/run.sh" relative train_bench >"$STUB_TMP/relative.out" 2>&1) || rc=$?
check "$STUB_TMP/relative" 1 "$rc" '
bench = stages["train_bench"]["figures"]
assert bench["base_alone"]["config"] == "base" and bench["coupled"]["config"] == "coupled", bench
'

# A version stage past its limit (a slow first start) is not a bundle that does not run: the others go on.
rc=0; STUB_GPUS=1 STUB_SLOW_START=1 "$BUNDLE/run.sh" "$STUB_TMP/slow" version train >/dev/null 2>&1 || rc=$?
check "$STUB_TMP/slow" 1 "$rc" '
assert status["version"][0] == "FAILED" and status["version"][1].startswith("timeout"), status
assert status["train"] == ("PASSED", ""), status
'

# Bytes cut inside a character, and a parts line cut short: the report is still written.
rc=0; STUB_GPUS=1 STUB_ODD_BYTES=1 "$BUNDLE/run.sh" "$STUB_TMP/odd" train >/dev/null 2>&1 || rc=$?
check "$STUB_TMP/odd" 1 "$rc" '
assert status["train"] == ("FAILED", "bad \ufffd"), status
assert parts[("train", "odd")] == ("FAILED", "cut \ufffd\rhere"), parts
assert parts[("train", "cut-sh")][0] == "UNKNOWN", parts
'

# Not the bundle's torch: nothing runs, exit 3.
rc=0; STUB_GPUS=1 STUB_TORCH=2.10.0 "$BUNDLE/run.sh" "$STUB_TMP/torch" >"$STUB_TMP/torch.out" 2>&1 || rc=$?
check "$STUB_TMP/torch" 3 "$rc" '
assert "2.11.0+cu130" in report["machine"]["torch_error"] and report["passed"] is False
assert all(v == ("SKIPPED", "not run (torch)") for v in status.values()), status
'

# The bundle's binaries do not start: nothing else runs, exit 4.
rc=0; STUB_GPUS=1 STUB_NO_START=1 "$BUNDLE/run.sh" "$STUB_TMP/nostart" >"$STUB_TMP/nostart.out" 2>&1 || rc=$?
check "$STUB_TMP/nostart" 4 "$rc" '
assert status["version"] == ("FAILED", "cqk_tests does not start"), status
for name in ("tests", "kernels", "train_bench", "train"):
    assert status[name] == ("SKIPPED", "not run: the version stage failed"), status
assert report["state"] == "finished" and report["passed"] is False
'
# ... also when version is named after a stage that has run: that one keeps its status.
rc=0; STUB_GPUS=1 STUB_NO_START=1 "$BUNDLE/run.sh" "$STUB_TMP/nostart2" train version kernels >/dev/null 2>&1 || rc=$?
check "$STUB_TMP/nostart2" 4 "$rc" '
assert status == {"train": ("PASSED", ""), "version": ("FAILED", "cqk_tests does not start"),
                  "kernels": ("SKIPPED", "not run: the version stage failed")}, status
'

# No GPU: the first stage only.
rc=0; STUB_GPUS=0 "$BUNDLE/run.sh" "$STUB_TMP/cpu" >"$STUB_TMP/cpu.out" 2>&1 || rc=$?
check "$STUB_TMP/cpu" 0 "$rc" '
assert status["version"] == ("PASSED", ""), status
for name in ("tests", "kernels", "train_bench", "train"):
    assert status[name] == ("SKIPPED", "no CUDA device"), status
assert report["passed"] is True
'
# device.sh: run.sh's status passes through; 3 and 4 fall back to the standalone build in the time left.
cp "$SRC/device.sh" "$STUB_TMP/device.sh"
printf '#!/usr/bin/env bash\necho "gpu_check $* budget=$CQK_GPU_BUDGET out=$OUT"\nexit 5\n' >"$STUB_TMP/gpu_check"
chmod +x "$STUB_TMP/gpu_check"
for stub_rc in 0 1 3 4; do
  mkdir -p "$STUB_TMP/dev$stub_rc/bin"
  printf '#!/usr/bin/env bash\n[[ -x "$(dirname "$0")/bin/tool" ]] || exit 9\nexit %s\n' "$stub_rc" >"$STUB_TMP/dev$stub_rc/run.sh"
  : >"$STUB_TMP/dev$stub_rc/bin/tool"  # not executable: as after a copy that lost the modes
  rc=0
  started=$SECONDS
  out="$(CQK_GPU_BUNDLE="$STUB_TMP/dev$stub_rc" CQK_GPU_CHECK="$STUB_TMP/gpu_check" \
    bash "$STUB_TMP/device.sh" "$STUB_TMP/devout" 360)" || rc=$?
  took=$((SECONDS - started))
  if ((stub_rc == 3 || stub_rc == 4)); then
    # 360 s less the 20 kept for the end, less device.sh's own whole seconds: SECONDS
    # counts clock-second boundaries, so device.sh may count one more than this shell.
    budget=$(sed -n 's/^gpu_check --standalone budget=\([0-9]*\) out=.*/\1/p' <<<"$out")
    [[ $rc == 5 && "$out" == *" out=$STUB_TMP/devout"* && $budget -le 340 && $budget -ge $((340 - took - 1)) ]] ||
      { echo "device.sh after run.sh exit $stub_rc: exit $rc, $out" >&2; exit 1; }
  else
    [[ $rc == "$stub_rc" && "$out" != *gpu_check* ]] ||
      { echo "device.sh after run.sh exit $stub_rc: exit $rc, $out" >&2; exit 1; }
  fi
done
# gpu_check.sh itself parses, and without a GPU stops at once with one line.
bash -n "$SRC/../gpu_check.sh"
mkdir -p "$STUB_TMP/nogpu"
printf '#!/usr/bin/env bash\nexit 9\n' >"$STUB_TMP/nogpu/nvidia-smi"
chmod +x "$STUB_TMP/nogpu/nvidia-smi"
rc=0; out="$(PATH="$STUB_TMP/nogpu:$PATH" CQK_GPU_BUILD="$STUB_TMP/gpu-build" bash "$SRC/../gpu_check.sh" --standalone 2>&1)" || rc=$?
[[ $rc == 2 && "$out" == *"nvidia-smi finds no GPU"* ]] || { echo "gpu_check.sh without a GPU: exit $rc, $out" >&2; exit 1; }
echo "gpu_bundle_test: ok"
