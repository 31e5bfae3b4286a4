#!/usr/bin/env bash
# The main job: installs, builds, and trains the default GPT config on two
# data-parallel processes over Gloo on the fortunes corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
exec build/bin/hp-train configs/gpt_dp2.yaml --nproc 2 "$@"
