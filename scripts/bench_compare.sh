#!/usr/bin/env bash
# cqk against PyTorch, eager and compiled, and the cost of coupling, measured alternately.
#
#   scripts/bench_compare.sh [-r REPS] [-t THREADS] [-w WARMUP] [-s STEPS] [-q IDLE_WAIT] [-m COMPILE_MODE]
#                            [-p BASE.yaml:COUPLED.yaml]... CONFIG.yaml...
#
# For each config: `cqk bench train --dump` writes the config, the initial
# weights and the first batch; scripts/bench_pytorch.py --check-loss checks that
# eager and compiled PyTorch compute cqk's loss from them (compiled: and eager's
# gradients; this also fills inductor's cache, so the runs' compile_s is a warm
# compile). Then REPS rounds (default 5) run, with the same weights and thread
# count, one after the other in an order that rotates each round: `cqk bench
# train`; bench_pytorch.py (eager, the trainer's AdamW); and bench_pytorch.py
# --compile --fused-adamw (torch.compile of the loss in mode COMPILE_MODE,
# default "default" or max-autotune-no-cudagraphs; AdamW(fused=True); compile
# time outside the timed steps, shown apart). Prints the CPU model and its
# vector ISA, then a Markdown table: tokens/s of each (median over rounds;
# tokens per step / median step time), the ratios cqk/eager and cqk/compiled
# (median and min..max over rounds; cqk/compiled also from each run's fastest
# step, the least disturbed on a busy machine) and cqk's MFU. For each -p pair
# (both are added to the configs) the step-time ratio coupled/base: from `cqk
# bench train COUPLED --compare BASE` (steps of the two alternated in one
# process; median of the per-step ratios, one run per round), and from the
# separate runs above. Before each run it waits (up to IDLE_WAIT seconds,
# default 300; 0: not at all) until other processes use under 0.15 cores; each
# run reports the cores other processes took during its timed steps ("other
# load" column: the largest over a config's runs; well above 0 means taken
# under load). Raw JSON stays in $CQK_BENCH_OUT (default: a temp folder).
#
#   scripts/bench_compare.sh -t 2 -p configs/bench/tiny-vanilla.yaml:configs/bench/tiny.yaml
#
# Wall time with the defaults on a 2-core AMD EPYC, 2 threads (2026-12-04):
# that example about 6 minutes (1 a round, 1 for the checks and compiles); the
# 20M pair adds about 18 (3.5 a round); waits for idle come on top.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# --help: the comment above, to stdout; a bad option: one line, exit 2.
help() { sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0; }
usage() { echo "bench_compare: $1 (see scripts/bench_compare.sh --help)" >&2; exit 2; }
[[ ${1:-} != --help ]] || help
reps=5 threads=$(nproc) warmup=3 steps=10 idle_wait=300 compile_mode=default
configs=() pairs=()
while getopts ":r:t:w:s:p:q:m:h" opt; do
  case $opt in
    q) idle_wait=$OPTARG ;;
    r) reps=$OPTARG ;;
    t) threads=$OPTARG ;;
    w) warmup=$OPTARG ;;
    s) steps=$OPTARG ;;
    p) pairs+=("$OPTARG") ;;
    m) compile_mode=$OPTARG ;;
    h) help ;;
    :) usage "-$OPTARG needs a value" ;;
    *) usage "unknown option -$OPTARG" ;;
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
((${#configs[@]})) || usage "no CONFIG.yaml given"
case $compile_mode in
  default | max-autotune-no-cudagraphs) ;;
  *) echo "bench_compare: -m wants default or max-autotune-no-cudagraphs, got '$compile_mode'" >&2; exit 2 ;;
esac
((reps >= 1)) 2>/dev/null || { echo "bench_compare: -r wants a positive count, got '$reps'" >&2; exit 2; }

cqk="$CQK_BUILD/cqk"
python="$CQK_VENV/bin/python"
bench_py="$CQK_ROOT/scripts/bench_pytorch.py"
[[ -x $cqk ]] || { echo "bench_compare: $cqk not built (scripts/build.sh)" >&2; exit 1; }
out="${CQK_BENCH_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/cqk-bench.XXXXXX")}"
mkdir -p "$out"
key() { basename "$1" .yaml; }

# The vector extensions that decide cqk's and inductor's kernels (AVX-512 on Zen 4 is double-pumped 256-bit).
isa=$(awk -F': ' '/^flags/ {print $2; exit}' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512(f|bw|vl|_vnni|_bf16|_fp16)|amx_(tile|bf16))$' | tr '\n' ' ' | sed 's/ $//')
echo "# bench_compare $(date -u +%Y-%m-%dT%H:%MZ) | $(lscpu | sed -n 's/^Model name: *//p' | head -1) | $(nproc) cores |" \
     "ISA: ${isa:-no AVX2} | threads $threads | torch $("$python" -c 'import torch; print(torch.__version__)') |" \
     "compiled: torch.compile ($compile_mode) + fused AdamW |" \
     "$reps rounds of $warmup warm-up + $steps timed steps | load $(cut -d' ' -f1-3 /proc/loadavg) | raw: $out"

for config in "${configs[@]}"; do
  k=$(key "$config")
  "$cqk" bench train "$config" --set train.threads="$threads" --warmup 0 --steps 1 --peak-size 256 --json \
    --dump "$out/$k.dump" >/dev/null
  "$python" "$bench_py" --check-loss "$out/$k.dump" --threads "$threads" >"$out/$k.check.json" || true
  "$python" "$bench_py" --check-loss "$out/$k.dump" --threads "$threads" --compile --compile-mode "$compile_mode" \
    >"$out/$k.check-compiled.json" 2>"$out/$k.check-compiled.log" || true
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

tools=(cqk py pyc)  # cqk, PyTorch eager, PyTorch compiled
run_tool() {  # TOOL CONFIG OUT.json
  local tool=$1 config=$2 json=$3 k
  k=$(key "$config")
  wait_idle
  case $tool in
    cqk) "$cqk" bench train "$config" --set train.threads="$threads" --warmup "$warmup" --steps "$steps" --json ;;
    py) "$python" "$bench_py" --dump "$out/$k.dump" --threads "$threads" --warmup "$warmup" --steps "$steps" --json ;;
    pyc) "$python" "$bench_py" --dump "$out/$k.dump" --threads "$threads" --warmup "$warmup" --steps "$steps" --json \
           --compile --compile-mode "$compile_mode" --fused-adamw 2>"${json%.json}.log" ;;
  esac >"$json"
}
for ((r = 1; r <= reps; r++)); do
  for config in "${configs[@]}"; do
    k=$(key "$config")
    for ((i = 0; i < ${#tools[@]}; i++)); do  # round r starts with tool r-1: each goes first as often as the others
      tool=${tools[(i + r - 1) % ${#tools[@]}]}
      run_tool "$tool" "$config" "$out/$k.$r.$tool.json"
    done
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

def other_load(results):
    loads = [r.get("other_cpu_load") for r in results]
    loads = [x for x in loads if x is not None]
    return f"{max(loads):.2f}" if loads else "?"

def check(k, suffix):
    try:
        c = load(os.path.join(out, f"{k}.{suffix}.json"))
        return f"{c['abs_diff']:.1e}" + ("" if c["ok"] else " MISMATCH")
    except (OSError, ValueError, KeyError):
        return "failed"

def ratios(a_runs, b_runs, field=lambda a, b: a["tokens_per_s"] / b["tokens_per_s"]):
    return [field(a, b) for a, b in zip(a_runs, b_runs)]

print()
print("| config | params | cqk tok/s | eager tok/s | compiled tok/s | cqk/eager (min..max) | "
      "cqk/compiled (min..max) | cqk/compiled, best steps | cqk step ms (min..max) | cqk MFU (measured peak) | "
      "compile s | loss check eager, compiled | other load |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for k in keys:
    c, p, pc = runs(k, "cqk"), runs(k, "py"), runs(k, "pyc")
    best = ratios(c, pc, lambda a, b: b["step_time_s"]["min"] / a["step_time_s"]["min"])
    mfu = [a["mfu_measured"] * 100 for a in c]
    peak = statistics.median(a["measured_peak_flops"] for a in c) / 1e9
    tps = [f"{statistics.median(x['tokens_per_s'] for x in runs_):.0f}" for runs_ in (c, p, pc)]
    print(f"| {k} | {c[0]['params'] / 1e6:.2f}M | {' | '.join(tps)} | {span(ratios(c, p), '{:.3f}')} | "
          f"{span(ratios(c, pc), '{:.3f}')} | {span(best, '{:.3f}')} | "
          f"{span([a['step_time_s']['median'] * 1e3 for a in c], '{:.1f}')} | "
          f"{statistics.median(mfu):.1f}% of {peak:.1f} GFLOP/s | "
          f"{statistics.median(x['compile_s'] for x in pc):.1f} | "
          f"{check(k, 'check')}, {check(k, 'check-compiled')} | {other_load(c + p + pc)} |")

if pairs:
    print()
    print("| base -> coupled | cqk coupled/base, steps alternated in one process (min..max over runs) | "
          "cqk, separate runs | eager, separate runs | compiled, separate runs | other load (alternated) |")
    print("|---|---|---|---|---|---|")
    for pair in pairs:
        base, coupled = pair.split(":")
        alternated_runs = [load(os.path.join(out, f"{coupled}-vs-{base}.{r}.json")) for r in range(1, reps + 1)]
        alternated = [run["step_time_ratio"]["median"] for run in alternated_runs]
        cells = [span(alternated, "{:.3f}")]
        for tool in ("cqk", "py", "pyc"):
            b, c = runs(base, tool), runs(coupled, tool)
            cells.append(span([x["step_time_s"]["median"] / y["step_time_s"]["median"] for x, y in zip(c, b)],
                              "{:.3f}"))
        cells.append(other_load([run["a"] for run in alternated_runs]))
        print(f"| {base} -> {coupled} | {' | '.join(cells)} |")
EOF
