#!/usr/bin/env bash
# Slurm for real: a one-node cluster on localhost from Debian's packages
# (munged, slurmctld, slurmd), configured by this script in its temporary
# directory, runs `srun -n 2 hp-train` and an `sbatch` job of 2 tasks (the
# README's script, one task per rank) and one with an hp-launch per node (the
# README's other script); each must be bitwise equal to `hp-launch
# --nproc-per-node 2` (one thread per rank everywhere), rank 0 listening where
# Slurm's variables say. Every daemon and task is stopped on exit, failed or not.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
for t in mungekey munged slurmctld slurmd sinfo srun sbatch squeue; do
  command -v $t >/dev/null || fail "$t is not installed: run scripts/install-deps.sh (munge, slurmctld, slurmd, slurm-client)"
done

# munged checks that every directory above its socket is searchable by all.
chmod 755 "$WORK"
CONF=$WORK/slurm.conf
mkdir -p "$WORK/munge" "$WORK/state" "$WORK/spool" "$WORK/log"

# Every process of this cluster carries SLURM_CONF=$CONF in its environment
# (the daemons get it here, slurmstepd and the tasks inherit it), so the
# cleanup finds exactly them, and none of anyone else's.
ours() {
  local f
  for f in $(grep -lzxF "SLURM_CONF=$CONF" /proc/[0-9]*/environ 2>/dev/null); do
    f=${f#/proc/}
    f=${f%/environ}
    [[ $f != "$$" ]] && echo "$f"
  done
}
cleanup() {
  local pids i
  pids=$(ours)
  if [[ -n $pids ]]; then
    kill -TERM $pids 2>/dev/null
    for i in $(seq 50); do
      pids=$(ours)
      [[ -z $pids ]] && break
      sleep 0.1
    done
    [[ -n $pids ]] && kill -KILL $pids 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
show_logs() {
  local f
  for f in "$WORK"/log/*; do echo "--- $f:" >&2; tail -n 30 "$f" >&2; done
}
die() {
  echo "FAIL: $*" >&2
  show_logs
  exit 1
}

# Free ports: the controller, slurmd, and three in a row from 15000 on for the
# jobs, whose rank 0 listens on 15000 + job id mod 10000 (hp-train's Slurm
# default); FirstJobId makes the first job's id land on the first of them.
read -r CTLD_PORT SLURMD_PORT JOB_PORT < <(python3 - <<'PY'
import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("", p)); return True
    except OSError:
        return False
    finally:
        s.close()
def any_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
a = any_port(); b = any_port()
while b == a: b = any_port()
while True:
    p = random.randrange(15000, 24990)
    if all(free(p + i) for i in range(3)): break
print(a, b, p)
PY
)
FIRST_JOB=$((10000 + JOB_PORT - 15000))

mungekey --create --keyfile "$WORK/munge/munge.key" >/dev/null || fail "mungekey could not create a key"
SLURM_CONF=$CONF munged --foreground --key-file="$WORK/munge/munge.key" --socket="$WORK/munge/socket" \
  --pid-file="$WORK/munge/munged.pid" --log-file="$WORK/log/munged.log" --seed-file="$WORK/munge/seed" \
  >"$WORK/log/munged.out" 2>&1 &

# The daemons run as whoever runs the test (root or not): the only user
# submitting jobs is the same one.
user=$(id -un)
cat >"$CONF" <<EOF
ClusterName=hptest
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
AuthInfo=socket=$WORK/munge/socket
CredType=cred/munge
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
FirstJobId=$FIRST_JOB
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=500 State=UNKNOWN
PartitionName=hp Nodes=localhost Default=YES MaxTime=10 State=UP
EOF

for i in $(seq 100); do [[ -S $WORK/munge/socket ]] && break; sleep 0.05; done
[[ -S $WORK/munge/socket ]] || die "munged did not create its socket"
SLURM_CONF=$CONF slurmctld -D -f "$CONF" >"$WORK/log/slurmctld.out" 2>&1 &
ctld=$!
SLURM_CONF=$CONF slurmd -D -f "$CONF" -N localhost >"$WORK/log/slurmd.out" 2>&1 &
slurmd=$!
start=$SECONDS
until [[ $(SLURM_CONF=$CONF sinfo -h -n localhost -o %t 2>/dev/null) == idle ]]; do
  kill -0 $ctld 2>/dev/null || die "slurmctld exited (its log follows)"
  kill -0 $slurmd 2>/dev/null || die "slurmd exited (its log follows)"
  ((SECONDS - start < 30)) || die "the node is not idle after 30 s: $(SLURM_CONF=$CONF sinfo -h -N -o '%N %t %E' 2>&1)"
  sleep 0.2
done
echo "cluster up in $((SECONDS - start)) s: controller port $CTLD_PORT, slurmd port $SLURMD_PORT, first job $FIRST_JOB"

small_config "$WORK/c.yaml"
common=(--set training.max_steps=8 --set training.eval_interval=4 --set metrics.peak_flops=1e11)
export HP_INTRA_OP_THREADS=1 OMP_NUM_THREADS=1

"$BIN/hp-launch" --nproc-per-node 2 --threads-per-worker 1 -- \
  "$BIN/hp-train" "$WORK/c.yaml" "${common[@]}" --set run.output_dir="$WORK/ref" >"$WORK/ref.log" 2>&1 ||
  { cat "$WORK/ref.log"; fail "the hp-launch run failed"; }

# run_ok LOG RUN_DIR JOB_ID: the run had 2 ranks placed by Slurm's variables,
# rank 0 listening where hp-train's Slurm default puts it, and its losses
# bitwise equal the hp-launch run's.
run_ok() {
  local log=$1 dir=$2 port=$((15000 + $3 % 10000))
  grep -q "over 2 ranks" "$log" || { cat "$log"; die "$log: the run did not have 2 ranks"; }
  grep -qF "ranks from slurm variables; store at localhost:$port (address from first host of SLURM_STEP_NODELIST, port from 15000 + SLURM_JOB_ID mod 10000)" "$log" ||
    { cat "$log"; die "$log: rank 0 did not take its address and port from Slurm's variables"; }
  "$BIN/hp-compare" "$WORK/ref" "$dir" --exact --phase "Slurm placement" || die "$dir differs from the hp-launch run"
}

echo "== srun -n 2 hp-train"
SLURM_CONF=$CONF srun -n 2 "$BIN/hp-train" "$WORK/c.yaml" "${common[@]}" --set run.output_dir="$WORK/srun" \
  >"$WORK/srun.log" 2>&1 || { cat "$WORK/srun.log"; die "srun -n 2 hp-train failed"; }
run_ok "$WORK/srun.log" "$WORK/srun" "$FIRST_JOB"

echo "== sbatch --wait, 2 tasks"
cat >"$WORK/train.sbatch" <<EOF
#!/bin/bash
#SBATCH --job-name=hp-train
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --output=$WORK/sbatch.log
export OMP_NUM_THREADS=\$SLURM_CPUS_PER_TASK HP_INTRA_OP_THREADS=\$SLURM_CPUS_PER_TASK
srun "$BIN/hp-train" "$WORK/c.yaml" ${common[*]} --set run.output_dir="$WORK/sbatch"
EOF
SLURM_CONF=$CONF sbatch --wait "$WORK/train.sbatch" >"$WORK/sbatch.out" 2>&1 ||
  { cat "$WORK/sbatch.out" "$WORK/sbatch.log"; die "the sbatch job failed"; }
run_ok "$WORK/sbatch.log" "$WORK/sbatch" "$((FIRST_JOB + 1))"

echo "== sbatch --wait, one hp-launch per node"
cat >"$WORK/launch.sbatch" <<EOF
#!/bin/bash
#SBATCH --job-name=hp-train
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --output=$WORK/launch.log
export MASTER_ADDR=\$(scontrol show hostnames "\$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=\$((15000 + SLURM_JOB_ID % 10000))
srun bash -c 'exec "$BIN/hp-launch" --nnodes "\$SLURM_NNODES" --node-rank "\$SLURM_NODEID" --nproc-per-node 2 \\
  --master-addr "\$MASTER_ADDR" --master-port "\$MASTER_PORT" --threads-per-worker 1 -- \\
  "$BIN/hp-train" "$WORK/c.yaml" ${common[*]} --set run.output_dir="$WORK/launch"'
EOF
SLURM_CONF=$CONF sbatch --wait "$WORK/launch.sbatch" >"$WORK/sbatch.out" 2>&1 ||
  { cat "$WORK/sbatch.out" "$WORK/launch.log"; die "the sbatch job with hp-launch failed"; }
port=$((15000 + (FIRST_JOB + 2) % 10000))
grep -qF "ranks from hp-launch variables; store at localhost:$port (address from MASTER_ADDR, port from MASTER_PORT)" "$WORK/launch.log" ||
  { cat "$WORK/launch.log"; die "launch.log: rank 0 is not at localhost:$port"; }
"$BIN/hp-compare" "$WORK/ref" "$WORK/launch" --exact --phase "Slurm placement" || die "$WORK/launch differs from the hp-launch run"
echo PASS
