#!/usr/bin/env bash
# On node 1 of 2 the workers are ranks 2 and 3 of 4; the launcher only sets the environment.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

run_launcher --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 10.0.0.7 \
  --master-port 29999 -- bash -c 'echo $RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $MASTER_ADDR:$MASTER_PORT'
expect_rc 0
expect_line out "[rank 2] 2 4 0 1 10.0.0.7:29999"
expect_line out "[rank 3] 3 4 1 1 10.0.0.7:29999"
reject_text out "[rank 0]"
expect_text err "starting 2 workers (ranks 2..3 of 4)"

run_launcher --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr node0 -- \
  bash -c 'echo $RANK $WORLD_SIZE $MASTER_ADDR:$MASTER_PORT'
expect_rc 0
expect_line out "[rank 0] 0 2 node0:29500"
echo PASS
