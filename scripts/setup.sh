#!/usr/bin/env bash
# Installs everything cqk needs, idempotently: Debian packages, and LibTorch
# from the pinned PyPI torch wheel into a cached virtual environment.
# Safe to run again: it only does what is missing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

die() { echo "setup: $*" >&2; exit 1; }

missing=()
for p in "${CQK_DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  command -v apt-get >/dev/null || die "apt-get not found; install by hand: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null \
    || die "apt-get install failed for: ${missing[*]}"
fi

command -v "$CQK_PYTHON" >/dev/null || die "$CQK_PYTHON not found (set CQK_PYTHON)"
if [[ ! -f "$CQK_VENV/.complete" ]]; then
  echo "setup: installing torch==$CQK_TORCH_VERSION into $CQK_VENV (one-time, ~4.6 GB)"
  rm -rf "$CQK_VENV"
  mkdir -p "$CQK_CACHE"
  "$CQK_PYTHON" -m venv "$CQK_VENV" || die "cannot create a venv with $CQK_PYTHON (install python3-venv)"
  "$CQK_VENV/bin/pip" install -q --disable-pip-version-check "torch==$CQK_TORCH_VERSION" numpy matplotlib \
    || die "pip could not install torch==$CQK_TORCH_VERSION for $("$CQK_PYTHON" --version)"
  touch "$CQK_VENV/.complete"
fi
"$CQK_VENV/bin/python" -c "import torch.utils" 2>/dev/null \
  || die "the cached environment $CQK_VENV is broken; delete it and run again"
