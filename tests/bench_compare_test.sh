#!/usr/bin/env bash
# scripts/bench_compare.sh end to end at its smallest: one round of two timed
# steps on the tiny config (cqk, eager and compiled PyTorch) gives its table
# row; --help prints the header, a bad option one line and exit 2. About a
# minute on two cores (inductor compiles C++).
#   tests/bench_compare_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
source "$src/scripts/env.sh"
[[ -x $CQK_VENV/bin/python ]] || { echo "bench_compare_test: no torch environment ($CQK_VENV): skipped"; exit 77; }
script="$src/scripts/bench_compare.sh"
dir=$(mktemp -d "${TMPDIR:-/tmp}/cqk-bench-compare-test.XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "bench_compare_test: $*"; exit 1; }

"$script" --help >"$dir/help" || fail "--help exited $?"
grep -q '^cqk against PyTorch' "$dir/help" || fail "--help without the header: $(head -2 "$dir/help")"
status=0; "$script" -z 2>"$dir/bad" || status=$?
[[ $status -eq 2 && $(wc -l <"$dir/bad") -eq 1 ]] || fail "-z: exit $status, $(cat "$dir/bad")"

CQK_BUILD="$build" CQK_BENCH_OUT="$dir/raw" "$script" -r 1 -w 1 -s 2 -q 0 -t 1 "$src/configs/bench/tiny.yaml" \
  >"$dir/out" 2>&1 || { cat "$dir/out"; fail "exit $?"; }
grep -q '^| tiny | 0.46M | [0-9]' "$dir/out" || { cat "$dir/out"; fail "no table row for tiny"; }
cat "$dir/out"
