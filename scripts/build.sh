#!/usr/bin/env bash
# Configures and builds hyperparallel into build/ (Ninja, ccache, precompiled
# LibTorch header). Idempotent; a no-op build takes a second.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${HP_BUILD_DIR:-build}
JOBS=${HP_JOBS:-$(nproc)}
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_INSTALL_PREFIX="$PWD/$BUILD_DIR/install"
fi
start=$(date +%s)
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "build: done in $(( $(date +%s) - start )) s"
