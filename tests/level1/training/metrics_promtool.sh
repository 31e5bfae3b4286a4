#!/usr/bin/env bash
# A real scrape of /metrics during a 2-process run passes `promtool check
# metrics`, carries the training series, and metrics.jsonl has the keys.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
command -v promtool >/dev/null || fail "promtool missing: install the Debian package 'prometheus'"
small_config "$WORK/c.yaml"
# Rank r serves on port + r: a port whose next one is free too (another
# test's endpoint on port + 1 made rank 1 fail to start its own).
port=$(free_ports 2)
[[ -n "$port" ]] || fail "no two free ports in a row"
"$BIN/hp-train" "$WORK/c.yaml" --nproc 2 --set training.max_steps=400 --set run.output_dir="$WORK/run" \
  --set metrics.prometheus.enabled=true --set metrics.prometheus.port=$port > "$WORK/log" 2>&1 &
pid=$!
got=""
for _ in $(seq 1 100); do
  if curl -sf "http://127.0.0.1:$port/metrics" -o "$WORK/scrape0" && grep -q '^hp_step{rank="0"} [1-9]' "$WORK/scrape0"; then
    curl -sf "http://127.0.0.1:$((port + 1))/metrics" -o "$WORK/scrape1" && got=yes && break
  fi
  sleep 0.3
done
kill $pid 2>/dev/null; wait $pid 2>/dev/null
[[ -n "$got" ]] || { cat "$WORK/log"; fail "no scrape with training progress"; }
for f in scrape0 scrape1; do
  problems=$(promtool check metrics < "$WORK/$f" 2>&1); rc=$?
  [[ $rc -eq 0 && -z "$problems" ]] || fail "promtool on $f: $problems"
done
for series in hp_loss hp_learning_rate hp_grad_norm hp_tokens_per_second hp_step_duration_seconds_bucket \
              hp_tokens_total hp_samples_total hp_resident_memory_bytes hp_comm_bytes_total; do
  grep -q "^$series{" "$WORK/scrape0" || fail "series $series missing"
done
grep -q '^hp_loss{rank="1"} ' "$WORK/scrape1" || fail "rank label missing on rank 1"
grep -q '^hp_comm_bytes_total{rank="0",group="dp",op="all_reduce"} [1-9]' "$WORK/scrape0" \
  || fail "no data-parallel all-reduce bytes counted"
python3 - "$WORK/run/metrics.jsonl" <<'PY' || fail "metrics.jsonl keys"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert rows, "no rows"
for k in ("step", "loss", "lr", "grad_norm", "tokens_per_second"):
    assert k in rows[0], k
PY
echo PASS
