#!/usr/bin/env bash
# The compiled column of scripts/bench_compare.sh computes cqk's function:
# bench_pytorch.py --check-loss --compile on a dump of the tiny coupled model
# two optimizer steps in (so the coupling's output layers are no longer zero
# and the coupled map itself is compared) must match cqk's loss and eager's
# gradients. Takes 10-60 s (inductor compiles C++; a warm cache is faster).
#   tests/bench_pytorch_compile_test.sh CQK_TOOL PYTHON SOURCE_DIR
set -euo pipefail
tool=$1 python=$2 src=$3
[[ -x $python ]] || { echo "bench_pytorch_compile_test: no torch Python ('$python'): skipped"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/cqk-compile-test.XXXXXX")
trap 'rm -rf "$dir"' EXIT
"$tool" bench train "$src/configs/bench/tiny.yaml" --warmup 2 --steps 1 --json --dump "$dir/dump" \
  --set data.batch_size=4 --set data.recall.train_examples=64 --set data.recall.eval_examples=8 \
  --set train.threads=1 --peak-size 128 >/dev/null
"$python" "$src/scripts/bench_pytorch.py" --check-loss "$dir/dump" --threads 1 --compile >"$dir/check.json" \
  2>"$dir/check.log" || { cat "$dir/check.json" "$dir/check.log"; echo "bench_pytorch_compile_test: FAILED"; exit 1; }
# The check must have compared gradients, not only the loss.
grep -q '"grad_max_rel_diff"' "$dir/check.json" || { cat "$dir/check.json"; echo "no gradient check"; exit 1; }
cat "$dir/check.json"
