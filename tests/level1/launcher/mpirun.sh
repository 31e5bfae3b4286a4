#!/usr/bin/env bash
# Open MPI's mpirun starts 2 hp-train processes; each reads its place from
# OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE (hp-train does not call
# MPI: the store and Gloo do the rest, at MASTER_ADDR:MASTER_PORT given with
# -x). The losses match hp-launch --nproc-per-node 2.
source "$(dirname "$0")/real_launchers.sh"
command -v mpirun > /dev/null || fail "mpirun is not installed (scripts/install-deps.sh installs openmpi-bin)"
small_config "$WORK/c.yaml"
args=(--set training.max_steps=6 --set distributed.timeout_seconds=60)
reference_run "$WORK/c.yaml" "$WORK/ref" "${args[@]}"
port=$(free_port)
# Open MPI binds each of 2 ranks to one core by default; unbound (as under
# torchrun or hp-launch) each rank sees every core and takes its share.
cores=$(nproc)
threads=$((cores / 2 > 0 ? cores / 2 : 1))
(unset OMP_NUM_THREADS RANK WORLD_SIZE HP_LAUNCHED
 exec timeout -k 5 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
   "$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" --set run.output_dir="$WORK/mpi") \
  > "$WORK/mpi.log" 2>&1 || { rc=$?; tail -30 "$WORK/mpi.log"; fail "mpirun exited $rc"; }
expect_in "$WORK/mpi.log" "launch: Open MPI: rank 0 of 2, local 0 of 2, store: served by rank 0 at 127.0.0.1:$port" "rank 0 start line"
expect_in "$WORK/mpi.log" "intra-op threads: $threads ($cores core$( ((cores > 1)) && echo s) / 2 local ranks)" "threads"
show_start_lines "$WORK/mpi.log"
"$BIN/hp-compare" "$WORK/ref" "$WORK/mpi" --phase "mpirun" || fail "losses differ from hp-launch"
echo "== a RANK left in the environment that contradicts mpirun's is refused, naming both"
(export RANK=0 WORLD_SIZE=2; unset HP_LAUNCHED
 exec timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe -np 2 -x RANK -x WORLD_SIZE -x MASTER_PORT="$port" \
   "$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" --set run.output_dir="$WORK/bad") > "$WORK/bad.log" 2>&1 \
  && { cat "$WORK/bad.log"; fail "a contradicting RANK was accepted"; }
expect_in "$WORK/bad.log" "hp-train: RANK=0 and OMPI_COMM_WORLD_RANK=1 disagree" "the refusal"
echo PASS
