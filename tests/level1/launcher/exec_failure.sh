#!/usr/bin/env bash
# A command that cannot be executed is rank 0 failing with exit code 127, and says why.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

run_launcher --nproc-per-node 2 -- hp-launch-test-no-such-command --flag
expect_rc 127
grep -qE "^hp-launch: rank 0 \(pid [0-9]+\) failed: exit code 127: cannot execute 'hp-launch-test-no-such-command': No such file or directory$" "$WORK/err" ||
  fail "no 'cannot execute' summary for a missing command"

printf 'echo hi\n' >"$WORK/not-executable"
run_launcher --nproc-per-node 1 -- "$WORK/not-executable"
expect_rc 127
expect_text err "cannot execute '$WORK/not-executable': Permission denied"
echo PASS
