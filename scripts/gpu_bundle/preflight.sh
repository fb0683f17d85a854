#!/usr/bin/env bash
# Everything the GPU check needs, done here before device time is spent
# (docs/KERNELS.md, "Checking a GPU machine"): the bundle rebuilt unless it
# is HEAD's own, run.sh's stub test, its stage commands rehearsed on the CPU
# with the bundle's binaries, the bundle run as on a GPU machine
# without the GPU (simulate.sh, which needs root), the bundle's size and modes;
# then it prints the device calls to make.
#
#   scripts/gpu_bundle/preflight.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
BUNDLE="${CQK_GPU_BUILD:-$CQK_ROOT/build-gpu}/bundle"
CARRY="${BUNDLE#"$CQK_ROOT"/}"  # the device tool carries paths inside the checkout only
[[ "$CARRY" != /* ]] || { echo "preflight: $BUNDLE is outside $CQK_ROOT: the device tool cannot carry it" >&2; exit 1; }
CARRY_MAX=$((64 << 20))  # the device tool carries the working tree and the bundle, 64 MiB in all
say() { echo "preflight: $*"; }

# gpu_bundle.sh writes "commit SHORT_HASH", with "+changes" when the tree was
# dirty: such a bundle may be of other changes, so a dirty tree (new files
# too) rebuilds, which takes seconds when the build is up to date.
head="$(git -C "$CQK_ROOT" rev-parse --short HEAD)"
built="$(head -1 "$BUNDLE/BUILD_INFO" 2>/dev/null || true)"
if [[ "$built" != "commit $head" || -n "$(git -C "$CQK_ROOT" status --porcelain)" ]]; then
  say "bundle: ${built:-none}; tree: $head, with any changes: building"
  "$CQK_ROOT/scripts/gpu_bundle.sh"
fi

out="$(bash "$CQK_ROOT/tests/gpu_bundle_test.sh" "$CQK_ROOT/scripts/gpu_bundle" 2>&1)" || { echo "$out"; exit 1; }
say "stub test passed"
# The bundle's binaries before stripping, with its configs.
BUILD="$(dirname "$BUNDLE")"
out="$(bash "$CQK_ROOT/tests/gpu_stage_commands_test.sh" "$CQK_ROOT/scripts/gpu_bundle" "$BUNDLE/configs" \
  "$BUILD/cqk" "$BUILD/tests/cqk_tests" "$BUILD/cqk_kernel_bench" 2>&1)" || { echo "$out"; exit 1; }
say "stage commands rehearsed on the CPU: ${out##*: }"

# simulate.sh wants torch at a path the binaries were not built against: a
# hard-linked copy of the cached environment (no space taken), beside the
# cache folder that simulate.sh hides.
VENV="$(dirname "$CQK_CACHE")/cqk-preflight-venv"
rm -rf "$VENV"
trap 'rm -rf "$VENV"' EXIT
cp -al "$CQK_VENV" "$VENV"
"$CQK_ROOT/scripts/gpu_bundle/simulate.sh" "$VENV" "$BUNDLE"

for f in "$BUNDLE/run.sh" "$BUNDLE"/bin/*; do [[ -x "$f" ]] || { say "$f is not executable" >&2; exit 1; }; done
tree="$(cd "$CQK_ROOT" && git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1 || true)"  # du: files deleted but not yet staged
bundle="$(du -sb "$BUNDLE" | cut -f1)"
say "carried: working tree $((tree >> 20)) MiB + bundle $((bundle >> 20)) MiB of $((CARRY_MAX >> 20)) MiB"
((tree + bundle <= CARRY_MAX)) || { say "too large for the device tool" >&2; exit 1; }

cat <<EOF

Device call 1 (the stages' limits add up to 300 s; the machine's start, a minute or two, comes on top;
run.sh exit 3 or 4, the bundle cannot run there: the kernels are built there and checked instead, in the
call's time left):

  run(command='bash scripts/gpu_bundle/device.sh "\$OUT" 360', carry=["$CARRY"], timeout_s=360)

Device call 2, only if status's budget_left_s allows it (a fresh machine starts in a minute or two, and none
starts with under 4 minutes left; a warm one waits only about 30 s, so send it as soon as call 1 returns):
stages named again (timeout_s: their limits in gpu_report.json, plus 60), or compute-sanitizer; then give_back.

  run(command='bash $CARRY/run.sh "\$OUT" tests kernels', carry=["$CARRY"], timeout_s=210)
  run(command='bash $CARRY/run.sh "\$OUT" sanitize', carry=["$CARRY"], timeout_s=300)
EOF
