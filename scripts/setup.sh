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
CQK_PIP_PACKAGES=("torch==$CQK_TORCH_VERSION" numpy matplotlib)
if [[ ! -f "$CQK_VENV/.complete" ]]; then
  echo "setup: installing torch==$CQK_TORCH_VERSION into $CQK_VENV (one-time, ~4.6 GB)"
  rm -rf "$CQK_VENV"
  mkdir -p "$CQK_CACHE"
  "$CQK_PYTHON" -m venv "$CQK_VENV" || die "cannot create a venv with $CQK_PYTHON (install python3-venv)"
  "$CQK_VENV/bin/pip" install -q --disable-pip-version-check "${CQK_PIP_PACKAGES[@]}" \
    || die "pip could not install ${CQK_PIP_PACKAGES[*]} for $("$CQK_PYTHON" --version)"
  touch "$CQK_VENV/.complete"
fi
# An environment cached by an older checkout may lack a package added since.
if ! "$CQK_VENV/bin/python" -c "import torch.utils, numpy, matplotlib" 2>/dev/null; then
  "$CQK_VENV/bin/pip" install -q --disable-pip-version-check "${CQK_PIP_PACKAGES[@]}" \
    || die "the cached environment $CQK_VENV is broken and pip could not repair it; delete it and run again"
fi
