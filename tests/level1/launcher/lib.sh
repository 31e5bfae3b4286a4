# Helpers shared by the hp-launch tests. Sourced with the path of hp-launch as $1.
export LC_ALL=C  # EPOCHREALTIME must use '.' for the arithmetic below

LAUNCHER=${1:?"usage: $0 path/to/hp-launch"}
[[ -x $LAUNCHER ]] || { echo "FAIL: '$LAUNCHER' is not an executable" >&2; exit 1; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hp-launch-test.XXXXXX")
export WORK
LAUNCHER_PID=
RC=
ELAPSED=

cleanup() {
  # Only the launcher we started; its workers die with it (PR_SET_PDEATHSIG).
  if [[ -n $LAUNCHER_PID ]]; then kill -KILL "$LAUNCHER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

show_output() {
  local f
  for f in "$WORK/out" "$WORK/err"; do
    if [[ -f $f ]]; then { echo "--- $(basename "$f"):"; cat "$f"; } >&2; fi
  done
}

fail() {
  echo "FAIL: $*" >&2
  show_output
  exit 1
}

# Runs hp-launch in the foreground with stdout in $WORK/out and stderr in $WORK/err; sets RC.
run_launcher() {
  RC=0
  "$LAUNCHER" "$@" >"$WORK/out" 2>"$WORK/err" || RC=$?
}

# Starts hp-launch in the background; sets LAUNCHER_PID.
start_launcher() {
  "$LAUNCHER" "$@" >"$WORK/out" 2>"$WORK/err" &
  LAUNCHER_PID=$!
}

now() { echo "$EPOCHREALTIME"; }

seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

less_than() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

proc_state() {
  local stat
  { stat=$(<"/proc/$1/stat"); } 2>/dev/null || return 0
  stat=${stat##*) }
  echo "${stat%% *}"
}

# Waits up to $1 seconds for the background launcher to end, measuring from time $2.
# Sets RC and ELAPSED; a launcher still running after the limit is killed and the test fails.
wait_launcher() {
  local limit=$1 start=$2 state
  while true; do
    state=$(proc_state "$LAUNCHER_PID")
    [[ -z $state || $state == Z ]] && break
    if ! less_than "$(seconds_since "$start")" "$limit"; then
      kill -KILL "$LAUNCHER_PID" 2>/dev/null || true
      wait "$LAUNCHER_PID" 2>/dev/null || true
      LAUNCHER_PID=
      fail "hp-launch still running after $limit s"
    fi
    sleep 0.02
  done
  ELAPSED=$(seconds_since "$start")
  RC=0
  wait "$LAUNCHER_PID" || RC=$?
  LAUNCHER_PID=
}

# Waits up to $1 seconds until every following file exists and is not empty.
wait_for_files() {
  local limit=$1 start f missing
  shift
  start=$(now)
  while true; do
    missing=
    for f in "$@"; do [[ -s $f ]] || missing=$f; done
    [[ -z $missing ]] && return 0
    less_than "$(seconds_since "$start")" "$limit" || fail "$missing did not appear within $limit s"
    sleep 0.02
  done
}

# Live (not zombie) processes in process group $1.
group_members() {
  local f stat state ppid pgrp rest
  for f in /proc/[0-9]*/stat; do
    { stat=$(<"$f"); } 2>/dev/null || continue
    read -r state ppid pgrp rest <<<"${stat##*) }"
    if [[ $pgrp == "$1" && $state != Z ]]; then
      f=${f#/proc/}
      echo "${f%/stat}"
    fi
  done
}

# Each worker pid must be gone at once, and the rest of its process group within a second.
expect_gone() {
  local pid start
  for pid in "$@"; do
    if kill -0 "$pid" 2>/dev/null && [[ $(proc_state "$pid") != Z ]]; then
      fail "worker pid $pid is still running after hp-launch exited"
    fi
  done
  start=$(now)
  for pid in "$@"; do
    while [[ -n $(group_members "$pid") ]]; do
      less_than "$(seconds_since "$start")" 1 ||
        fail "process group $pid still has live processes: $(group_members "$pid" | tr '\n' ' ')"
      sleep 0.05
    done
  done
}

expect_rc() { [[ $RC == "$1" ]] || fail "expected exit code $1, got $RC"; }

expect_line() { grep -qxF -- "$2" "$WORK/$1" || fail "$1 lacks the line: $2"; }

expect_text() { grep -qF -- "$2" "$WORK/$1" || fail "$1 lacks: $2"; }

reject_text() { ! grep -qF -- "$2" "$WORK/$1" || fail "$1 should not contain: $2"; }
