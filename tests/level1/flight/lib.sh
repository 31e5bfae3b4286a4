# Helpers for the flight recorder's tests: start a run in the background,
# find a worker by rank, wait for a line.
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/common.sh"

# wait_for FILE PATTERN SECONDS: polls until FILE has a line matching PATTERN.
wait_for() {
  local deadline=$(( $(date +%s) + $3 ))
  while (( $(date +%s) < deadline )); do
    grep -qE -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# wait_steps RUN_DIR N SECONDS: until metrics.jsonl has N lines.
wait_steps() {
  local deadline=$(( $(date +%s) + $3 ))
  while (( $(date +%s) < deadline )); do
    [[ -f "$1/metrics.jsonl" ]] && (( $(wc -l < "$1/metrics.jsonl") >= $2 )) && return 0
    sleep 0.1
  done
  return 1
}

# stall_case NAME NPROC VICTIM PATTERN ARGS...: a run whose rank VICTIM is
# SIGSTOPped after step 3 and SIGCONTed once the stall is reported. The report
# must match PATTERN within stall_seconds + 5 s; the run must then finish with
# the losses of an undisturbed run of the same layout (bitwise), which runs
# beside it. STEPS (default 150) must outlast the wait for step 3 and a
# heartbeat: a layout of 40-60 ms steps needs about 60, dp=2's 12 ms steps
# 150.
STALL=2
stall_case() {
  local name=$1 n=$2 victim=$3 pattern=$4; shift 4
  local args=(--nproc "$n" --set training.max_steps="${STEPS:-150}" --set distributed.stall_seconds=$STALL
              --set distributed.heartbeat_seconds=0.5 "$@")
  "$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" --set run.output_dir="$WORK/${name}_ref" > "$WORK/${name}_ref.log" 2>&1 &
  local ref=$!
  "$BIN/hp-train" "$WORK/c.yaml" "${args[@]}" --set run.output_dir="$WORK/$name" > "$WORK/$name.log" 2>&1 &
  local pid=$!
  # On a failure below (fail exits), the undisturbed run is stopped too.
  trap "kill $ref 2>/dev/null; rm -rf '$WORK'" EXIT
  wait_steps "$WORK/$name" 3 120 || { kill $pid; cat "$WORK/$name.log"; fail "$name: no step 3"; }
  # Stop it once its heartbeat has published a step (beats are 0.5 s apart).
  wait_for "$WORK/$name/flight/heartbeat-rank$(printf %05d "$victim").json" '"step":[1-9]' 30 \
    || { kill $pid; cat "$WORK/$name.log"; fail "$name: rank $victim published no step"; }
  local vpid
  vpid=$(worker_pid "$WORK/$name.log" "$victim") || { kill $pid; fail "$name: no worker of rank $victim"; }
  local t0; t0=$(date +%s.%N)
  kill -STOP "$vpid"
  if ! wait_for "$WORK/$name.log" "stall on group" $((STALL + 5)); then
    kill -CONT "$vpid"; kill $pid; wait $pid; cat "$WORK/$name.log"; fail "$name: no stall reported within $((STALL + 5)) s"
  fi
  local t1; t1=$(date +%s.%N)
  kill -CONT "$vpid"
  wait $pid || { cat "$WORK/$name.log"; fail "$name: the run did not finish after SIGCONT"; }
  wait $ref || { cat "$WORK/${name}_ref.log"; fail "$name: undisturbed run"; }
  trap 'rm -rf "$WORK"' EXIT  # common.sh's
  local line; line=$(grep -m1 "stall on group" "$WORK/$name.log")
  echo "$name: $(python3 -c "print(f'{$t1 - $t0:.2f}')") s from SIGSTOP to: ${line#*\] }"
  grep -qE -- "$pattern" <<<"$line" || fail "$name: the report does not match '$pattern': $line"
  "$BIN/hp-compare" "$WORK/${name}_ref" "$WORK/$name" --exact --phase "nondeterminism after a stall" > "$WORK/cmp" \
    || { cat "$WORK/cmp"; fail "$name: losses differ from the undisturbed run"; }
}
