#!/usr/bin/env bash
# Elastic restart: torchrun (static rendezvous, 2 workers, --max_restarts 3)
# runs 16 steps with a checkpoint every 4; one worker is SIGKILLed once a
# checkpoint is committed. torchrun stops the other, starts both again
# (TORCHELASTIC_RESTART_COUNT=1: the store keys move to /worker/attempt_1,
# so the new attempt never meets the old one's), hp-train resumes from
# `latest`, and every logged loss is bitwise equal to an uninterrupted run
# (hp-launch, 1 intra-op thread per worker like torchrun's workers).
source "$(dirname "$0")/real_launchers.sh"
small_config "$WORK/c.yaml"
args=(--set training.max_steps=16 --set checkpoint.interval=4 --set training.eval_interval=4
      --set distributed.timeout_seconds=60)
reference_run "$WORK/c.yaml" "$WORK/ref" "${args[@]}"
port=$(free_port)
out="$WORK/elastic"
(unset OMP_NUM_THREADS
 exec timeout -k 5 240 "${TORCHRUN[@]}" --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port" \
   --max_restarts 3 --monitor_interval 0.2 --log_dir "$WORK/tlog" \
   --no_python "$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" --set run.output_dir="$out") > "$WORK/elastic.log" 2>&1 &
agent=$!
STARTED+=("$agent")

# The worker whose environment says RANK=1, among the agent's children.
rank1_pid() {
  local p
  for p in $(pgrep -P "$agent" 2>/dev/null) $(pgrep -P "$(pgrep -P "$agent" | head -1)" 2>/dev/null); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "RANK=1" && { echo "$p"; return 0; }
  done
  return 1
}
killed=""
for _ in $(seq 1 1200); do
  if [[ -f "$out/checkpoints/latest" ]] && pid=$(rank1_pid); then
    at=$(cat "$out/checkpoints/latest")
    kill -KILL "$pid" && killed=$at && break
  fi
  kill -0 "$agent" 2>/dev/null || break
  sleep 0.05
done
[[ -n "$killed" ]] || { wait "$agent"; tail -30 "$WORK/elastic.log"; fail "no worker to kill after a checkpoint (the run ended first?)"; }
echo "SIGKILLed rank 1 (pid $pid) with latest = $killed"
wait "$agent" || { rc=$?; tail -40 "$WORK/elastic.log"; fail "torchrun did not finish the job after the restart (exit $rc)"; }
# torchrun reports the failure and restarts the group as attempt 1.
expect_in "$WORK/elastic.log" "keys under /worker/attempt_1" "the restarted attempt's start line"
grep -E "resumed from .*step_[0-9]+ at step [0-9]+" "$WORK/elastic.log" | sed 's/^.*\] \[info\] /  /' \
  || { tail -40 "$WORK/elastic.log"; fail "the restarted workers did not resume from a checkpoint"; }
[[ "$(cat "$out/checkpoints/latest")" == "step_00000016" ]] || fail "latest is $(cat "$out/checkpoints/latest"), not step 16"
show_start_lines "$WORK/elastic.log"
"$BIN/hp-compare" "$WORK/ref" "$out" --exact --phase "resume after torchrun's restart" > "$WORK/cmp" \
  || { cat "$WORK/cmp"; fail "the restarted run is not bitwise the uninterrupted one"; }
grep -q "^compared 16 steps" "$WORK/cmp" || { cat "$WORK/cmp"; fail "not all 16 steps compared"; }
cat "$WORK/cmp" | tail -2
echo PASS
