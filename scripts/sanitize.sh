#!/usr/bin/env bash
# Builds cqk with AddressSanitizer + UndefinedBehaviorSanitizer (-DCQK_SANITIZE=ON,
# CUDA off) into build-asan and runs the unit tests under them.
#
#   scripts/sanitize.sh                 # build, then every test but the excluded ones
#   scripts/sanitize.sh -R Config       # extra arguments go to ctest
#   CQK_SANITIZE_BUILD_ONLY=1 scripts/sanitize.sh
#
# LibTorch itself is not instrumented. What it needs (docs/RELIABILITY.md):
#   - LeakSanitizer off (detect_leaks=0): torch's static registries, thread pools
#     and the CPU allocator's caches are never freed and are reported as leaks.
#   - new_delete_type_mismatch=0: c10d::ProcessGroupGloo, made by make_intrusive in
#     cqk's code (4288 bytes, 64-aligned by the wheel's headers), is deleted by
#     libtorch's own destructor as 488 bytes (the distributed tests).
#   - UBSan stops the test at the first report (halt_on_error=1); no check has
#     needed a suppression for torch's headers so far (the list below is empty).
# Excluded (CQK_SANITIZE_EXCLUDE, a ctest -E regex): consumer.find_package, which
# builds and links a separate project against an installed, uninstrumented package.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

export CQK_BUILD="${CQK_SANITIZE_DIR:-$CQK_ROOT/build-asan}"
export CQK_BUILD_TYPE="${CQK_BUILD_TYPE:-RelWithDebInfo}"
exclude="${CQK_SANITIZE_EXCLUDE:-^consumer\.}"

configure_args=()
if [[ ! -f "$CQK_BUILD/build.ninja" ]]; then
  configure_args=(-DCQK_SANITIZE=ON -DCQK_CUDA=OFF)
fi
"$CQK_ROOT/scripts/build.sh" "${configure_args[@]}"
[[ -n "${CQK_SANITIZE_BUILD_ONLY:-}" ]] && exit 0

# UBSan suppressions (CHECK:pattern on a function, file or module), written next to the build.
cat >"$CQK_BUILD/ubsan.supp" <<'SUPP'
SUPP
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:new_delete_type_mismatch=0:abort_on_error=1:allocator_may_return_null=1:detect_odr_violation=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:suppressions=$CQK_BUILD/ubsan.supp}"
# The sanitizers slow the tool down; tests that spawn it get more time.
cd "$CQK_BUILD"
ctest --output-on-failure -j "${CQK_TEST_JOBS:-2}" -E "$exclude" --timeout 900 "$@"
