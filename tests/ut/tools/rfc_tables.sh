#!/usr/bin/env bash
# The option tables in the RFCs are the ones the code declares: every row
# `hp-train --options-markdown` prints must stand verbatim in the RFC.
set -uo pipefail
HP_TRAIN=$1
DOCS=$2
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
check() {  # RFC FILE, rows
  local rfc=$1 rows=$2 missing=0
  while IFS= read -r row; do
    grep -qxF -- "$row" "$DOCS/$rfc" || { echo "not in $rfc: $row"; missing=1; }
  done <<<"$rows"
  [[ $missing -eq 0 ]] || fail "$rfc's option table is out of date: regenerate it with hp-train --options-markdown"
}
core=$("$HP_TRAIN" --options-markdown | grep '^| `') || fail "options-markdown failed"
check 0001-config-and-plugins.md "$core"
check 0007-flight-recorder.md "$(grep -E '^\| `distributed\.(flight_recorder|flight_entries|heartbeat_seconds|stall_seconds|on_stall)`' <<<"$core")"
printf 'features: {recompute: {enabled: true}}\n' > "$dir/r.yaml"
rec=$("$HP_TRAIN" "$dir/r.yaml" --options-markdown | grep '^| `features.recompute') || fail "recompute options"
check 0003-recompute.md "$rec"
printf 'data: {type: synthetic}\nfeatures: {tensor_parallel: {enabled: true}}\n' > "$dir/t.yaml"
tp=$("$HP_TRAIN" "$dir/t.yaml" --nproc 2 --options-markdown | grep '^| `features.tensor_parallel') || fail "tp options"
check 0004-tensor-parallel.md "$tp"
printf 'data: {type: synthetic}\nfeatures: {pipeline_parallel: {enabled: true}}\n' > "$dir/p.yaml"
pp=$("$HP_TRAIN" "$dir/p.yaml" --nproc 2 --options-markdown | grep '^| `features.pipeline_parallel') || fail "pp options"
check 0005-pipeline-parallel.md "$pp"
printf 'data: {type: synthetic}\nfeatures: {zero: {enabled: true}}\n' > "$dir/z.yaml"
zr=$("$HP_TRAIN" "$dir/z.yaml" --nproc 2 --options-markdown | grep '^| `features.zero') || fail "zero options"
check 0006-zero.md "$zr"
printf 'data: {type: synthetic}\nmodel: {moe: {num_experts: 4}}\nfeatures: {expert_parallel: {enabled: true}}\n' > "$dir/e.yaml"
er=$("$HP_TRAIN" "$dir/e.yaml" --nproc 2 --options-markdown | grep -E '^\| `(features.expert_parallel|model.moe)') || fail "ep options"
check 0008-expert-parallel.md "$er"
printf 'data: {type: synthetic}\nfeatures: {sharded_checkpoint: {enabled: true}}\n' > "$dir/s.yaml"
sc=$("$HP_TRAIN" "$dir/s.yaml" --options-markdown | grep '^| `features.sharded_checkpoint') || fail "sharded_checkpoint options"
check 0009-sharded-checkpoint.md "$sc"
printf 'data: {type: synthetic}\nfeatures: {context_parallel: {enabled: true}}\n' > "$dir/c.yaml"
cpr=$("$HP_TRAIN" "$dir/c.yaml" --nproc 2 --options-markdown | grep '^| `features.context_parallel') || fail "cp options"
check 0012-context-parallel.md "$cpr"
check 0013-per-module-degrees.md "$tp"
check 0013-per-module-degrees.md "$(grep -F 'features.expert_parallel.tensor_size' <<<"$er")"
echo PASS
