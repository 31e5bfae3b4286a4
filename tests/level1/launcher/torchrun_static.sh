#!/usr/bin/env bash
# torchrun's static rendezvous over 2 "nodes" on loopback (one torchrun per
# node, one worker each, started side by side): node 0's agent serves the
# store on the master port and tells its workers so
# (TORCHELASTIC_USE_AGENT_STORE=True); every rank connects to it as a client
# under /worker/attempt_0. The losses match hp-launch --nproc-per-node 2.
source "$(dirname "$0")/real_launchers.sh"
small_config "$WORK/c.yaml"
args=(--set training.max_steps=6 --set distributed.timeout_seconds=60)
reference_run "$WORK/c.yaml" "$WORK/ref" "${args[@]}"
port=$(free_port)
cores=$(nproc)
pids=()
for r in 0 1; do
  timeout -k 5 120 "${TORCHRUN[@]}" --nnodes 2 --node_rank $r --master_addr 127.0.0.1 --master_port "$port" \
    --nproc_per_node 1 --log_dir "$WORK/tlog$r" --no_python "$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" \
    --set run.output_dir="$WORK/static" > "$WORK/node$r.log" 2>&1 &
  pids+=($!)
  STARTED+=($!)
done
for r in 0 1; do
  wait "${pids[$r]}" || { rc=$?; grep -m3 -E "failed|error" "$WORK/node$r.log"; fail "torchrun node $r exited $rc"; }
done
expect_in "$WORK/node0.log" "launch: torchrun: rank 0 of 2, local 0 of 1, store: torchrun's agent at 127.0.0.1:$port (client), keys under /worker/attempt_0" "rank 0 start line"
# One worker per node and no OMP_NUM_THREADS from torchrun: all cores each.
if [[ -z "${OMP_NUM_THREADS:-}" ]]; then
  expect_in "$WORK/node0.log" "intra-op threads: $cores ($cores core$( ((cores > 1)) && echo s) / 1 local rank)" "threads"
fi
show_start_lines "$WORK/node0.log"
"$BIN/hp-compare" "$WORK/ref" "$WORK/static" --phase "torchrun static rendezvous" || fail "losses differ from hp-launch"
echo PASS
