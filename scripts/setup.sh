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
  # Not root: sudo, which may ask for a password at a terminal; elsewhere (CI) -n fails at once instead of waiting.
  SUDO=""; [[ $(id -u) -ne 0 ]] && { [[ -t 0 ]] && SUDO="sudo" || SUDO="sudo -n"; }
  $SUDO apt-get -o Acquire::Retries=5 update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o Acquire::Retries=5 install -y -qq "${missing[@]}" >/dev/null \
    || die "apt-get install failed for: ${missing[*]}"
  source "$(dirname "${BASH_SOURCE[0]}")/env.sh"  # python3 may have come with them: the venv's name needs it
fi

command -v "$CQK_PYTHON" >/dev/null || die "$CQK_PYTHON not found (set CQK_PYTHON)"
# transformers, safetensors, sentencepiece: the exported model folders (`cqk export`)
# and their check, pinned to versions tested with this torch. scipy: the check of
# `cqk stats` (tests/paired_stats_check.py). tensorboard: the reader of `cqk train`'s event
# files (tests/tensorboard_check.py) and the viewer. lm-eval with its hf extra (54 more
# packages, +630 MB, ~40 s) only when asked: CQK_WITH_LM_EVAL=1 scripts/setup.sh.
CQK_PIP_PACKAGES=("torch==$CQK_TORCH_VERSION" numpy matplotlib transformers==5.25.0 safetensors==0.8.0
                  sentencepiece==0.2.3 scipy==1.17.1 tensorboard==2.21.0)
[[ "${CQK_WITH_LM_EVAL:-0}" == 1 ]] && CQK_PIP_PACKAGES+=("lm-eval[hf]==0.4.13")
# A venv whose interpreter has gone (the Python it was made from was removed) is made again.
"$CQK_VENV/bin/python" -c '' 2>/dev/null || rm -f "$CQK_VENV/.complete"
if [[ ! -f "$CQK_VENV/.complete" ]]; then
  echo "setup: installing torch==$CQK_TORCH_VERSION into $CQK_VENV (one-time, ~4.6 GB)"
  rm -rf "$CQK_VENV"
  mkdir -p "$CQK_CACHE"
  "$CQK_PYTHON" -m venv "$CQK_VENV" || die "cannot create a venv with $CQK_PYTHON (install python3-venv)"
  "$CQK_VENV/bin/pip" install -q --disable-pip-version-check --retries 10 --timeout 60 "${CQK_PIP_PACKAGES[@]}" \
    || die "pip could not install ${CQK_PIP_PACKAGES[*]} for $("$CQK_PYTHON" --version)"
  touch "$CQK_VENV/.complete"
fi
# An environment cached by an older checkout may lack a package added since, or
# hold another version of a pinned one.
if ! "$CQK_VENV/bin/python" - "${CQK_PIP_PACKAGES[@]}" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
for requirement in sys.argv[1:]:
    name, _, pinned = requirement.partition("==")
    name = name.split("[")[0]  # lm-eval[hf]: the extra is not part of the name
    assert version(name) == pinned if pinned else version(name)
import torch.utils, numpy, matplotlib  # noqa: E401 - they import, not just are listed
PY
then
  "$CQK_VENV/bin/pip" install -q --disable-pip-version-check --retries 10 --timeout 60 "${CQK_PIP_PACKAGES[@]}" \
    || die "the cached environment $CQK_VENV is broken and pip could not repair it; delete it and run again"
fi
