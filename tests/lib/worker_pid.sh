# worker_pid LOG RANK: the pid of RANK's worker, from the line hp-launch
# (and hp-train --nproc) writes to LOG once its workers started ("workers
# started (...): rank 0 pid 123, rank 1 pid 124"); fails when LOG has no
# such line. hp-train's workers are forks of the launcher, so
# /proc/PID/environ does not show their RANK. Sourced by tests/lib/common.sh
# and bench/lib.sh.
worker_pid() {
  local p
  p=$(sed -n "s/^hp-launch: workers started .*[:,] rank $2 pid \([0-9]*\).*/\1/p" "$1" 2>/dev/null | head -1)
  [[ -n "$p" ]] && echo "$p"
}
