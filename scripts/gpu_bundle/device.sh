#!/usr/bin/env bash
# The first device call (docs/KERNELS.md, "The device calls"): the bundle's
# check, and, when the bundle cannot run on the machine (run.sh exit 3: no
# torch or not its version; 4: its binaries do not start, or not on this
# GPU), the kernels built there instead by scripts/gpu_check.sh --standalone
# in what is left of the call.
#
#   scripts/gpu_bundle/device.sh OUTDIR [CALL_SECONDS]
#
# CALL_SECONDS: the call's timeout_s (default 360). Exit status: run.sh's, or
# gpu_check.sh's after a fallback.
# Test hooks: CQK_GPU_BUNDLE (default build-gpu/bundle), CQK_GPU_CHECK (default
# scripts/gpu_check.sh).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUNDLE="${CQK_GPU_BUNDLE:-$ROOT/build-gpu/bundle}"
OUTDIR="${1:?usage: scripts/gpu_bundle/device.sh OUTDIR [CALL_SECONDS]}"
CALL_SECONDS="${2:-360}"

# A copy that lost the file modes must not cost the call.
chmod +x "$BUNDLE/run.sh" "$BUNDLE"/bin/* 2>/dev/null
bash "$BUNDLE/run.sh" "$OUTDIR"
rc=$?
if ((rc == 3 || rc == 4)); then
  # 20 s kept for the end of the call: gpu_check.sh's summary and the copy of $OUT.
  budget=$((CALL_SECONDS - SECONDS - 20))
  echo "device: the bundle cannot run here (run.sh exit $rc); building the kernels on the machine in ${budget}s"
  OUT="$OUTDIR" CQK_GPU_BUDGET="$budget" "${CQK_GPU_CHECK:-$ROOT/scripts/gpu_check.sh}" --standalone
  rc=$?
fi
exit "$rc"
