#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/CMakeLists.txt on its own: clang, no LibTorch)
# into build-fuzz, runs each on its corpus for CQK_FUZZ_SECONDS (default 150),
# then minimises what it found (-merge=1) back into fuzz/corpus/<target>, keeping
# the hand-written seed-* files. Inputs that broke a contract are copied to
# fuzz/crashes/<target>/ (and the script fails); tests/fuzz_regression_test.cpp
# replays both folders in the normal test suite.
#
#   scripts/fuzz.sh                    # both targets
#   CQK_FUZZ_SECONDS=30 scripts/fuzz.sh token_file
#   scripts/fuzz.sh --build-only       # compile them, run nothing (tests/fuzz_build_test.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CQK_FUZZ_BUILD:-$root/build-fuzz}"
seconds="${CQK_FUZZ_SECONDS:-150}"
build_only=0
[[ "${1:-}" == --build-only ]] && { build_only=1; shift; }
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(config_loader token_file)

cxx="${CQK_FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}"
if [[ -z "$cxx" ]] || [[ ! -e "$("$cxx" -print-file-name=libclang_rt.fuzzer-x86_64.a)" ]]; then
  echo "fuzz: needs clang and libFuzzer: apt-get install -y clang-14 libclang-rt-14-dev" >&2
  exit 1
fi
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" >"$build.configure.log" 2>&1 \
    || { cat "$build.configure.log" >&2; exit 1; }
fi
cmake --build "$build" -j "${CQK_JOBS:-2}"
((build_only)) && exit 0

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
failed=0
for target in "${targets[@]}"; do
  corpus="$root/fuzz/corpus/$target"
  work="$build/work/$target" artifacts="$build/artifacts/$target/" merged="$build/merged/$target"
  rm -rf "$work" "$merged" && mkdir -p "$work" "$artifacts" "$merged" "$corpus"
  cp "$corpus"/* "$work"/ 2>/dev/null || true
  dict="$root/fuzz/$target.dict"
  echo "fuzz: $target for ${seconds} s, $(ls "$corpus" | wc -l) corpus files"
  status=0
  "$build/fuzz/fuzz_$target" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -dict="$dict" -artifact_prefix="$artifacts" -print_final_stats=1 "$work" >"$build/$target.log" 2>&1 || status=$?
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$build/$target.log" \
    | sed "s/^/fuzz: $target /" || true
  # Minimise: the seeds stay by name, the fuzzer's finds are added only where they add
  # edges (-use_counters=0: hit counts alone do not keep a file), which keeps each corpus small.
  cp "$corpus"/seed-* "$merged"/ 2>/dev/null || true
  "$build/fuzz/fuzz_$target" -merge=1 -use_counters=0 -max_len=4096 "$merged" "$work" >"$build/$target.merge.log" 2>&1
  rm -f "$corpus"/* && cp "$merged"/* "$corpus"/
  echo "fuzz: $target corpus now $(ls "$corpus" | wc -l) files"
  if compgen -G "$artifacts*" >/dev/null; then
    mkdir -p "$root/fuzz/crashes/$target"
    cp "$artifacts"* "$root/fuzz/crashes/$target/"
    echo "fuzz: $target FOUND $(ls "$artifacts" | wc -l) failing input(s), copied to fuzz/crashes/$target (exit $status):" >&2
    grep -m1 -E 'contract broken|ERROR: (Address|Undefined|libFuzzer)|runtime error' "$build/$target.log" >&2 || true
    failed=1
  elif [[ $status -ne 0 ]]; then
    echo "fuzz: $target exited $status; see $build/$target.log" >&2
    failed=1
  fi
done
exit $failed
