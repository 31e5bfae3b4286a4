#!/usr/bin/env bash
# torchrun's c10d rendezvous (what --standalone uses; here on a free port
# rather than its fixed 29400): the agents agree on a master address and
# port, rank 0 serves the store there (TORCHELASTIC_USE_AGENT_STORE=False).
# torchrun sets OMP_NUM_THREADS=1 for its 2 workers and hp-train follows it.
# The losses match hp-launch --nproc-per-node 2.
source "$(dirname "$0")/real_launchers.sh"
small_config "$WORK/c.yaml"
args=(--set training.max_steps=6 --set distributed.timeout_seconds=60)
reference_run "$WORK/c.yaml" "$WORK/ref" "${args[@]}"
port=$(free_port)
(unset OMP_NUM_THREADS
 exec timeout -k 5 120 "${TORCHRUN[@]}" --nnodes 1 --nproc_per_node 2 --rdzv_backend c10d \
   --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "hp-c10d-$$" --log_dir "$WORK/tlog" \
   --no_python "$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" --set run.output_dir="$WORK/c10d") \
  > "$WORK/c10d.log" 2>&1 || { rc=$?; tail -30 "$WORK/c10d.log"; fail "torchrun c10d exited $rc"; }
expect_in "$WORK/c10d.log" "launch: torchrun: rank 0 of 2, local 0 of 2, store: served by rank 0 at " "rank 0 start line"
expect_in "$WORK/c10d.log" "intra-op threads: 1 (OMP_NUM_THREADS=1)" "threads"
show_start_lines "$WORK/c10d.log"
"$BIN/hp-compare" "$WORK/ref" "$WORK/c10d" --phase "torchrun c10d rendezvous" || fail "losses differ from hp-launch"
echo PASS
