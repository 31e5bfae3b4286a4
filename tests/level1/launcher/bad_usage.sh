#!/usr/bin/env bash
# Usage mistakes exit 2 with a message naming the flag, its value and the rule; nothing runs.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

marker="$WORK/worker-ran"
mistake() {
  local expected=$1
  shift
  run_launcher "$@"
  [[ $RC == 2 ]] || fail "hp-launch $* exited $RC, expected 2"
  expect_text err "hp-launch: error: $expected"
  [[ ! -e $marker ]] || fail "hp-launch $* started a worker"
}

mistake "--nproc-per-node is 0, but it must be at least 1" --nproc-per-node 0 -- touch "$marker"
mistake "--nproc-per-node is -3, but it must be at least 1" --nproc-per-node -3 -- touch "$marker"
mistake "Could not convert: --nproc-per-node = abc: it must be a whole number" --nproc-per-node abc -- touch "$marker"
mistake "no worker command: put it after '--'" --nproc-per-node 2
mistake "no worker command: put it after '--'" --nproc-per-node 2 --
mistake "the worker command is empty" --nproc-per-node 2 -- ""
mistake "unexpected argument 'touch': flags go before '--'" --nproc-per-node 2 touch "$marker"
mistake "unknown flag '--nproc'" --nproc 2 -- touch "$marker"
mistake "--node-rank is 2, but it must be between 0 and --nnodes - 1 = 1" \
  --nnodes 2 --node-rank 2 -- touch "$marker"
mistake "--nnodes is 0, but it must be at least 1" --nnodes 0 -- touch "$marker"
mistake "--master-port is 0, but it must be between 1 and 65535" --master-port 0 -- touch "$marker"
mistake "--master-port is 70000, but it must be between 1 and 65535" \
  --master-port 70000 -- touch "$marker"
mistake "--threads-per-worker is 0, but it must be at least 1" \
  --threads-per-worker 0 -- touch "$marker"
mistake "--tail-lines is -1, but it must be 0 or more" --tail-lines -1 -- touch "$marker"

run_launcher --help
expect_rc 0
expect_text out "--nproc-per-node"
echo PASS
