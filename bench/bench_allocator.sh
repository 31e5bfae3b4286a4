#!/usr/bin/env bash
# The process allocator side by side (figures printed, never asserted):
# hp-train as shipped (mimalloc, hp::allocator) against the same hp-train
# on glibc's malloc (hp-bench-train-glibc), each with tensors of 64 KiB
# and more from the large block pool (run.large_block_pool, the default)
# and without it; all keep freed memory (run.keep_freed_memory). Cases at
# dp=2 (2 processes x 1 thread), STEPS steps: the MoE GPT (4 x 256, 8
# experts, top-2), the dense GPT (4 x 256), the dense GPT under ZeRO-1;
# with `big` also the 12 x 768 GPT for 6 steps. Every run twice (the same
# layout's peak can differ between launches). Per run: the largest rank's
# peak resident memory above its start after step 12 and after the last,
# and the median step time after the first two.
#   bash bench/bench_allocator.sh [steps=36] [big]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
STEPS=${1:-36}; BIG=${2:-}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
. bench/small_gpt_config.sh
small_gpt_config "$W/moe.yaml" 4 256 "$STEPS" moe
small_gpt_config "$W/dense.yaml" 4 256 "$STEPS"
small_gpt_config "$W/zero1.yaml" 4 256 "$STEPS"
printf 'features: {zero: {enabled: true, stage: 1}}\n' >> "$W/zero1.yaml"
small_gpt_config "$W/big.yaml" 12 768 6
run() {  # run CASE EXE POOL STEPS
  local out="$W/$1-$2-$3"
  rm -rf "$out"
  "$BIN/$2" "$W/$1.yaml" --nproc 2 --set run.output_dir="$out" --set training.max_steps="$4" \
    --set run.large_block_pool="$3" > "$out.log" 2>&1 || { tail -20 "$out.log"; exit 1; }
  python3 - "$out" "$1" "$2" "$3" <<'PY'
import json, statistics, sys
out, case, exe, pool = sys.argv[1:]
rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl") if l.strip()]
peaks = json.load(open(f"{out}/peaks.json"))
start = min(peaks["start_resident_memory_bytes"])
last = max(p - s for p, s in zip(peaks["peak_resident_memory_bytes"], peaks["start_resident_memory_bytes"]))
at12 = rows[min(11, len(rows) - 1)]["peak_resident_memory_bytes"] - start
step = statistics.median(r["step_seconds"] for r in rows[2:])
alloc = ("mimalloc" if exe == "hp-train" else "glibc") + (" + pool" if pool == "true" else "")
print(f"{case:6s} {alloc:16s} {len(rows):6d} {at12 / 2**20:16.0f} {last / 2**20:15.0f} {step:12.3f}")
PY
}
echo "case   allocator         steps  MiB after 12 (r0)  MiB at the end  median step s"
for c in moe dense zero1; do
  for exe in hp-train hp-bench-train-glibc; do
    for pool in true false; do
      for _ in 1 2; do run "$c" "$exe" "$pool" "$STEPS"; done
    done
  done
done
if [[ $BIG == big ]]; then
  for exe in hp-train hp-bench-train-glibc; do
    for pool in true false; do run big "$exe" "$pool" 6; done
  done
fi
