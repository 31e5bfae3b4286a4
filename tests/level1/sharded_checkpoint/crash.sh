#!/usr/bin/env bash
# A worker SIGKILLed at a random point while background saves (every 2
# steps) are being written, in a chain of rounds: each round resumes from
# the `latest` the previous kill left (checked in its log) and is killed in
# turn, every round while its workers still train. Each job must end
# (a liveness bound of 10 s from the kill, not a timing: the other workers
# leave on hp-launch's SIGTERM, a background save in flight abandoned), the
# launcher must name the killed rank, and `latest` must load every time
# (hp-ckpt verify, then the next round's resume). A last run resumes from
# the last `latest` and finishes, and from there on it is bitwise equal to
# one uninterrupted run of the same config, layout and checkpoint cadence.
#   crash.sh BIN [dp2 | pp2tp2]   (dp2: 2 processes, 6-10 rounds, 200 steps; pp2tp2: 4, 3-4 rounds, 90 steps)
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
LAYOUT=${2:-dp2}
small_config "$WORK/c.yaml"
# Far enough that no round reaches the end before its kill, the same for
# every run so the schedule is the same. A round usually trains 4-10 steps
# past its resume, but a fast machine (or async saves that commit late) can
# take 20: the chain stops once `latest` passes MAX - MARGIN, and must have
# made MIN_ROUNDS rounds by then.
MAX=200; MARGIN=40
args=(--set checkpoint.interval=2 --set features.sharded_checkpoint.enabled=true
      --set features.sharded_checkpoint.async=true)
case $LAYOUT in
  dp2) NPROC=2; ROUNDS=10; MIN_ROUNDS=6 ;;
  pp2tp2) NPROC=4; ROUNDS=4; MIN_ROUNDS=3; MAX=90; MARGIN=30
    args+=(--set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
           --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2) ;;
  *) fail "unknown layout $LAYOUT (dp2 or pp2tp2)" ;;
esac
args+=(--set training.max_steps=$MAX)
"$BIN/hp-train" "$WORK/c.yaml" --nproc $NPROC "${args[@]}" --set run.output_dir="$WORK/ref" > "$WORK/ref.log" 2>&1 \
  || { tail -20 "$WORK/ref.log"; fail "the uninterrupted run"; }
at=""
for i in $(seq 1 $ROUNDS); do
  "$BIN/hp-train" "$WORK/c.yaml" --nproc $NPROC "${args[@]}" --set run.output_dir="$WORK/run" > "$WORK/log" 2>&1 &
  launcher=$!
  # Training has (re)started once this round has committed a step of its
  # own; then 0-2 more commits and a random moment (saves are every 2 steps,
  # written in the background, so the kill lands in a write or between).
  seen=$at
  for _ in $(seq 0 $(( RANDOM % 3 ))); do
    for _ in $(seq 1 1000); do
      [[ -f "$WORK/run/checkpoints/latest" && "$(cat "$WORK/run/checkpoints/latest")" != "$seen" ]] && break
      sleep 0.01
    done
    seen=$(cat "$WORK/run/checkpoints/latest" 2>/dev/null)
  done
  sleep "0.0$(( RANDOM % 10 ))"
  rank=$(( RANDOM % NPROC ))
  victim=$(worker_pid "$WORK/log" $rank || true)
  [[ -n "$victim" ]] && kill -0 "$victim" 2>/dev/null \
    || { tail -20 "$WORK/log"; fail "round $i: no worker of rank $rank to kill (the run ended?)"; }
  kill -9 "$victim" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$launcher" 2>/dev/null; then
    kill -9 "$launcher"; tail -20 "$WORK/log"
    fail "round $i: the job did not end within 10 s of killing rank $rank (a worker did not leave on SIGTERM)"
  fi
  wait "$launcher" && fail "round $i: the run succeeded although a worker was killed"
  grep -q "rank $rank failed: killed by signal 9" "$WORK/log" \
    || { tail -20 "$WORK/log"; fail "round $i: the launcher does not name rank $rank, killed by SIGKILL"; }
  if [[ -n "$at" ]]; then
    grep -q "resumed from .*$at" "$WORK/log" || { tail -20 "$WORK/log"; fail "round $i: did not resume from $at"; }
  fi
  [[ -f "$WORK/run/checkpoints/latest" ]] || { tail -5 "$WORK/log"; fail "round $i: no latest"; }
  "$BIN/hp-ckpt" verify "$WORK/run/checkpoints" > /dev/null || fail "round $i: latest does not verify"
  at=$(cat "$WORK/run/checkpoints/latest")
  stopped=$(grep -o "rank [0-9]* stopped by SIGTERM.*" "$WORK/log" | head -1 | cut -c1-160)
  echo "round $i: killed rank $rank; latest is $at${stopped:+; e.g. $stopped}"
  rounds=$i
  (( 10#${at#step_} < MAX - MARGIN )) || break
done
step=$(( 10#${at#step_} ))
(( step < MAX )) || fail "the chain reached step $MAX; raise MAX"
(( rounds >= MIN_ROUNDS )) || fail "only $rounds rounds before step $(( MAX - MARGIN )) (want $MIN_ROUNDS): rounds train too many steps"
# The last run reads the chain's checkpoints and logs into a fresh directory.
"$BIN/hp-train" "$WORK/c.yaml" --nproc $NPROC "${args[@]}" --set checkpoint.dir="$WORK/run/checkpoints" \
  --set run.output_dir="$WORK/last" > "$WORK/log" 2>&1 || { tail -20 "$WORK/log"; fail "the last resume from $at failed"; }
grep -q "resumed from .*$at at step $step" "$WORK/log" || fail "the last run did not resume from $at"
"$BIN/hp-compare" "$WORK/ref" "$WORK/last" --exact --from-step $(( step + 1 )) --phase "resume after the kill chain" \
  > "$WORK/cmp" || { tail -5 "$WORK/cmp"; fail "the resumed run is not bitwise the uninterrupted one"; }
grep -q "^compared $(( MAX - step )) steps" "$WORK/cmp" || { tail -3 "$WORK/cmp"; fail "not every step after $step compared"; }
tail -1 "$WORK/cmp"
echo PASS
