#!/usr/bin/env bash
# The smallest real training loop: one process, loss falls, the checkpoint it
# wrote reloads and training continues from it.
source "$(dirname "$0")/../lib/common.sh"
BIN=$1
small_config "$WORK/c.yaml"
"$BIN/hp-train" "$WORK/c.yaml" --set run.output_dir="$WORK/run" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "training failed"; }
read -r first last <<<"$(first_last "$WORK/run")"
echo "loss $first -> $last"
python3 -c "import sys; sys.exit(0 if $last < 0.6 * $first else 1)" || fail "loss did not fall: $first -> $last"
[[ -f "$WORK/run/checkpoints/latest" ]] || fail "no checkpoint written"
[[ -f "$WORK/run/config.yaml" ]] || fail "resolved config not written"
# Reload: 5 more steps continue from step 20.
"$BIN/hp-train" "$WORK/c.yaml" --set run.output_dir="$WORK/run" --set training.max_steps=25 > "$WORK/log2" 2>&1 || { cat "$WORK/log2"; fail "resume failed"; }
grep -q "resumed from .*step_00000020 at step 20" "$WORK/log2" || { cat "$WORK/log2"; fail "did not resume"; }
grep -q "step 25/25" "$WORK/log2" || fail "did not train to step 25"
# Data and resume mistakes stop the run with a message naming the path.
mkdir -p "$WORK/empty_corpus"
out=$("$BIN/hp-train" "$WORK/c.yaml" --set data.type=text --set model.vocab_size=256 \
      --set data.path="$WORK/empty_corpus" --set run.output_dir="$WORK/e" 2>&1) && fail "empty corpus accepted"
grep -q "data.path = $WORK/empty_corpus: the corpus is empty" <<<"$out" || fail "$out"
printf 'short' > "$WORK/tiny.txt"
out=$("$BIN/hp-train" "$WORK/c.yaml" --set data.type=text --set model.vocab_size=256 \
      --set data.path="$WORK/tiny.txt" --set run.output_dir="$WORK/e" 2>&1) && fail "tiny corpus accepted"
grep -q "the corpus has 5 bytes, too few for one sample of 33 bytes in each split" <<<"$out" || fail "$out"
out=$("$BIN/hp-train" "$WORK/c.yaml" --set checkpoint.resume="$WORK" --set run.output_dir="$WORK/e" 2>&1) \
  && fail "bogus resume path accepted"
grep -q "checkpoint.resume = $WORK: neither a checkpoint step directory" <<<"$out" || fail "$out"
# The other shipped model and the other optimizers train too.
for variant in "model.type=mlp" "optimizer.type=adam" "optimizer.type=sgd --set optimizer.momentum=0.9 --set optimizer.lr=0.05"; do
  name=$(echo "$variant" | tr -c 'a-z0-9' '_')
  # shellcheck disable=SC2086
  "$BIN/hp-train" "$WORK/c.yaml" --set run.output_dir="$WORK/$name" --set $variant > "$WORK/log3" 2>&1 || { cat "$WORK/log3"; fail "$variant failed"; }
  read -r first last <<<"$(first_last "$WORK/$name")"
  echo "$variant: loss $first -> $last"
  python3 -c "import sys; sys.exit(0 if $last < 0.8 * $first else 1)" || fail "$variant: loss did not fall"
done
echo PASS
