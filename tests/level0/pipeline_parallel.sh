#!/usr/bin/env bash
# The smallest pipeline loops: 2 stages, each schedule, loss falls; bad
# pipeline options are config errors (exit 2, before any process starts).
source "$(dirname "$0")/../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
pp=(--set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2)
for s in gpipe 1f1b interleaved_1f1b; do
  "$BIN/hp-train" "$WORK/c.yaml" --nproc 2 "${pp[@]}" --set features.pipeline_parallel.schedule=$s \
    --set features.pipeline_parallel.virtual_stages=$([[ $s == interleaved_1f1b ]] && echo 2 || echo 1) \
    --set run.output_dir="$WORK/$s" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "$s: training failed"; }
  grep -q "pipeline: 2 stages" "$WORK/log" || fail "$s: the split was not printed"
  read -r first last <<<"$(first_last "$WORK/$s")"
  echo "$s: loss $first -> $last"
  python3 -c "import sys; sys.exit(0 if $last < 0.6 * $first else 1)" || fail "$s: loss did not fall"
done
refuse() {  # expected-text, args...
  local want=$1; shift
  out=$("$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --dry-run "${pp[@]}" "$@" 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "expected exit 2, got $rc for $*: $out"
  grep -qF -- "$want" <<<"$out" || fail "expected '$want' for $*, got: $out"
  echo "refused: $(grep -F -- "$want" <<<"$out" | head -1)"
}
refuse "features.pipeline_parallel.balance = [4, 0]: element 0 is out of range" --set 'features.pipeline_parallel.balance=[4,0]'
refuse "balance lists 3 blocks; the model has 4" --set 'features.pipeline_parallel.balance=[1,2]'
refuse "features.pipeline_parallel.num_microbatches = 3: must equal global_batch_size / (micro_batch_size x dp) = 8 / (2 x 1) = 4" \
  --set features.pipeline_parallel.num_microbatches=3
refuse "features.pipeline_parallel.virtual_stages = 2: more than one chunk per rank needs schedule interleaved_1f1b" \
  --set features.pipeline_parallel.virtual_stages=2
refuse "model.tie_embeddings = true: tied embeddings across pipeline stages are not supported yet" \
  --set model.tie_embeddings=true
refuse "need at least 8 blocks" --set features.pipeline_parallel.schedule=interleaved_1f1b \
  --set features.pipeline_parallel.virtual_stages=4
echo PASS
