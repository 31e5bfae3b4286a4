# Helpers for the layout-combination tests: runs from small_config with one
# reference run per script, compared by hp-compare at docs/PARITY.md's bars.
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/common.sh"

# Dropout of every run (docs/PARITY.md: parity tests run with dropout on; masks
# must not depend on the layout). HP_TEST_DROPOUT=0 shows whether a failure
# is the dropout masks or something else.
DROPOUT=${HP_TEST_DROPOUT:-0.1}
# 20-step trajectories, evaluation at steps 10 and 20, step-1 gradients; a
# given peak skips the start-up FLOP probe (0.8 s a run).
COMMON=(--set model.dropout="$DROPOUT" --set training.max_steps=20 --set training.eval_interval=10
        --set training.dump_grads_at_step=1 --set metrics.peak_flops=1e10)

pp() { echo --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size="$1"; }
# Interleaved 1F1B with two chunks per rank.
ppi() { echo "$(pp "$1") --set features.pipeline_parallel.schedule=interleaved_1f1b --set features.pipeline_parallel.virtual_stages=2"; }
tp() { echo --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size="$1"; }
sp() { echo --set features.tensor_parallel.sequence_parallel=true; }
ep() { echo --set features.expert_parallel.enabled=true --set features.expert_parallel.size="$1"; }
zero() { echo --set features.zero.enabled=true; }
# Block attention (model.attention: block) with a block length (12) that does
# not divide small_config's seq_len (32).
blk() { echo --set model.attention=block --set model.attention_block=12; }
rc() { echo --set features.recompute.enabled=true --set features.recompute.granularity="$1"; }

# run NAME NPROC MESH ARGS...: one run of $CONFIG into $WORK/NAME; MESH, when
# not empty, is the "pp=.. dp=.. tp=.." the log must show. A lone process
# gets one thread, as each of the two on two cores does: with two threads
# on a loaded machine (other tests, a build) each step waits for both to be
# scheduled, and a 20-step reference took 115 s instead of 5.
run() {
  local name=$1 n=$2 mesh=$3; shift 3
  local t0=$SECONDS
  local how=(env HP_INTRA_OP_THREADS=1 "$BIN/hp-train" "$CONFIG")
  ((n > 1)) && how=("$BIN/hp-train" "$CONFIG" --nproc "$n")
  "${how[@]}" "${COMMON[@]}" "$@" --set run.output_dir="$WORK/$name" > "$WORK/$name.log" 2>&1 \
    || { tail -20 "$WORK/$name.log"; fail "$name run (hp-train $*)"; }
  if [[ -n "$mesh" ]]; then grep -q "mesh $mesh" "$WORK/$name.log" || fail "$name: the log does not show mesh $mesh"; fi
  echo "-- $name: $n processes, $((SECONDS - t0)) s"
}

# parity REF RUN PHASE: docs/PARITY.md's bar for TP, DP, EP, ZeRO and their
# combinations against one process.
parity() {
  echo "== $2 against $1"
  "$BIN/hp-compare" "$WORK/$1" "$WORK/$2" --grads-step 1 --first-loss-rtol 1e-5 --loss-rtol 1e-4 --eval-rtol 1e-5 --grad-rtol 1e-5 \
    --phase "$3" > "$WORK/cmp" 2>&1
  report_cmp $? "$2 against $1 ($3)"
}

# bitwise REF RUN PHASE: losses and every step-1 gradient bitwise equal.
bitwise() {
  echo "== $2 against $1, bitwise"
  "$BIN/hp-compare" "$WORK/$1" "$WORK/$2" --exact --grads-step 1 --grad-rtol 0 --phase "$3" > "$WORK/cmp" 2>&1
  report_cmp $? "$2 against $1, bitwise ($3)"
}

# report_cmp RC WHAT: the summary of $WORK/cmp when hp-compare passed, all
# of it (the table) when it did not.
report_cmp() {
  if [[ $1 -eq 0 ]]; then tail -3 "$WORK/cmp"; else cat "$WORK/cmp"; FAILED+=("$2"); fi
}

# Every comparison runs; the script fails at the end naming each that broke.
FAILED=()
finish() {
  if ((${#FAILED[@]})); then
    printf 'broke its bar: %s\n' "${FAILED[@]}" >&2
    fail "${#FAILED[@]} comparison(s) broke their bar (dropout $DROPOUT)"
  fi
  echo PASS
}
