#!/usr/bin/env bash
# A rank that stops (SIGSTOP, by the test_faults plugin, after its first
# forward of step 3) while the others go on into the next collective of its
# group: under expert parallel that is the backward all-to-all of the MoE
# dispatch (group 'ep'); under zero it is the reduce-scatter of the gradient
# sync on 'dp' (Group::reduce_scatter: an all-to-all of the gradient
# slices, Gloo in LibTorch 1.13 having no reduce_scatter). The stall report
# names the group, the operation, the stopped rank and what the waiting
# rank is doing within stall_seconds + 5 s.
# Then the stopped rank is either let go (SIGCONT: the run finishes) or
# killed (SIGKILL: the launcher ends the job, the waiting rank's flight
# record holds the pending operation and hp-flight names it).
source "$(dirname "$0")/lib.sh"
BIN=$1
PLUGINS="$BIN/../tests/plugins"
small_config "$WORK/c.yaml"
STALL=2
# stop_case NAME MODE PATTERN ARGS...: MODE cont or kill; PATTERN is what the
# stall line must match.
stop_case() {
  local name=$1 mode=$2 pattern=$3; shift 3
  "$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set "plugins.path=[$PLUGINS]" --set features.test_faults.enabled=true \
    --set features.test_faults.stop_at_step=3 --set features.test_faults.throw_rank=1 --set training.max_steps=6 \
    --set distributed.stall_seconds=$STALL --set distributed.heartbeat_seconds=0.5 --set distributed.timeout_seconds=60 \
    --set run.output_dir="$WORK/$name" "$@" > "$WORK/$name.log" 2>&1 &
  local pid=$! vpid="" t0
  for _ in $(seq 1 1200); do  # up to 120 s for the start and 3 steps
    [[ -z "$vpid" ]] && vpid=$(worker_pid "$WORK/$name.log" 1)
    [[ -n "$vpid" ]] && [[ $(awk '{print $3}' "/proc/$vpid/stat" 2>/dev/null) == T ]] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  [[ -n "$vpid" && $(awk '{print $3}' "/proc/$vpid/stat" 2>/dev/null) == T ]] \
    || { kill $pid 2>/dev/null; wait $pid; cat "$WORK/$name.log"; fail "$name: rank 1 never stopped itself"; }
  t0=$(date +%s.%N)
  if ! wait_for "$WORK/$name.log" "stall on group" $((STALL + 5)); then
    kill -KILL "$vpid"; wait $pid; cat "$WORK/$name.log"; fail "$name: no stall reported within $((STALL + 5)) s"
  fi
  local line; line=$(grep -m1 "stall on group" "$WORK/$name.log")
  echo "$name: $(python3 -c "print(f'{$(date +%s.%N) - $t0:.2f}')") s from SIGSTOP to: ${line#*\] }"
  if [[ $mode == cont ]]; then
    kill -CONT "$vpid"
    wait $pid || { cat "$WORK/$name.log"; fail "$name: the run did not finish after SIGCONT"; }
  else
    kill -KILL "$vpid"
    wait $pid && fail "$name: the job ended with exit 0 although rank 1 was killed"
  fi
  grep -qE -- "$pattern" <<<"$line" || fail "$name: the report does not match '$pattern': $line"
}

# Expert parallel (MoE, ep=2 on 2 processes): rank 0 waits in the backward
# all-to-all of micro-batch 0; rank 1 is let go and the run finishes. Where
# rank 1 was last seen is not checked: its last heartbeat before the stop
# can be steps old (seen: "step 0, optimizer" and even "setup" for a stop in
# step index 2, on a loaded 2-core machine).
# shellcheck disable=SC2046
stop_case ep2 cont "stall on group 'ep': rank 1 has not entered all_to_all #[0-9]+ and its heartbeat stopped \(last seen in [^;]+; last heartbeat [0-9.]+ s ago\); rank 0 has waited [0-9.]+ s in all_to_all \(step [0-9]+, backward of micro-batch 0\)" \
  --set model.moe.num_experts=4 --set model.moe.top_k=2 --set features.expert_parallel.enabled=true \
  --set features.expert_parallel.size=2

# zero (dp=2): rank 0 waits in the gradient sync for a reduce-scatter it
# launched during backward (distributed.overlap), and the report says both;
# rank 1 is killed.
stop_case zero kill "stall on group 'dp': rank 1 has not entered reduce_scatter #[0-9]+ and its heartbeat stopped \(last seen in [^;]+; last heartbeat [0-9.]+ s ago\); rank 0 has waited [0-9.]+ s in reduce_scatter \(issued in step [0-9]+, backward of micro-batch [0-9]+; now in step [0-9]+, gradient sync\)" \
  --set features.zero.enabled=true
grep -qE "rank 1 \(pid [0-9]+\) failed: killed by signal 9 \(SIGKILL\)" "$WORK/zero.log" || { cat "$WORK/zero.log"; fail "zero: the summary does not name the killed rank"; }
[[ -s "$WORK/zero/flight/rank00000.json" ]] || { cat "$WORK/zero.log"; fail "zero: rank 0 wrote no flight record"; }
cmp=$("$BIN/hp-flight" "$WORK/zero/flight") || fail "hp-flight failed: $cmp"
echo "== hp-flight after the kill"; echo "$cmp" | head -12
grep -qE "^  rank 0: entered [0-9]+, completed [0-9]+, in reduce_scatter #[0-9]+ \([a-z ]+, step [0-9]+, (gradient sync|backward of micro-batch [0-9]+)\)" <<<"$cmp" \
  || fail "hp-flight does not show rank 0 waiting in the gradient sync's reduce_scatter: $cmp"
echo PASS
