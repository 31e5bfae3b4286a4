#!/usr/bin/env bash
# The one command that runs every test on a fresh clone: installs the Debian
# packages, builds, and runs the ut, level0 and level1 CTest labels.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD_DIR=${HP_BUILD_DIR:-build}
# Tests that start several ranks need both cores each: run them one at a time.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2 -L ut
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 1 -L 'level0|level1'
