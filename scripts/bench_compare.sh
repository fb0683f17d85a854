#!/usr/bin/env bash
# cqk against PyTorch eager, and the cost of coupling, measured alternately.
#
#   scripts/bench_compare.sh [-r REPS] [-t THREADS] [-w WARMUP] [-s STEPS] [-q IDLE_WAIT]
#                            [-p BASE.yaml:COUPLED.yaml]... CONFIG.yaml...
#
# For each config: `cqk bench train --dump` writes the config, the initial
# weights and the first batch; scripts/bench_pytorch.py --check-loss checks that
# both compute the same loss from them; then REPS rounds (default 3) run
# `cqk bench train` and `bench_pytorch.py` (same weights, same thread count) one
# after the other, alternating which goes first. Prints a Markdown table:
# tokens/s of each (median over rounds; tokens per step / median step time), the
# ratio cqk/PyTorch (median and min..max over rounds; also from each run's
# fastest step, the least disturbed on a busy machine) and cqk's MFU. For each -p pair (both are added to the
# configs) the step-time ratio coupled/base: from `cqk bench train COUPLED
# --compare BASE` (steps of the two alternated in one process; median of the
# per-step ratios, one run per round), and from the separate runs above (cqk
# and PyTorch). Before each run it waits (up to IDLE_WAIT seconds, default 300;
# 0: not at all) until other processes use under 0.15 cores; each run reports
# the cores other processes took during its timed steps ("other load" column:
# the largest over a config's runs; well above 0 means taken under load).
# Raw JSON stays in $CQK_BENCH_OUT (default: a temp folder).
#
#   scripts/bench_compare.sh -t 2 -p configs/bench/tiny-vanilla.yaml:configs/bench/tiny.yaml
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

reps=3 threads=$(nproc) warmup=3 steps=10 idle_wait=300
configs=() pairs=()
while getopts "r:t:w:s:p:q:h" opt; do
  case $opt in
    q) idle_wait=$OPTARG ;;
    r) reps=$OPTARG ;;
    t) threads=$OPTARG ;;
    w) warmup=$OPTARG ;;
    s) steps=$OPTARG ;;
    p) pairs+=("$OPTARG") ;;
    *) sed -n '2,24p' "${BASH_SOURCE[0]}"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
configs+=("$@")
for pair in "${pairs[@]+"${pairs[@]}"}"; do
  [[ $pair == *:* ]] || { echo "bench_compare: -p wants BASE:COUPLED, got '$pair'" >&2; exit 2; }
  configs+=("${pair%%:*}" "${pair#*:}")
done
# Each config once, in order of appearance.
mapfile -t configs < <(printf '%s\n' "${configs[@]+"${configs[@]}"}" | awk 'NF && !seen[$0]++')
((${#configs[@]})) || { sed -n '2,24p' "${BASH_SOURCE[0]}"; exit 2; }

cqk="$CQK_BUILD/cqk"
python="$CQK_VENV/bin/python"
bench_py="$CQK_ROOT/scripts/bench_pytorch.py"
[[ -x $cqk ]] || { echo "bench_compare: $cqk not built (scripts/build.sh)" >&2; exit 1; }
out="${CQK_BENCH_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/cqk-bench.XXXXXX")}"
mkdir -p "$out"
key() { basename "$1" .yaml; }

echo "# bench_compare $(date -u +%Y-%m-%dT%H:%MZ) | $(lscpu | sed -n 's/^Model name: *//p' | head -1) | $(nproc) cores |" \
     "threads $threads | torch $("$python" -c 'import torch; print(torch.__version__)') |" \
     "$reps rounds of $warmup warm-up + $steps timed steps | load $(cut -d' ' -f1-3 /proc/loadavg) | raw: $out"

for config in "${configs[@]}"; do
  k=$(key "$config")
  "$cqk" bench train "$config" --set train.threads="$threads" --warmup 0 --steps 1 --peak-size 256 --json \
    --dump "$out/$k.dump" >/dev/null
  "$python" "$bench_py" --check-loss "$out/$k.dump" --threads "$threads" >"$out/$k.check.json" || true
done

hz=$(getconf CLK_TCK)
machine_busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9; exit}' /proc/stat; }
wait_idle() {  # until the machine is idle for 2 s (other use < 0.15 cores), at most idle_wait seconds
  local waited=0 before after
  while ((waited < idle_wait)); do
    before=$(machine_busy); sleep 2; after=$(machine_busy)
    (((after - before) * 100 < 15 * 2 * hz)) && return 0
    waited=$((waited + 2))
  done
  ((idle_wait == 0)) || echo "bench_compare: machine still busy after ${idle_wait}s; running anyway" >&2
}

run_cqk() {
  wait_idle
  "$cqk" bench train "$1" --set train.threads="$threads" --warmup "$warmup" --steps "$steps" --json >"$2"
}
run_py() {
  wait_idle
  "$python" "$bench_py" --dump "$3" --threads "$threads" --warmup "$warmup" --steps "$steps" --json >"$2"
}
for ((r = 1; r <= reps; r++)); do
  for config in "${configs[@]}"; do
    k=$(key "$config")
    if ((r % 2)); then
      run_cqk "$config" "$out/$k.$r.cqk.json"
      run_py "$config" "$out/$k.$r.py.json" "$out/$k.dump"
    else
      run_py "$config" "$out/$k.$r.py.json" "$out/$k.dump"
      run_cqk "$config" "$out/$k.$r.cqk.json"
    fi
    echo "round $r/$reps $k done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  done
  for pair in "${pairs[@]+"${pairs[@]}"}"; do
    base=${pair%%:*} coupled=${pair#*:}
    wait_idle
    "$cqk" bench train "$coupled" --compare "$base" --set train.threads="$threads" --warmup "$warmup" \
      --steps "$steps" --json >"$out/$(key "$coupled")-vs-$(key "$base").$r.json"
    echo "round $r/$reps $(key "$coupled") vs $(key "$base") done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  done
done

pair_keys=()
for pair in "${pairs[@]+"${pairs[@]}"}"; do pair_keys+=("$(key "${pair%%:*}"):$(key "${pair#*:}")"); done
config_keys=()
for config in "${configs[@]}"; do config_keys+=("$(key "$config")"); done

"$python" - "$out" "$reps" "${#config_keys[@]}" "${config_keys[@]}" "${pair_keys[@]+"${pair_keys[@]}"}" <<'EOF'
import json, os, statistics, sys

out, reps, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
keys, pairs = sys.argv[4:4 + n], sys.argv[4 + n:]

def load(path):
    with open(path) as f:
        return json.load(f)

def runs(k, tool):
    return [load(os.path.join(out, f"{k}.{r}.{tool}.json")) for r in range(1, reps + 1)]

def span(values, fmt):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}..{fmt.format(max(values))})"

print()
def other_load(results):
    loads = [r.get("other_cpu_load") for r in results]
    loads = [x for x in loads if x is not None]
    return f"{max(loads):.2f}" if loads else "?"

print("| config | params | cqk tok/s | PyTorch tok/s | cqk/PyTorch (min..max) | cqk/PyTorch, best steps | "
      "cqk step ms (min..max) | cqk MFU (measured peak) | loss check, abs diff | other load |")
print("|---|---|---|---|---|---|---|---|---|---|")
for k in keys:
    c, p = runs(k, "cqk"), runs(k, "py")
    ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(c, p)]
    best = [b["step_time_s"]["min"] / a["step_time_s"]["min"] for a, b in zip(c, p)]
    check_path = os.path.join(out, f"{k}.check.json")
    try:
        check = load(check_path)
        loss = f"{check['abs_diff']:.1e} ({'ok' if check['ok'] else 'MISMATCH'})"
    except (OSError, ValueError, KeyError):
        loss = "failed"
    mfu = [a["mfu_measured"] * 100 for a in c]
    peak = statistics.median(a["measured_peak_flops"] for a in c) / 1e9
    print(f"| {k} | {c[0]['params'] / 1e6:.2f}M | {statistics.median(a['tokens_per_s'] for a in c):.0f} | "
          f"{statistics.median(b['tokens_per_s'] for b in p):.0f} | {span(ratios, '{:.3f}')} | {span(best, '{:.3f}')} | "
          f"{span([a['step_time_s']['median'] * 1e3 for a in c], '{:.1f}')} | "
          f"{statistics.median(mfu):.1f}% of {peak:.1f} GFLOP/s | {loss} | {other_load(c + p)} |")

if pairs:
    print()
    print("| base -> coupled | cqk coupled/base, steps alternated in one process (min..max over runs) | "
          "cqk, separate runs | PyTorch, separate runs | other load (alternated) |")
    print("|---|---|---|---|---|")
    for pair in pairs:
        base, coupled = pair.split(":")
        alternated_runs = [load(os.path.join(out, f"{coupled}-vs-{base}.{r}.json")) for r in range(1, reps + 1)]
        alternated = [run["step_time_ratio"]["median"] for run in alternated_runs]
        cells = [span(alternated, "{:.3f}")]
        for tool in ("cqk", "py"):
            b, c = runs(base, tool), runs(coupled, tool)
            cells.append(span([x["step_time_s"]["median"] / y["step_time_s"]["median"] for x, y in zip(c, b)],
                              "{:.3f}"))
        cells.append(other_load([run["a"] for run in alternated_runs]))
        print(f"| {base} -> {coupled} | {' | '.join(cells)} |")
EOF
