#!/usr/bin/env bash
# Two workers that succeed: exit 0, torchrun's variables, the thread split, prefixed output,
# a master port picked below the ephemeral range.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

cores=$(nproc)
threads=$((cores / 2 > 1 ? cores / 2 : 1))
export OMP_NUM_THREADS=77  # hp-launch always sets its own share
run_launcher --nproc-per-node 2 -- bash -c '
  echo "env RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK" \
       "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER_PORT=$MASTER_PORT"
  echo "threads $OMP_NUM_THREADS $MKL_NUM_THREADS $OPENBLAS_NUM_THREADS $HP_INTRA_OP_THREADS"
  echo "addr $MASTER_ADDR launched $HP_LAUNCHED"
  echo "to stderr $RANK" >&2
  printf "no newline $RANK"'
expect_rc 0

port=$(sed -n 's/.*, master 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$WORK/err")
[[ -n $port ]] && ((port > 0 && port < 65536)) || fail "no master port in the start line"
# Picked below the kernel's ephemeral range (where another process's
# outgoing connection could take it before the store binds it).
low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range)
if ((low > 12000)); then
  ((port >= 10000 && port < low)) || fail "master port $port is not below the ephemeral range (from $low)"
fi
expect_line err "hp-launch: starting 2 workers (ranks 0..1 of 2), $threads intra-op thread$(
  ((threads == 1)) || echo s) each, master 127.0.0.1:$port"
for r in 0 1; do
  expect_line out "[rank $r] env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_PORT=$port"
  expect_line out "[rank $r] threads $threads $threads $threads $threads"
  expect_line out "[rank $r] addr 127.0.0.1 launched 1"
  expect_line out "[rank $r] no newline $r"
  expect_line err "[rank $r] to stderr $r"
done
reject_text out "to stderr"
reject_text err "failed"

run_launcher --nproc-per-node 2 --threads-per-worker 3 -- bash -c 'echo "threads $OMP_NUM_THREADS"'
expect_rc 0
expect_line out "[rank 1] threads 3"
echo PASS
