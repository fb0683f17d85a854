#!/usr/bin/env bash
# Runs configs x seeds, one run per GPU in parallel, then `cqk stats` on the lot.
#
#   scripts/sweep.sh --seeds 1,2,3 --out runs/sweep configs/wikitext103/150m/diff.yaml configs/wikitext103/150m/diff-affine.yaml
#   scripts/sweep.sh --seeds 1-6 --out runs/150m configs/wikitext103/150m      # a folder: every *.yaml directly in it
#
# Each (config, seed) trains in OUT/<tag>/seed<S>, where <tag> is the config's
# folder and file name ("150m-diff-affine" for configs/wikitext103/150m/diff-affine.yaml,
# which is also its run.name in the shipped configs). `cqk stats` groups runs by
# run.name, so two configs with one run.name stop the sweep before it trains.
# Re-running the same command is safe:
#   - results.json in the run folder: finished, skipped;
#   - a checkpoint (checkpoints/step-*.ckpt): interrupted, continued with `cqk train --resume DIR`;
#   - otherwise: `cqk train CONFIG --set run.seed=S --run-dir DIR [--set ...]`.
# A run folder whose config.yaml has other settings than its config resolves
# to now (an edited file, another --set) stops the sweep before it trains.
# Runs are single processes (CQK_DIST=0), also inside a multi-task batch job.
# Visible GPUs (CUDA_VISIBLE_DEVICES if set, else `nvidia-smi -L`) each run one
# job at a time, with CUDA_VISIBLE_DEVICES set to that GPU; without a GPU the
# jobs run one after another, or --cpu-jobs N at a time (each with N-th of the
# cores as train.threads unless --set gives it). A job's output goes to DIR/sweep.log (the trainer
# also writes DIR/train.log and DIR/metrics.jsonl). At the end `cqk stats OUT`
# prints the table and writes OUT/stats.md and OUT/stats.csv.
# With --eval NAME=DIR, each finished run (also one finished before) that has
# no RUN/evals/NAME.json is evaluated on token folder DIR's valid split by
# `cqk eval RUN --data DIR --save NAME`, for `cqk stats --metric NAME_bpb`.
#
# The tool is $CQK_BIN, default build/cqk (scripts/build.sh builds it).
# Exit status: 0 when every job finished (or was already finished), 1 when some
# failed, diverged or were interrupted, or an --eval evaluation failed (re-run the
# command to continue), 2 on bad usage.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: scripts/sweep.sh [options] CONFIG|FOLDER...

  --seeds LIST       seeds, e.g. 1,2,3 or 1-6 or 1,4-6 (default: 1)
  --out DIR          sweep folder (default: runs/sweep)
  --set KEY=VALUE    config override for new runs (repeatable), e.g. --set train.steps=2000
  --gpus LIST        GPU indices to use, e.g. 0,1 (default: CUDA_VISIBLE_DEVICES or all of nvidia-smi -L);
                     "none" runs on the CPU
  --cpu-jobs N       without a GPU: N runs at a time, each with train.threads = cores / N
                     (default 1; on 2 cores, 2 one-thread runs finish sooner than 1 two-thread run)
  --eval NAME=DIR    after each run, evaluate it on token folder DIR (encoded with the runs' tokenizer)
                     as cqk stats metrics NAME_ppl, NAME_bpb, ... (repeatable; cqk eval --save NAME)
  --compare V:B      pair for cqk stats (repeatable; default: its automatic coupled-vs-base pairs)
  --metric M         metric of the final cqk stats, e.g. test_bpb or NAME_bpb of an --eval NAME
                     (default: valid_ppl; checked before anything trains)
  --no-stats         do not run cqk stats at the end
  --dry-run          print what each job would do, run nothing
  -h, --help         this text
EOF
}

die() { echo "sweep: $*" >&2; exit 2; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CQK="${CQK_BIN:-${CQK_BUILD:-$ROOT/build}/cqk}"

seeds_arg="1"
out="runs/sweep"
gpus_arg=""
gpus_given=0
cpu_jobs=1
stats=1
dry_run=0
overrides=()
compares=()
evals=()
metric=""
inputs=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seeds) [[ $# -ge 2 ]] || die "--seeds needs a value"; seeds_arg="$2"; shift 2 ;;
    --seeds=*) seeds_arg="${1#*=}"; shift ;;
    --out) [[ $# -ge 2 ]] || die "--out needs a value"; out="$2"; shift 2 ;;
    --out=*) out="${1#*=}"; shift ;;
    --set) [[ $# -ge 2 ]] || die "--set needs KEY=VALUE"; overrides+=("$2"); shift 2 ;;
    --set=*) overrides+=("${1#*=}"); shift ;;
    --gpus) [[ $# -ge 2 ]] || die "--gpus needs a value"; gpus_arg="$2"; gpus_given=1; shift 2 ;;
    --gpus=*) gpus_arg="${1#*=}"; gpus_given=1; shift ;;
    --compare) [[ $# -ge 2 ]] || die "--compare needs VARIANT:BASE"; compares+=("$2"); shift 2 ;;
    --compare=*) compares+=("${1#*=}"); shift ;;
    --eval) [[ $# -ge 2 ]] || die "--eval needs NAME=DIR"; evals+=("$2"); shift 2 ;;
    --eval=*) evals+=("${1#*=}"); shift ;;
    --metric) [[ $# -ge 2 ]] || die "--metric needs a value"; metric="$2"; shift 2 ;;
    --metric=*) metric="${1#*=}"; shift ;;
    --cpu-jobs) [[ $# -ge 2 ]] || die "--cpu-jobs needs a number"; cpu_jobs="$2"; shift 2 ;;
    --cpu-jobs=*) cpu_jobs="${1#*=}"; shift ;;
    --no-stats) stats=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; inputs+=("$@"); break ;;
    -*) usage >&2; die "unknown option $1" ;;
    *) inputs+=("$1"); shift ;;
  esac
done
[[ ${#inputs[@]} -gt 0 ]] || { usage >&2; die "no config given"; }
[[ "$cpu_jobs" =~ ^[1-9][0-9]*$ ]] || die "--cpu-jobs '$cpu_jobs': expected a positive number"
for o in "${overrides[@]}"; do
  [[ "$o" == *=* ]] || die "--set '$o': expected KEY=VALUE"
  [[ "$o" != run.seed=* && "$o" != run.dir=* ]] || die "--set $o: the sweep sets run.seed and the run folder itself"
  [[ "$o" != run.name=* ]] || die "--set $o: every config would get that name; the configs' own run.name tells their runs apart"
done
for e in "${evals[@]}"; do
  # The name rule is cqk's (sweep::check_evaluation_name), checked here so that a typo stops the sweep before it trains.
  [[ "$e" =~ ^([a-z0-9][a-z0-9-]*)=(.+)$ && "${BASH_REMATCH[1]}" != valid && "${BASH_REMATCH[1]}" != test ]] ||
    die "--eval '$e': expected NAME=DIR, NAME of lowercase letters, digits and '-', not valid or test"
  [[ -f "${BASH_REMATCH[2]}/valid.bin" ]] || die "--eval '$e': ${BASH_REMATCH[2]}/valid.bin not found (cqk data encode)"
done

if [[ -n "$metric" ]]; then
  # A metric of a saved evaluation needs its --eval: the sweep evaluates nothing else.
  evaluation="${metric%%_*}"
  [[ "$evaluation" == valid || "$evaluation" == test ]] || printf '%s\n' "${evals[@]}" | grep -q "^$evaluation=" ||
    die "--metric '$metric': $evaluation is neither valid, test nor the NAME of an --eval NAME=DIR"
  if [[ -x "$CQK" ]]; then
    # The metric names are cqk's (sweep::check_metric_name): on an empty folder, cqk stats fails
    # on the metric when the name is bad, and only on the missing runs otherwise.
    probe="$(mktemp -d "${TMPDIR:-/tmp}/cqk-sweep-metric.XXXXXX")" || die "mktemp failed"
    problem="$("$CQK" stats "$probe" --metric "$metric" 2>&1 | grep -m1 'unknown metric')"
    rmdir "$probe"
    problem="${problem#*--metric: }"
    [[ -z "$problem" ]] || die "--metric: ${problem% (see cqk --help)}"
  fi
fi

# Seeds: "1,2,3", "1-6", "1,4-6".
seeds=()
IFS=',' read -r -a seed_parts <<<"$seeds_arg"
for part in "${seed_parts[@]}"; do
  if [[ "$part" =~ ^[0-9]+$ ]]; then
    seeds+=("$part")
  elif [[ "$part" =~ ^([0-9]+)-([0-9]+)$ ]] && (( BASH_REMATCH[1] <= BASH_REMATCH[2] )); then
    for ((s = BASH_REMATCH[1]; s <= BASH_REMATCH[2]; ++s)); do seeds+=("$s"); done
  else
    die "--seeds '$seeds_arg': expected a list like 1,2,3 or 1-6"
  fi
done
[[ ${#seeds[@]} -gt 0 ]] || die "--seeds '$seeds_arg': no seed"

# Configs: files as given, folders expanded to the *.yaml directly in them (sorted;
# not recursive, so configs/wikitext103/150m is that scale's grid without the base).
configs=()
for input in "${inputs[@]}"; do
  if [[ -d "$input" ]]; then
    mapfile -t found < <(find "$input" -maxdepth 1 -type f -name '*.yaml' | LC_ALL=C sort)
    [[ ${#found[@]} -gt 0 ]] || die "$input: no *.yaml in this folder"
    configs+=("${found[@]}")
  elif [[ -f "$input" ]]; then
    configs+=("$input")
  else
    die "$input: no such config file or folder"
  fi
done

# Tag of a config: "<folder>-<file stem>"; must be unique within the sweep.
declare -A tag_of=() config_of_tag=()
for config in "${configs[@]}"; do
  abs="$(cd "$(dirname "$config")" && pwd)/$(basename "$config")"
  stem="$(basename "$config")"; stem="${stem%.yaml}"; stem="${stem%.yml}"
  tag="$(basename "$(dirname "$abs")")-$stem"
  if [[ -n "${config_of_tag[$tag]:-}" && "${config_of_tag[$tag]}" != "$abs" ]]; then
    die "$config and ${config_of_tag[$tag]} both map to run folder $out/$tag; rename one"
  fi
  config_of_tag[$tag]="$abs"
  tag_of[$config]="$tag"
done

# run.name of a resolved config (YAML on standard input).
run_name_of() { awk '/^run:/ {r = 1; next} r && /^  name: / {sub(/^  name: /, ""); gsub(/"/, ""); print; exit}'; }

# cqk stats groups runs by run.name: two configs of one name would be pooled as
# one variant. Checked on the configs as resolved with --set, when the tool is built.
declare -A yaml_of=()
if [[ -x "$CQK" ]]; then
  declare -A tag_of_name=()
  for config in "${configs[@]}"; do
    resolve=("$CQK" inspect "$config" --yaml)
    for o in "${overrides[@]}"; do resolve+=(--set "$o"); done
    # Standard output only: the YAML is compared with stored configs below.
    errors="$(mktemp "${TMPDIR:-/tmp}/cqk-sweep-resolve.XXXXXX")" || die "mktemp failed"
    yaml="$(CQK_DIST=0 "${resolve[@]}" 2>"$errors")" || { message="$(tail -n 1 "$errors")"; rm -f "$errors"; die "$config: $message"; }
    rm -f "$errors"
    yaml_of[$config]="$yaml"
    name="$(run_name_of <<<"$yaml")"
    other="${tag_of_name[$name]:-}"  # a tag stands for one config file (checked above)
    [[ -z "$other" || "$other" == "${tag_of[$config]}" ]] ||
      die "$config and ${config_of_tag[$other]} both have run.name '$name': cqk stats would pool their runs as one variant; give each its own"
    tag_of_name[$name]="${tag_of[$config]}"
  done
fi

# Job list: one line "config<TAB>tag<TAB>seed" per run, seeds outer, configs
# inner, so that a sweep cut short has whole seeds of every variant: `cqk stats`
# pairs a coupled run with its base of the same seed. Duplicates dropped.
jobs=()
declare -A seen=()
for seed in "${seeds[@]}"; do
  for config in "${configs[@]}"; do
    key="${tag_of[$config]}/$seed"
    [[ -z "${seen[$key]:-}" ]] || continue
    seen[$key]=1
    jobs+=("$config"$'\t'"${tag_of[$config]}"$'\t'"$seed")
  done
done

# --compare names variants: this sweep's run.names, or those of runs already in
# OUT. A typo would otherwise surface only in cqk stats, after all the training.
if [[ -x "$CQK" ]]; then
  declare -A known_name=()
  for name in "${!tag_of_name[@]}"; do known_name[$name]=1; done
  while IFS= read -r name; do known_name[$name]=1; done < <(
    for stored in "$out"/*/seed*/config.yaml; do
      [[ -f "$stored" ]] && run_name_of <"$stored"
    done)
  for c in "${compares[@]}"; do
    [[ "$c" == *:* ]] || die "--compare '$c': expected VARIANT:BASE"
    for name in "${c%%:*}" "${c#*:}"; do
      [[ -n "${known_name[$name]:-}" ]] ||
        die "--compare '$c': no config of this sweep and no run in $out is named '$name' (run.name)"
    done
  done
fi

# A config as it decides the results: without the run's folder, seed and CPU
# threads, which the sweep sets per run and slot.
settings_of() {  # resolved YAML on stdin
  awk '/^[a-z]/ {section = $1} !(section == "run:" && /^  (dir|seed): /) && !(section == "train:" && /^  threads: /)'
}
# A run folder trained under other settings than its config now resolves to
# (the file edited, another --set) would be skipped or resumed, and its
# results pooled with the new runs under one name: refuse before anything trains.
for job in "${jobs[@]}"; do
  IFS=$'\t' read -r config tag seed <<<"$job"
  stored="$out/$tag/seed$seed/config.yaml"
  [[ -n "${yaml_of[$config]:-}" && -f "$stored" ]] || continue
  # The stored file through this build too: one written by an older build may
  # lack a key added since (with its default), which `cqk train --resume` accepts.
  stored_yaml="$(CQK_DIST=0 "$CQK" inspect "$stored" --yaml 2>/dev/null)" || stored_yaml="$(cat "$stored")"
  difference="$(diff <(settings_of <<<"$stored_yaml") <(settings_of <<<"${yaml_of[$config]}") |
    awk '/^</ && !run {run = $0} /^>/ && !now {now = $0} END {if (run || now) print run "|" now}' | sed 's/^< *//; s/|> */|/')"
  [[ -z "$difference" ]] ||
    die "$out/$tag/seed$seed was trained with other settings than $config (and --set) give now" \
        "(run: ${difference%%|*}; now: ${difference#*|}): use another --out, or restore the settings"
done

# Slots: one per visible GPU, or --cpu-jobs CPU slots ("").
slots=()
if [[ $gpus_given -eq 1 ]]; then
  [[ "$gpus_arg" == none ]] || IFS=',' read -r -a slots <<<"$gpus_arg"
elif [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
  IFS=',' read -r -a slots <<<"$CUDA_VISIBLE_DEVICES"
elif command -v nvidia-smi >/dev/null 2>&1; then
  gpu_count="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
  for ((g = 0; g < ${gpu_count:-0}; ++g)); do slots+=("$g"); done
fi
cpu_only=0
eval_env=()  # for cqk eval: the trainings' share of the cores when they run side by side
if [[ ${#slots[@]} -eq 0 ]]; then
  cpu_only=1
  for ((j = 0; j < cpu_jobs; ++j)); do slots+=(""); done
  # Parallel CPU runs share the cores instead of each taking all of them.
  if (( cpu_jobs > 1 )); then
    share=$(( $(nproc) / cpu_jobs > 0 ? $(nproc) / cpu_jobs : 1 ))
    eval_env=(CQK_NUM_THREADS="$share")
    printf '%s\n' "${overrides[@]}" | grep -q '^train\.threads=' || overrides+=("train.threads=$share")
  fi
fi
cpu_slots_text() { (( cpu_jobs == 1 )) && echo "the CPU, one at a time" || echo "the CPU, $cpu_jobs at a time"; }

# What a job does now: skip, resume or train (from the state of its folder).
job_action() {  # DIR
  if [[ -f "$1/results.json" ]]; then echo skip
  elif compgen -G "$1/checkpoints/step-*.ckpt" >/dev/null; then echo resume
  else echo train
  fi
}

if [[ $dry_run -eq 1 ]]; then
  echo "sweep: ${#jobs[@]} runs (${#configs[@]} configs x ${#seeds[@]} seeds) in $out on" \
       "$([[ $cpu_only -eq 1 ]] && cpu_slots_text || echo "GPUs ${slots[*]}")"
  for job in "${jobs[@]}"; do
    IFS=$'\t' read -r config tag seed <<<"$job"
    dir="$out/$tag/seed$seed"
    echo "$(job_action "$dir") $tag seed $seed: $config -> $dir"
  done
  for e in "${evals[@]}"; do echo "then each: cqk eval RUN --data ${e#*=} --save ${e%%=*}"; done
  exit 0
fi

[[ -x "$CQK" ]] || die "$CQK: no cqk tool (build it with scripts/build.sh, or set CQK_BIN)"
mkdir -p "$out" || die "$out: cannot create the sweep folder"

state="$(mktemp -d "${TMPDIR:-/tmp}/cqk-sweep.XXXXXX")" || die "mktemp failed"
echo 0 >"$state/next"
: >"$state/outcomes"
: >"$state/eval_failures"
worker_pids=()

cleanup() { rm -rf "$state"; }
on_signal() {
  # Stop handing out jobs; running trainings get SIGTERM, checkpoint and exit (resume by re-running).
  touch "$state/stop"
  for f in "$state"/running.*; do
    [[ -f "$f" ]] && kill -TERM "$(cat "$f")" 2>/dev/null
  done
}
trap on_signal INT TERM
trap cleanup EXIT

log() { printf '[sweep %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# "N/M done" and, once a job has trained, the time left at this sweep's pace so far
# (jobs skipped as finished count as done and take no time).
progress() {
  local done trained elapsed left
  done="$(wc -l <"$state/outcomes")"
  trained="$(grep -cv '^skipped' "$state/outcomes")"
  left=$(( ${#jobs[@]} - done ))
  elapsed=$(( $(date +%s) - sweep_start ))
  if (( trained > 0 && left > 0 )); then
    local eta=$(( elapsed * left / trained ))
    printf '%d/%d done, eta %dh%02dm' "$done" "${#jobs[@]}" $(( eta / 3600 )) $(( eta % 3600 / 60 ))
  else
    printf '%d/%d done' "$done" "${#jobs[@]}"
  fi
}

# Records a job's outcome and prints the progress as of it, under the lock:
# two workers ending at once must not both count the other's outcome.
record_outcome() {  # OUTCOME TAG SEED
  (
    flock 9
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$state/outcomes"
    progress
  ) 9>"$state/lock"
}

# Takes the next job index under a lock; prints nothing when none is left.
next_job() {
  (
    flock 9
    local i
    i="$(cat "$state/next")"
    echo $((i + 1)) >"$state/next"
    echo "$i"
  ) 9>"$state/lock"
}

# The --eval evaluations a finished run lacks; a failure is logged and counted, the run stays finished.
evaluate() {  # DIR TAG SEED SLOT
  local e name data gpu=()
  [[ -z "$4" ]] || gpu=(CUDA_VISIBLE_DEVICES="$4")
  for e in "${evals[@]}"; do
    name="${e%%=*}" data="${e#*=}"
    [[ ! -f "$1/evals/$name.json" && ! -e "$state/stop" ]] || continue
    echo "# $(date '+%F %T') $CQK eval $1 --data $data --save $name" >>"$1/sweep.log"
    if env CQK_DIST=0 "${gpu[@]}" "${eval_env[@]}" "$CQK" eval "$1" --data "$data" --save "$name" \
      >>"$1/sweep.log" 2>&1 </dev/null; then
      log "eval   $2 seed $3 on $name"
    else
      log "eval   $2 seed $3 on $name FAILED; see $1/sweep.log"
      printf '%s\t%s\t%s\n' "$name" "$2" "$3" >>"$state/eval_failures"
    fi
  done
}

worker() {  # SLOT (a GPU index, or "" for the CPU)
  local slot="$1" i config tag seed dir action rc outcome done_now where trapped=0
  # A SIGTERM to the whole process group (kill -- -PGID, a batch system's cancel) reaches the
  # workers too: take no new job, and still wait for the running training to checkpoint and
  # exit, so that its outcome is counted.
  trap 'touch "$state/stop"; trapped=1' TERM
  where="$([[ -n "$slot" ]] && echo "GPU $slot" || echo CPU)"
  while [[ ! -e "$state/stop" ]]; do
    i="$(next_job)"
    [[ $i =~ ^[0-9]+$ ]] && (( i < ${#jobs[@]} )) || break  # empty: the signal ended next_job
    IFS=$'\t' read -r config tag seed <<<"${jobs[$i]}"
    dir="$out/$tag/seed$seed"
    action="$(job_action "$dir")"
    [[ -n $action && ! -e "$state/stop" ]] || break
    if [[ $action == skip ]]; then
      log "skip   $tag seed $seed: finished ($dir/results.json)"
      record_outcome skipped "$tag" "$seed" >/dev/null
      evaluate "$dir" "$tag" "$seed" "$slot"
      continue
    fi
    mkdir -p "$dir"
    local -a command
    if [[ $action == resume ]]; then
      command=("$CQK" train --resume "$dir")
    else
      command=("$CQK" train "$config" --set "run.seed=$seed" --run-dir "$dir")
      for o in "${overrides[@]}"; do command+=(--set "$o"); done
    fi
    log "$(printf '%-6s' "$action") $tag seed $seed on $where -> $dir (run $((i + 1))/${#jobs[@]}; log: $dir/sweep.log)"
    {
      echo "# $(date '+%F %T') $where: ${command[*]}"
    } >>"$dir/sweep.log"
    # CQK_DIST=0: each run is one process, also inside a batch job whose
    # SLURM_NTASKS or WORLD_SIZE would make it wait for ranks that never come.
    if [[ -n "$slot" ]]; then
      CQK_DIST=0 CUDA_VISIBLE_DEVICES="$slot" "${command[@]}" >>"$dir/sweep.log" 2>&1 </dev/null &
    else
      CQK_DIST=0 "${command[@]}" >>"$dir/sweep.log" 2>&1 </dev/null &
    fi
    local pid=$!
    echo "$pid" >"$state/running.$BASHPID"
    # A stop that came after on_signal looked for running trainings: this one would miss it.
    [[ ! -e "$state/stop" ]] || kill -TERM "$pid" 2>/dev/null
    trapped=0
    wait "$pid"
    rc=$?
    # A trapped signal ends `wait` early; waiting again gives the training's own status
    # (bash keeps the status of a child it has already reaped).
    while (( trapped )); do trapped=0; wait "$pid"; rc=$?; done
    rm -f "$state/running.$BASHPID"
    if [[ $rc -eq 0 && -f "$dir/results.json" ]]; then outcome=finished
    elif [[ $rc -eq 0 ]]; then outcome=paused
    elif [[ $rc -eq 130 || $rc -eq 143 ]]; then outcome=interrupted
    elif [[ $rc -eq 3 ]]; then outcome=diverged
    else outcome=failed
    fi
    done_now="$(record_outcome "$outcome" "$tag" "$seed")"
    log "$outcome $tag seed $seed (exit $rc)$([[ $outcome == finished ]] || echo "; see $dir/sweep.log") | $done_now"
    [[ $outcome != finished ]] || evaluate "$dir" "$tag" "$seed" "$slot"
  done
}

sweep_start="$(date +%s)"
log "${#jobs[@]} runs (${#configs[@]} configs x ${#seeds[@]} seeds) in $out on" \
    "$([[ $cpu_only -eq 1 ]] && cpu_slots_text || echo "${#slots[@]} GPU(s): ${slots[*]}")"
for slot in "${slots[@]}"; do
  worker "$slot" &
  worker_pids+=($!)
done
# `wait` returns early when a trapped signal arrives; keep waiting for the workers to wind down.
for pid in "${worker_pids[@]}"; do
  while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done
done

count() { grep -c "^$1	" "$state/outcomes" || true; }
finished=$(count finished) skipped=$(count skipped) paused=$(count paused)
interrupted=$(count interrupted) diverged=$(count diverged) failed=$(count failed)
not_started=$(( ${#jobs[@]} - $(wc -l <"$state/outcomes") ))
eval_failed=$(wc -l <"$state/eval_failures")
log "done: $finished finished, $skipped already finished, $paused paused, $interrupted interrupted," \
    "$diverged diverged, $failed failed, $not_started not started$(
      (( ${#evals[@]} == 0 )) || echo "; $eval_failed evaluations failed")"

status=0
(( paused + interrupted + diverged + failed + not_started + eval_failed == 0 )) || status=1

if [[ $stats -eq 1 && ! -e "$state/stop" ]]; then
  stats_command=("$CQK" stats "$out" --markdown "$out/stats.md" --csv "$out/stats.csv")
  for c in "${compares[@]}"; do stats_command+=(--compare "$c"); done
  [[ -z "$metric" ]] || stats_command+=(--metric "$metric")
  log "${stats_command[*]}"
  "${stats_command[@]}" || { echo "sweep: cqk stats failed" >&2; status=1; }
fi
exit $status
