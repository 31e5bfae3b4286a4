#!/usr/bin/env bash
# Every shipped config is valid for the process count its header names
# ("--nproc N"; 1 when it names none): hp-train --dry-run exits 0.
set -uo pipefail
HP_TRAIN=$1
CONFIGS=$2
n=0
for f in "$CONFIGS"/*.yaml; do
  nproc=$(head -3 "$f" | grep -o -- '--nproc [0-9]*' | head -1 | awk '{print $2}')
  nproc=${nproc:-1}
  out=$("$HP_TRAIN" "$f" --nproc "$nproc" --dry-run 2>&1) || { echo "$out"; echo "FAIL: $f (--nproc $nproc)"; exit 1; }
  echo "ok: $(basename "$f") at $nproc processes"
  n=$((n + 1))
done
[[ $n -ge 4 ]] || { echo "FAIL: expected at least 4 configs in $CONFIGS, found $n"; exit 1; }
echo PASS
