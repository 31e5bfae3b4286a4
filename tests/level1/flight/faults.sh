#!/usr/bin/env bash
# A rank that throws mid-step: every rank's flight record is written and the
# launcher's summary points to them, and hp-flight compares them. Ranks that
# call different collectives at the same point are reported as a mismatch
# naming both calls.
source "$(dirname "$0")/lib.sh"
BIN=$1
PLUGINS="$BIN/../tests/plugins"
small_config "$WORK/c.yaml"
faults=(--set "plugins.path=[$PLUGINS]" --set features.test_faults.enabled=true --set training.max_steps=30)
out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${faults[@]}" --set features.test_faults.throw_at_step=3 \
      --set features.test_faults.throw_rank=1 --set run.output_dir="$WORK/throw" 2>&1); rc=$?
[[ $rc -ne 0 ]] || fail "a throwing rank ended with exit 0"
grep -q "injected fault on rank 1" <<<"$out" || fail "no fault text: $out"
for r in 0 1; do [[ -s "$WORK/throw/flight/rank0000$r.json" ]] || fail "no flight record of rank $r: $out"; done
grep -qF "flight records in $WORK/throw/flight: rank00000.json, rank00001.json; compare them with: hp-flight $WORK/throw/flight" <<<"$out" \
  || fail "the summary does not point to the records: $out"
cmp=$("$BIN/hp-flight" "$WORK/throw/flight") || fail "hp-flight failed: $cmp"
grep -q "rank 1: exception: .*injected fault on rank 1" <<<"$cmp" || fail "hp-flight: no reason for rank 1: $cmp"
grep -q "^group 'dp' ranks \[0,1\]:" <<<"$cmp" || fail "hp-flight: no dp comparison: $cmp"
echo "== hp-flight on the throwing run"; echo "$cmp" | head -12

out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${faults[@]}" --set features.test_faults.mismatch_at_step=3 \
      --set distributed.stall_seconds=2 --set distributed.heartbeat_seconds=0.5 --set distributed.timeout_seconds=20 \
      --set distributed.on_stall=abort --set run.output_dir="$WORK/mismatch" 2>&1); rc=$?
[[ $rc -ne 0 ]] || fail "a mismatched collective ended with exit 0: $out"
line=$(grep -m1 -E "collective mismatch|stall on group" <<<"$out")
echo "mismatch: ${line#*\] }"
grep -qE "collective mismatch on group 'dp' #[0-9]+: rank [01] calls (all_reduce|broadcast) \(4096 bytes\), rank [01] calls (all_reduce|broadcast) \(4096 bytes\)" <<<"$line" \
  || fail "the mismatch is not named: $out"
grep -q "all_reduce" <<<"$line" && grep -q "broadcast" <<<"$line" || fail "both calls must be named: $line"
grep -qE "rank [01]: aborting on a stall \(distributed.on_stall: abort\); flight record written to $WORK/mismatch/flight/rank0000[01].json" <<<"$out" \
  || fail "the abort does not say where the record is: $out"
mkdir -p "$WORK/empty"
out=$("$BIN/hp-flight" "$WORK/empty" 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "hp-flight on an empty directory: expected exit 2, got $rc"
grep -qF "hp-flight: no flight records (rank<RRRRR>.json) in $WORK/empty" <<<"$out" || fail "$out"
echo PASS
