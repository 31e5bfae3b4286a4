#!/usr/bin/env bash
# Every shipped config is valid for the process count its header names
# ("--nproc N"; 1 when it names none): hp-train --dry-run exits 0.
# A config that reads a prepared corpus (data.prepare) has it made first by
# `hp-data prepare --config` into a temporary directory, from one fortune
# file with a small tokenizer (the shipped sizes take longer; the flow is
# the same).
set -uo pipefail
HP_TRAIN=$1
CONFIGS=$2
HP_DATA=$(dirname "$HP_TRAIN")/hp-data
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
n=0
for f in "$CONFIGS"/*.yaml; do
  nproc=$(head -3 "$f" | grep -o -- '--nproc [0-9]*' | head -1 | awk '{print $2}')
  nproc=${nproc:-1}
  extra=()
  if grep -q '^  prepare:' "$f"; then
    extra=(--set data.path="$W/corpus" --set data.prepare.tokenizer="$W/sp.model" --set data.prepare.train_vocab_size=600
           --set 'data.prepare.inputs=[/usr/share/games/fortunes/computers]')
    "$HP_DATA" prepare --config "$f" "${extra[@]}" > "$W/prepare.log" 2>&1 \
      || { cat "$W/prepare.log"; echo "FAIL: hp-data prepare --config $f"; exit 1; }
  fi
  out=$("$HP_TRAIN" "$f" --nproc "$nproc" --dry-run "${extra[@]}" 2>&1) || { echo "$out"; echo "FAIL: $f (--nproc $nproc)"; exit 1; }
  echo "ok: $(basename "$f") at $nproc processes"
  n=$((n + 1))
done
[[ $n -ge 4 ]] || { echo "FAIL: expected at least 4 configs in $CONFIGS, found $n"; exit 1; }
echo PASS
