#!/usr/bin/env bash
# Token data: hp-data prepare's rate and peak memory, and what the loader
# costs a training step.
#   1. Tokenizers: byte-level BPE (a tokenizer.json of 8000 merges learned
#      by tests/ut/data/bpe_reference.py from the fortunes) and SentencePiece
#      (unigram, 8000 pieces, hp-data train-tokenizer on the fortunes).
#   2. prepare of a corpus of GB gigabytes (the fortunes repeated; default 1)
#      and of a 100 MB one, on 2 threads: MB/s, the word cache's hit rate,
#      peak resident memory (/usr/bin/time); and of the unrepeated fortunes
#      (2.6 MB) on 1 thread.
#   3. A GPT-2-small shape (12 x 768, seq 256, 8 samples a step, one process
#      on 2 threads) on the large corpus and on a 10 MB one: the trace's
#      data/batch span against the step. Then the 4 x 256 GPT (12 steps,
#      twice each) on both: the rank's anonymous and file-backed resident
#      memory at the end (the shards are memory-mapped). The small model
#      shows the loader's share of anonymous memory without the allocator's
#      noise of a 4 GB process (about 50 MiB from run to run).
# Usage: bench/bench_data.sh [GB]   (figures on stdout; ~10 min at GB=1)
set -euo pipefail
cd "$(dirname "$0")/.."
GB=${1:-1}
B=build/bin
PY=/usr/bin/python3
W=${BENCH_WORK:-$(mktemp -d /tmp/bench_data.XXXXXX)}
mkdir -p "$W"
echo "work directory $W (commit $(git rev-parse --short HEAD))"
F=/usr/share/games/fortunes
find "$F" -maxdepth 1 -type f ! -name '*.dat' | sort | xargs cat > "$W/fortunes.txt"
fort_bytes=$(wc -c < "$W/fortunes.txt")
echo "fortunes: $(wc -c < "$W/fortunes.txt") bytes"

[[ -s "$W/bpe.json" ]] || $PY tests/ut/data/bpe_reference.py train "$W/fortunes.txt" 8000 "$W/bpe.json" --pattern gpt2
[[ -s "$W/sp.model" ]] || $B/hp-data train-tokenizer --input "$W/fortunes.txt" --vocab-size 8000 --out "$W/sp.model" \
  --threads 2 > /dev/null

make_corpus() {  # make_corpus FILE MB
  [[ -s "$1" ]] && return
  local n=$(( ($2 * 1024 * 1024 + fort_bytes - 1) / fort_bytes )) i
  # head closes the pipe once it has the size: no pipefail here.
  (set +o pipefail; for ((i = 0; i < n; i++)); do cat "$W/fortunes.txt"; done | head -c $(($2 * 1024 * 1024)) > "$1")
}
make_corpus "$W/big.txt" $((GB * 1024))
make_corpus "$W/mid.txt" 100
make_corpus "$W/small.txt" 10

prepare() {  # prepare NAME INPUT TOKENIZER THREADS
  rm -rf "$W/$1"
  /usr/bin/time -f "%M" -o "$W/$1.rss" $B/hp-data prepare --input "$2" --tokenizer "$3" --out "$W/$1" --split-on % \
    --threads "$4" --shard-mb 32 > "$W/$1.out" 2> "$W/$1.err"
  local line rate hit
  line=$(grep '^prepared' "$W/$1.out")
  rate=$(sed -n 's/.* = \([0-9.]*\) MB\/s.*/\1/p' <<<"$line")
  hit=$(sed -n 's/.*hit rate \([0-9.]*\) %.*/\1/p' <<<"$line")
  printf '| %-22s | %-13s | %7s | %7s | %8s | %9.0f |\n' "$1" "$(du -m "$2" | cut -f1) MB x $4 thr" "$rate" \
    "${hit:--}" "$(sed -n 's/.*, \([0-9.]*\) tokens\/byte.*/\1/p' <<<"$line")" "$(($(cat "$W/$1.rss") / 1024))"
}
echo
echo "| prepare                | corpus        |    MB/s | cache % | tokens/B | peak MiB |"
echo "|------------------------|---------------|---------|---------|----------|-----------|"
for tok in bpe sp; do
  file=$W/bpe.json; [[ $tok == sp ]] && file=$W/sp.model
  prepare "${tok}_fortunes" "$W/fortunes.txt" "$file" 1
  prepare "${tok}_100MB" "$W/mid.txt" "$file" 2
  prepare "${tok}_${GB}GB" "$W/big.txt" "$file" 2
done
prepare "sp_10MB" "$W/small.txt" "$W/sp.model" 2 > /dev/null

train() {  # train NAME CORPUS [MODEL]
  local model="{type: gpt, layers: 12, hidden: 768, heads: 12, seq_len: 256}"
  [[ -n ${3:-} ]] && model=$3
  cat > "$W/$1.yaml" <<YAML
model: $model
data: {type: tokens, path: $2}
training: {max_steps: 12, global_batch_size: 8, micro_batch_size: 8, log_interval: 1, eval_interval: 0}
optimizer: {lr: 0.0003, schedule: constant}
checkpoint: {interval: 0, resume: never}
run: {output_dir: $W/run_$1, profile: {enabled: true, steps: [9, 10, 11, 12]}}
metrics: {peak_flops: 1.0e+11}
YAML
  $B/hp-train "$W/$1.yaml" --threads-per-worker 2 > "$W/$1.log" 2>&1 || { tail "$W/$1.log"; exit 1; }
  $PY - "$W/run_$1/trace.json" "$W/$1.log" "$1" <<'PY'
import json, re, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"] if isinstance(t, dict) else t
dur = lambda name: sum(e.get("dur", 0) for e in ev if e.get("name") == name and e.get("ph") == "X")
step, batch = dur("step"), dur("batch")
m = re.search(r"\(now ([0-9.]+) MiB anonymous, ([0-9.]+) MiB file-backed\)", open(sys.argv[2]).read())
print("| %-10s | %8.1f | %8.2f | %6.3f %% | %9s | %9s |" % (sys.argv[3], step / 4e3, batch / 4e3, 100 * batch / step,
      m.group(1) if m else "?", m.group(2) if m else "?"))
PY
}
echo
echo "GPT-2 small (12 x 768, seq 256, 8 samples a step):"
echo "| corpus     | step ms  | batch ms | share    | anon MiB  | file MiB  |"
echo "|------------|----------|----------|----------|-----------|-----------|"
train "sp_10MB" "$W/sp_10MB"
train "sp_${GB}GB" "$W/sp_${GB}GB"
echo
echo "GPT 4 x 256 (seq 128, 8 samples a step), each corpus twice:"
echo "| corpus     | step ms  | batch ms | share    | anon MiB  | file MiB  |"
echo "|------------|----------|----------|----------|-----------|-----------|"
small="{type: gpt, layers: 4, hidden: 256, heads: 4, seq_len: 128}"
for rep in 1 2; do
  train "sp_10MB" "$W/sp_10MB" "$small"
  train "sp_${GB}GB" "$W/sp_${GB}GB" "$small"
done
