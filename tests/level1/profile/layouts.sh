#!/usr/bin/env bash
# run.profile and /metrics under tensor, expert and zero data parallel at
# once: one 4-process run of the MoE GPT at tp=2 x dp=2 with ep=2 and zero.
# While it trains, every rank's /metrics passes `promtool check metrics` and
# counts bytes of tp's all-reduce, ep's all-to-all, and zero's gradient
# reduce-scatter on dp and parameter all-gather; afterwards
# the merged trace is valid (check_trace.load) with those collectives in
# both profiled steps of every rank, each span carrying group and bytes.
source "$(dirname "$0")/../../lib/common.sh"
BIN=$1
HERE=$(cd "$(dirname "$0")" && pwd)
command -v promtool >/dev/null || fail "promtool missing: install the Debian package 'prometheus'"
small_config "$WORK/c.yaml"
# Four free ports in a row (rank r serves port + r).
port=$(free_ports 4)
[[ -n "$port" ]] || fail "no four free ports in a row"
t0=$SECONDS
"$BIN/hp-train" "$WORK/c.yaml" --nproc 4 --set training.max_steps=60 --set metrics.peak_flops=1e10 \
  --set model.moe.num_experts=4 --set model.moe.top_k=2 \
  --set features.tensor_parallel.enabled=true --set features.tensor_parallel.size=2 \
  --set features.expert_parallel.enabled=true --set features.expert_parallel.size=2 --set features.zero.enabled=true \
  --set run.profile.enabled=true --set run.profile.steps=[2,3] \
  --set metrics.prometheus.enabled=true --set metrics.prometheus.port=$port --set run.output_dir="$WORK/run" \
  > "$WORK/log" 2>&1 &
pid=$!
got=""
for _ in $(seq 1 1200); do
  if curl -sf "http://127.0.0.1:$port/metrics" -o "$WORK/scrape0" && grep -q '^hp_step{rank="0"} [1-9]' "$WORK/scrape0"; then
    got=yes
    for r in 1 2 3; do curl -sf "http://127.0.0.1:$((port + r))/metrics" -o "$WORK/scrape$r" || got=""; done
    break
  fi
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
wait $pid || { cat "$WORK/log"; fail "the run failed"; }
[[ -n "$got" ]] || { cat "$WORK/log"; fail "no scrape of all 4 ranks with training progress (the run ended first?)"; }
grep -q "mesh dp=2 tp=2 ep=2 edp=1 over" "$WORK/log" || fail "wrong mesh: $(grep -m1 mesh "$WORK/log")"
echo "run: $((SECONDS - t0)) s"
for r in 0 1 2 3; do
  problems=$(promtool check metrics < "$WORK/scrape$r" 2>&1); rc=$?
  [[ $rc -eq 0 && -z "$problems" ]] || fail "promtool on rank $r's scrape: $problems"
  for s in 'group="tp",op="all_reduce"' 'group="ep",op="all_to_all"' 'group="dp",op="reduce_scatter"' 'group="dp",op="all_gather"'; do
    grep -q "^hp_comm_bytes_total{rank=\"$r\",$s} [1-9]" "$WORK/scrape$r" \
      || fail "rank $r: no bytes counted for $s: $(grep '^hp_comm_bytes_total' "$WORK/scrape$r")"
  done
  grep -q "^hp_loss{rank=\"$r\"} " "$WORK/scrape$r" || fail "rank $r: no hp_loss"
done
echo "promtool: 4 scrapes clean; rank 0: $(grep '^hp_comm_bytes_total' "$WORK/scrape0" | tr '\n' ' ')"
grep -q "profile of steps \[2, 3\] written to $WORK/run/trace.json" "$WORK/log" || fail "the run did not log where the trace went"
python3 "$HERE/check_layout_trace.py" "$WORK/run/trace.json" 4 2 3 tp:all_reduce ep:all_to_all dp:reduce_scatter dp:all_gather \
  || fail "trace"
echo PASS
