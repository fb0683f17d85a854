#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (the README's test command).
# Extra arguments go to ctest, e.g. -R Coupling or -L slow.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$CQK_ROOT/scripts/build.sh"
cd "$CQK_BUILD"
ctest --output-on-failure -j "${CQK_TEST_JOBS:-2}" "$@"
