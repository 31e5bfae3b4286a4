#!/usr/bin/env bash
# Checkpoint save and load, side by side in one run (figures printed, never
# asserted): the built-in gathered writer against features.sharded_checkpoint
# at dp=2, tp=2 and pp=2 x tp=2, beside the disk's sequential write speed
# measured by dd (with fsync, as the checkpoint writer does) in the same run;
# the largest resident-memory rise of any rank during a save; and step time
# with a background (async) save every 10 steps against saving only at the end.
#   bash bench/bench_checkpoint.sh [hidden=512] [layers=4]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
H=${1:-512}; L=${2:-4}
W=$(mktemp -d "${TMPDIR:-/tmp}/hp_bench_ckpt.XXXXXX"); trap 'rm -rf "$W"' EXIT
cat > "$W/c.yaml" <<YAML
model: {type: gpt, layers: $L, hidden: $H, heads: 8, seq_len: 64}
data: {type: text}
training: {max_steps: 12, global_batch_size: 8, micro_batch_size: 2, log_interval: 1}
optimizer: {type: adamw, lr: 0.001, schedule: constant}
checkpoint: {interval: 4, resume: never}
YAML
# New files each time, as a checkpoint writes (rewriting a just-deleted
# file is faster here and would flatter the disk); three, the median is used.
for i in 1 2 3; do
  dd if=/dev/zero of="$W/dd$i.bin" bs=4M count=100 conv=fsync 2>> "$W/dd.txt"
done
rm -f "$W"/dd*.bin
layout() {
  case $1 in
    dp2) echo "--nproc 2" ;;
    tp2) echo "--nproc 2 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2" ;;
    pp2tp2) echo "--nproc 4 --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2
                 --set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2" ;;
  esac
}
for lay in dp2 tp2 pp2tp2; do
  for io in gathered sharded; do
    name="${lay}_$io"
    feat=(); [[ $io == sharded ]] && feat=(--set features.sharded_checkpoint.enabled=true)
    # shellcheck disable=SC2046
    "$BIN/hp-train" "$W/c.yaml" $(layout $lay) "${feat[@]}" --set run.output_dir="$W/$name" \
      > "$W/$name.log" 2>&1 || { tail -20 "$W/$name.log"; exit 1; }
    # The load: a resume of the step-12 checkpoint, one step more.
    # shellcheck disable=SC2046
    "$BIN/hp-train" "$W/c.yaml" $(layout $lay) "${feat[@]}" --set run.output_dir="$W/${name}_load" \
      --set checkpoint.resume="$W/$name/checkpoints/step_00000012" --set training.max_steps=13 \
      > "$W/${name}_load.log" 2>&1 || { tail -20 "$W/${name}_load.log"; exit 1; }
  done
done
for rep in 1 2; do for mode in end async; do  # alternating, twice: the figure is noisy on 2 cores
  name="steps_${mode}_$rep"
  args=(--set training.max_steps=41 --set features.sharded_checkpoint.enabled=true)
  [[ $mode == async ]] && args+=(--set checkpoint.interval=10 --set features.sharded_checkpoint.async=true)
  [[ $mode == end ]] && args+=(--set checkpoint.interval=0)
  "$BIN/hp-train" "$W/c.yaml" --nproc 2 "${args[@]}" --set run.output_dir="$W/$name" > "$W/$name.log" 2>&1 \
    || { tail -20 "$W/$name.log"; exit 1; }
done; done
python3 - "$W" "$H" "$L" <<'PY'
import glob, json, os, re, sys
w, H, L = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dd = open(f"{w}/dd.txt").read()
runs = sorted(int(b) / float(t) for b, t in re.findall(r"(\d+) bytes .* copied, ([\d.]+) s", dd))
dd_bps = runs[len(runs) // 2]
def saves(name):
    return [float(x) for x in re.findall(r"checkpoint step \d+ saved to .* \(([\d.]+) s\)", open(f"{w}/{name}.log").read())]
def load(name):
    return float(re.search(r"resumed from .* \(([\d.]+) s\)", open(f"{w}/{name}_load.log").read()).group(1))
def rise(name):
    return max(float(x) for x in re.findall(r"resident memory rose ([\d.]+) MiB during the save", open(f"{w}/{name}.log").read()))
def bytes_per_rank(name):
    d = f"{w}/{name}/checkpoints/step_00000012"
    out = {}
    for f in glob.glob(d + "/*-rank*.safetensors"):
        r = int(re.search(r"rank(\d+)", f).group(1))
        out[r] = out.get(r, 0) + os.path.getsize(f)
    return out
print(f"GPT {L} layers x {H} wide, AdamW; disk: dd with fsync writes {dd_bps / 1e6:.0f} MB/s "
      f"(median of {', '.join('%.0f' % (r / 1e6) for r in runs)})")
print(f"{'layout':>7s} {'writer':>8s} {'save s':>7s} {'load s':>7s} {'ranks writing':>13s} {'MB/rank max':>11s} "
      f"{'MB/s busiest rank':>17s} {'total MB':>8s} {'MB/s all ranks':>14s} {'% of dd':>7s} {'RSS rise MiB':>12s}")
for lay in ("dp2", "tp2", "pp2tp2"):
    for io in ("gathered", "sharded"):
        name = f"{lay}_{io}"
        s = saves(name)
        sec = sorted(s[1:])[len(s[1:]) // 2] if len(s) > 1 else s[0]  # median, first save warms up
        b = bytes_per_rank(name)
        busiest = max(b.values())
        print(f"{lay:>7s} {io:>8s} {sec:7.3f} {load(name):7.3f} {len(b):>13d} {busiest / 1e6:11.1f} "
              f"{busiest / sec / 1e6:17.0f} {sum(b.values()) / 1e6:8.1f} {sum(b.values()) / sec / 1e6:14.0f} "
              f"{100 * sum(b.values()) / sec / dd_bps:6.0f}% {rise(name):12.1f}")
print("(the ranks share one disk here: 'MB/s all ranks' is the figure to hold against dd's)")
def step_time(name):
    r = [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if l.strip()][1:]
    return sum(x["step_seconds"] for x in r) / len(r)
for rep in (1, 2):
    a, b = step_time(f"steps_end_{rep}"), step_time(f"steps_async_{rep}")
    print(f"dp=2 step time (run {rep}): async sharded save every 10 steps {b:.4f} s vs no save until the end "
          f"{a:.4f} s ({100 * (b / a - 1):+.1f}%)")
PY
