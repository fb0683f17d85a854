#!/usr/bin/env bash
# Runs the bundle of scripts/gpu_bundle.sh here as on a fresh GPU machine,
# less the GPU: a copy outside the checkout; `env -i` with PATH and HOME only;
# python3 from another environment holding the torch wheel (VENV, at a path the
# binaries were not built against); and, in a private mount namespace (needs
# root), no /usr/local/cuda, no /usr/include, no checkout, build folders or
# cached torch of scripts/setup.sh, the system's copies of the libraries the
# bundle carries replaced by empty files, and the bundle and HOME read-only. The first stage must pass with
# every library from the bundle, torch's wheels or the system's C and C++
# runtimes; every other stage must be SKIPPED for want of a CUDA device.
#
#   python3 -m venv /tmp/fakegpu-venv && /tmp/fakegpu-venv/bin/pip install torch==2.11.0
#   scripts/gpu_bundle/simulate.sh /tmp/fakegpu-venv [BUNDLE]      (then delete the ~4.6 GB venv)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
VENV="$(cd "${1:?usage: simulate.sh VENV [BUNDLE]}" && pwd)"
BUNDLE="$(cd "${2:-$CQK_ROOT/build-gpu/bundle}" && pwd)"
MACHINE="$(mktemp -d /tmp/fakegpu-machine.XXXXXX)"
trap 'rm -rf "$MACHINE"' EXIT
cp -r "$BUNDLE" "$MACHINE/bundle"
mkdir "$MACHINE/home" "$MACHINE/out"

hide=(/usr/local/cuda /usr/include "$CQK_CACHE" "$CQK_ROOT" "$(dirname "$(git -C "$CQK_ROOT" rev-parse --path-format=absolute --git-common-dir)")")
for lib in "$BUNDLE"/lib/*; do hide+=("/usr/lib/x86_64-linux-gnu/${lib##*/}"); done
start=$SECONDS
rc=0
unshare --mount --propagation private bash -s "$MACHINE" "$VENV" "${hide[@]}" <<'EOF' || rc=$?
set -eu
machine=$1 venv=$2
shift 2
for path in "$@"; do
  [[ -e "$path" ]] || continue
  if [[ -d "$path" ]]; then mount -t tmpfs none "$path"; else mount --bind /dev/null "$(realpath "$path")"; fi
done
# Only OUTDIR and /tmp stay writable.
for path in "$machine/bundle" "$machine/home"; do mount --bind "$path" "$path"; mount -o remount,bind,ro "$path"; done
exec env -i PATH="$venv/bin:/usr/bin:/bin" HOME="$machine/home" "$machine/bundle/run.sh" "$machine/out"
EOF
echo "simulate: run.sh exited $rc after $((SECONDS - start))s; files: $(ls "$MACHINE/out" | tr '\n' ' ')"

python3 - "$MACHINE/out/gpu_report.json" "$CQK_SYSTEM_LIBRARIES" <<'EOF'
import json, re, sys
report = json.load(open(sys.argv[1]))
status = {s["name"]: (s["status"], s["reason"]) for s in report["stages"]}
assert status.pop("version") == ("PASSED", ""), report["stages"][0]
assert all(v == ("SKIPPED", "no CUDA device") for v in status.values()), status
libraries = report["stages"][0]["figures"]["libraries"]
others = [lib for lib in libraries["system"] if not re.match(sys.argv[2], lib)]
assert not others, f"from the system, beyond the C and C++ runtimes: {others}"
print(f"simulate: ok; libraries: {len(libraries['bundle'])} from the bundle, {len(libraries['torch'])} from torch's "
      f"wheels, from the system: {', '.join(libraries['system'])}")
EOF
((rc == 0))
