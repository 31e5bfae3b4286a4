#!/usr/bin/env bash
# The one command that runs every test on a fresh clone: installs the Debian
# packages, builds, and runs the ut, level0 and level1 CTest labels.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD_DIR=${HP_BUILD_DIR:-build}
# -L is a regular expression: '^ut$', since `ut` alone also matches the
# `recompute` feature label. --no-tests=error: a label that selects nothing
# (a misnamed label, tests that failed to register) fails instead of passing.
# Tests that start several ranks need both cores each: run them one at a time.
ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -j 2 -L '^ut$'
ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -j 1 -L '^(level0|level1)$'
