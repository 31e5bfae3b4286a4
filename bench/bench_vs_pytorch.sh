#!/usr/bin/env bash
# hyperparallel vs PyTorch on the same GPT (figures printed, never asserted).
# The gpt of model.type: gpt, and its plain-PyTorch twin in
# bench/pytorch_gpt_ddp.py (same parameter count, checked: the bench stops if
# they differ), trained on the same byte tokens of the fortunes corpus
# (data.type: text; the sample order differs), AdamW, gradient clip 1.0,
# global batch 8 in micro-batches of 2, seq 128, at two sizes: 4 layers x 256
# (4 heads) and 12 x 768 (12 heads). Layouts: 1 process x 2 threads, and
# 2 processes x 1 thread (dp = 2): hp through hp-launch, PyTorch through
# torchrun with DDP over Gloo (no_sync on all but the last micro-batch,
# torch.set_num_threads = cores / ranks). Variants at dp = 2: bucket 1 MB and
# hp's default distributed.bucket_size_mb (DDP bucket_cap_mb set alike),
# distributed.overlap true and false when hp-train offers that option, hp
# with its all-reduce on Gloo (distributed.shm_collectives false, the
# transport DDP uses) beside its default shared memory, and
# ZeRO (hp features.zero.enabled; PyTorch ZeroRedundancyOptimizer).
# Repetitions are interleaved (A B C A B C ...); each run's first steps are
# warm-up; a run's figure is its measured tokens / its measured seconds; the
# table gives per variant the median over repetitions and, for hp, the ratio to
# the matching PyTorch variant. Then one profiled hp dp = 2 run per bucket size
# (overlap on when offered) gives the fraction of gradient-reduction time
# hidden behind backward (bench/trace_overlap.py).
#   bash bench/bench_vs_pytorch.sh
# BENCH_MODEL=llama compares model.type: llama instead (RMSNorm, rotary
# positions, SwiGLU, grouped-query attention; the twin's --model llama) at
# small 4 x 256 (8 heads, 2 key/value heads, ffn 688) and large 12 x 768
# (12 heads, 4 key/value heads, ffn 2048).
# Environment: HP_BIN (default build/bin), BENCH_PYTHON (a python with torch;
# default /usr/bin/python3, Debian's torch), BENCH_REPS (5), BENCH_SIZES
# ("small large"), BENCH_STEPS_SMALL (20), BENCH_STEPS_LARGE (6),
# BENCH_WARMUP (3 steps skipped per run), BENCH_BUCKET (the second bucket
# size besides 1 MB; default: hp's distributed.bucket_size_mb default),
# BENCH_ONLY (an extended regular
# expression: only the variants whose "size/name" matches run, e.g.
# 'small/|large/(pt|hp)_2x1'), BENCH_QUICK=1 (smoke test: 1
# repetition, 4 steps with 2 of warm-up, small size only unless BENCH_SIZES
# says otherwise). The figures mean something only on an otherwise idle
# machine (the load average is printed before and after): other work on the
# cores hurts most the 1 x 2 layouts, whose parallel regions wait for both
# threads. The full run is about 50 minutes on an idle 2-core machine (an
# estimate: 10 variants x 5 repetitions per size, the large steps ~5 s each,
# plus each hp run's final checkpoint); BENCH_QUICK=1 about 3 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${HP_BIN:-build/bin}
PY=${BENCH_PYTHON:-/usr/bin/python3}
if [[ "${BENCH_QUICK:-0}" == 1 ]]; then
  REPS=${BENCH_REPS:-1}; SIZES=${BENCH_SIZES:-small}
  STEPS_SMALL=${BENCH_STEPS_SMALL:-4}; STEPS_LARGE=${BENCH_STEPS_LARGE:-4}; WARMUP=${BENCH_WARMUP:-2}
else
  REPS=${BENCH_REPS:-5}; SIZES=${BENCH_SIZES:-small large}
  STEPS_SMALL=${BENCH_STEPS_SMALL:-20}; STEPS_LARGE=${BENCH_STEPS_LARGE:-6}; WARMUP=${BENCH_WARMUP:-3}
fi
GB=8; MB=2; T=128
CORES=$(nproc)
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
for f in "$BIN/hp-train" "$BIN/hp-launch"; do
  [[ -x "$f" ]] || { echo "bench_vs_pytorch: $f is missing: build first, or set HP_BIN to the directory of hp-train and hp-launch"; exit 1; }
done
"$PY" -c 'import torch' 2>/dev/null || { echo "bench_vs_pytorch: $PY cannot import torch: set BENCH_PYTHON to a python with torch (Debian: python3-torch)"; exit 1; }
W=$(mktemp -d "${TMPDIR:-/tmp}/hp_bench_vs_pytorch.XXXXXX")
trap 'rm -rf "$W"' EXIT

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($CORES cores)"
"$BIN/hp-train" --options-markdown > "$W/options.md"
DEF_BUCKET=${BENCH_BUCKET:-$(sed -n 's/^| `distributed.bucket_size_mb` | float | `\([^`]*\)`.*/\1/p' "$W/options.md")}
[[ -n "$DEF_BUCKET" ]] || { echo "bench_vs_pytorch: no distributed.bucket_size_mb default in hp-train --options-markdown"; exit 1; }
SHM=no
grep -q '^| `distributed.shm_collectives`' "$W/options.md" && SHM=yes
if grep -q '^| `distributed.overlap`' "$W/options.md"; then
  OVERLAP=(true false)
else
  OVERLAP=()
  echo "distributed.overlap: not an option of this hp-train: its overlap on/off variants are skipped"
fi

# name|framework|ranks|bucket MB|overlap|zero|matching PyTorch variant
variants() {
  echo "pt_1x2|pytorch|1|-|-|no|"
  echo "hp_1x2|hp|1|-|-|no|pt_1x2"
  for b in 1 "$DEF_BUCKET"; do
    echo "pt_2x1_b$b|pytorch|2|$b|-|no|"
    if ((${#OVERLAP[@]})); then
      for o in "${OVERLAP[@]}"; do echo "hp_2x1_b${b}_overlap_$o|hp|2|$b|$o|no|pt_2x1_b$b"; done
    else
      echo "hp_2x1_b$b|hp|2|$b|default|no|pt_2x1_b$b"
    fi
  done
  # hp's all-reduce through shared memory (its default) against Gloo's TCP,
  # the transport DDP uses: the same run with distributed.shm_collectives false.
  if [[ $SHM == yes ]]; then
    o=default; ((${#OVERLAP[@]})) && o=true
    echo "hp_2x1_b${DEF_BUCKET}_gloo|hp|2|$DEF_BUCKET|$o|no|pt_2x1_b$DEF_BUCKET"
  fi
  echo "pt_2x1_zero|pytorch|2|$DEF_BUCKET|-|yes|"
  echo "hp_2x1_zero|hp|2|$DEF_BUCKET|default|yes|pt_2x1_zero"
}

MODEL=${BENCH_MODEL:-gpt}
[[ $MODEL == gpt || $MODEL == llama ]] || { echo "bench_vs_pytorch: BENCH_MODEL '$MODEL' (legal: gpt, llama)"; exit 1; }
size_shape() {  # layers hidden heads kv_heads ffn steps
  case "$MODEL/$1" in
    gpt/small) echo "4 256 4 4 1024 $STEPS_SMALL" ;;
    gpt/large) echo "12 768 12 12 3072 $STEPS_LARGE" ;;
    llama/small) echo "4 256 8 2 688 $STEPS_SMALL" ;;
    llama/large) echo "12 768 12 4 2048 $STEPS_LARGE" ;;
    *) echo "bench_vs_pytorch: BENCH_SIZES: unknown size '$1' (legal: small, large)" >&2; exit 1 ;;
  esac
}

# run_hp SIZE NAME RANKS BUCKET OVERLAP ZERO OUTDIR [extra --set ...]
run_hp() {
  local size=$1 name=$2 ranks=$3 bucket=$4 overlap=$5 zero=$6 out=$7; shift 7
  local sets=(--set run.output_dir="$out")
  [[ "$bucket" != - ]] && sets+=(--set distributed.bucket_size_mb="$bucket")
  [[ "$overlap" == true || "$overlap" == false ]] && sets+=(--set distributed.overlap="$overlap")
  [[ "$zero" == yes ]] && sets+=(--set features.zero.enabled=true)
  [[ "$name" == *_gloo ]] && sets+=(--set distributed.shm_collectives=false)
  "$BIN/hp-launch" --nproc-per-node "$ranks" --threads-per-worker $((CORES / ranks)) -- \
    "$BIN/hp-train" "$W/$size.yaml" "${sets[@]}" "$@" > "$out.log" 2>&1 || {
    tail -30 "$out.log"; echo "bench_vs_pytorch: hp run $size $name failed (log above)"; exit 1; }
}

for size in $SIZES; do
  read -r L H NH KV FFN STEPS <<< "$(size_shape "$size")"
  TWIN=(--model "$MODEL" --kv-heads "$KV" --ffn "$FFN")
  KVKEY=""
  [[ $MODEL == llama ]] && KVKEY=", kv_heads: $KV"
  ((STEPS > WARMUP)) || { echo "bench_vs_pytorch: steps ($STEPS) must exceed BENCH_WARMUP ($WARMUP)"; exit 1; }
  cat > "$W/$size.yaml" <<YAML
model: {type: $MODEL, layers: $L, hidden: $H, heads: $NH, seq_len: $T, ffn_hidden: $FFN$KVKEY}
data: {type: text}
training: {max_steps: $STEPS, global_batch_size: $GB, micro_batch_size: $MB, log_interval: 1}
optimizer: {type: adamw, lr: 0.001, schedule: constant}
checkpoint: {interval: 0, resume: never}
YAML
  pt_params=$("$PY" bench/pytorch_gpt_ddp.py "${TWIN[@]}" --layers "$L" --hidden "$H" --heads "$NH" --seq "$T" --count-only |
              sed -n "s/^pytorch $MODEL: \([0-9]*\) parameters$/\1/p")
  echo "== $size: $MODEL $L layers x $H ($NH heads, $KV key/value heads, ffn $FFN), seq $T, global batch $GB, micro-batch $MB, $STEPS steps per run" \
       "(first $WARMUP skipped), $REPS repetition(s), $CORES cores; PyTorch twin: $pt_params parameters"
  checked=no
  for rep in $(seq 1 "$REPS"); do
    while IFS='|' read -r name fw ranks bucket overlap zero match; do
      [[ "$size/$name" =~ ${BENCH_ONLY:-.} ]] || continue
      out="$W/$size.$name.$rep"
      if [[ "$fw" == hp ]]; then
        run_hp "$size" "$name" "$ranks" "$bucket" "$overlap" "$zero" "$out"
        hp_params=$(sed -n "s/.*model $MODEL: [0-9]* blocks, \([0-9]*\) parameters.*/\1/p" "$out.log" | head -1)
        if [[ "$hp_params" != "$pt_params" ]]; then
          echo "bench_vs_pytorch: PARAMETER COUNT MISMATCH at $size: hp-train ${hp_params:-(no 'model gpt' line)}," \
               "bench/pytorch_gpt_ddp.py $pt_params: the two models differ; fix pytorch_gpt_ddp.py to build hp's gpt"
          exit 1
        fi
        if [[ $checked == no ]]; then
          echo "parameters: hp-train $hp_params, PyTorch $pt_params (equal)"; checked=yes
        fi
        metrics="$out/metrics.jsonl"
      else
        args=(bench/pytorch_gpt_ddp.py "${TWIN[@]}" --layers "$L" --hidden "$H" --heads "$NH" --seq "$T" --global-batch "$GB"
              --micro-batch "$MB" --steps "$STEPS" --threads $((CORES / ranks)) --out "$out.jsonl")
        [[ "$bucket" != - ]] && args+=(--bucket-mb "$bucket")
        [[ "$zero" == yes ]] && args+=(--zero)
        if ((ranks == 1)); then
          "$PY" "${args[@]}" > "$out.log" 2>&1 || { tail -30 "$out.log"; echo "bench_vs_pytorch: PyTorch run $size $name failed"; exit 1; }
        else
          # Seen once: torch 1.13's ZeroRedundancyOptimizer run aborted (SIGABRT in a
          # rank) on a loaded machine; one retry, said so, before giving up.
          if ! "$PY" -m torch.distributed.run --standalone --nproc_per_node "$ranks" --redirects 2 --tee 2 "${args[@]}" \
               > "$out.log" 2>&1; then
            echo "  rep $rep $name: PyTorch run failed ($(grep -m1 -oE 'Signal [0-9]+ \([A-Z]+\)|exitcode *: *-?[0-9]+' "$out.log" || echo 'see its log')); retrying once"
            "$PY" -m torch.distributed.run --standalone --nproc_per_node "$ranks" --redirects 2 --tee 2 "${args[@]}" \
              > "$out.log" 2>&1 || { tail -30 "$out.log"; echo "bench_vs_pytorch: PyTorch run $size $name failed twice"; exit 1; }
          fi
        fi
        metrics="$out.jsonl"
      fi
      "$PY" - "$metrics" "$WARMUP" "$((GB * T))" "$size" "$name" "$rep" >> "$W/results.tsv" <<'PY'
import json, sys
path, warmup, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(path) if l.strip()]
meas = [r["step_seconds"] for r in rows if r["step"] > warmup]
if not meas:
    sys.exit(f"{path}: no step after the {warmup} warm-up steps")
print(f"{sys.argv[4]}\t{sys.argv[5]}\t{sys.argv[6]}\t{tokens * len(meas) / sum(meas):.3f}")
PY
      printf '  rep %d %-26s %10.1f tokens/s\n' "$rep" "$name" "$(tail -1 "$W/results.tsv" | cut -f4)"
      rm -rf "$out" "$out.jsonl"
    done < <(variants)
  done
  # One profiled hp dp=2 run per bucket size, overlap on when offered.
  psteps="[$((WARMUP + 1)), $((WARMUP + 2))]"
  for b in 1 "$DEF_BUCKET"; do
    ov=default; ((${#OVERLAP[@]})) && ov=true
    out="$W/$size.profile_b$b"
    run_hp "$size" "profile_b$b" 2 "$b" "$ov" no "$out" --set run.profile.enabled=true \
      --set "run.profile.steps=$psteps" --set training.max_steps=$((WARMUP + 2))
    echo "profile, $size, hp dp=2, bucket $b MB, overlap $ov, steps $psteps:"
    python3 bench/trace_overlap.py "$out" | sed "s|$out|  hidden behind backward|"
    rm -rf "$out"
  done
done

echo
variants > "$W/variants.txt"
python3 - "$W/results.tsv" "$W/variants.txt" <<'PY'
import statistics, sys
meta = {}
for line in open(sys.argv[2]):
    name, fw, ranks, bucket, overlap, zero, match = line.rstrip("\n").split("|")
    meta[name] = (fw, ranks, bucket, overlap, zero, match)
runs = {}
for line in open(sys.argv[1]):
    size, name, rep, tps = line.split("\t")
    runs.setdefault((size, name), []).append(float(tps))
print(f"{'size':<6s} {'variant':<26s} {'framework':<9s} {'layout':<6s} {'bucket MB':>9s} {'overlap':>8s} "
      f"{'zero':>4s} {'reps':>4s} {'median tok/s':>12s} {'min..max':>17s} {'hp / PyTorch':>12s}")
med = {k: statistics.median(v) for k, v in runs.items()}
for (size, name), v in runs.items():
    fw, ranks, bucket, overlap, zero, match = meta[name]
    layout = "1x2" if ranks == "1" else f"{ranks}x1"
    ratio = f"{med[(size, name)] / med[(size, match)]:.3f}" if match and (size, match) in med else ""
    print(f"{size:<6s} {name:<26s} {fw:<9s} {layout:<6s} {bucket:>9s} {overlap:>8s} {zero:>4s} {len(v):4d} "
          f"{med[(size, name)]:12.1f} {f'{min(v):.0f}..{max(v):.0f}':>17s} {ratio:>12s}")
PY
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
