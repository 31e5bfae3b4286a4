#!/usr/bin/env bash
# What observability costs a run, printed, never asserted: mean step time of
# the 4 x 256 GPT at pp=2 and dp=2 with profiling off, with run.profile on
# for every step, and with /metrics of both ranks scraped every 100 ms while
# it trains, by a curl loop (a new curl process per scrape) and by one
# long-lived Python scraper (as Prometheus is: one process, a request per
# scrape), each mode run twice, interleaved, to even out drift; the
# profiler's cost per span and spans per step; the size of framework/metrics
# before its move onto prometheus-cpp and now.
#   bash bench/bench_observability.sh [steps=30]      (HP_BIN=build-dir/bin to pick a build)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${HP_BIN:-build/bin}
STEPS=${1:-30}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
source bench/lib.sh
bench_gpt_config "$W/c.yaml" "$STEPS"
echo "metrics: {peak_flops: 85.0e9}" >> "$W/c.yaml"
all_steps="[$(seq -s, 2 "$STEPS")]"
declare -A layout=(
  [pp2]="--set features.pipeline_parallel.enabled=true --set features.pipeline_parallel.size=2"
  [dp2]="")
port=$((20000 + RANDOM % 20000))
scrape_loop() {  # scrape_loop PID OUT: both ranks' /metrics every 100 ms while PID lives
  while kill -0 "$1" 2> /dev/null; do
    for p in $port $((port + 1)); do
      curl -s -o /dev/null -w '%{http_code} %{time_total}\n' --max-time 2 "http://127.0.0.1:$p/metrics" >> "$2" || true
    done
    sleep 0.1
  done
}
scrape_python() {  # the same from one Python process
  python3 - "$1" "$2" "$port" <<'PY'
import os, sys, time, urllib.request
pid, out, port = int(sys.argv[1]), open(sys.argv[2], "a"), int(sys.argv[3])
def alive():
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False
while alive():
    for p in (port, port + 1):
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=2) as r:
                r.read()
                out.write(f"{r.status} {time.monotonic() - t0}\n")
        except OSError:
            pass
    time.sleep(0.1)
PY
}
for round in 1 2; do
  for lay in pp2 dp2; do
    for mode in off profile scrape scrape_py; do
      extra=()
      [[ $mode == profile ]] && extra=(--set run.profile.enabled=true --set "run.profile.steps=$all_steps")
      [[ $mode == scrape* ]] && extra=(--set metrics.prometheus.enabled=true --set metrics.prometheus.port=$port)
      # shellcheck disable=SC2086
      "$BIN/hp-train" "$W/c.yaml" --nproc 2 ${layout[$lay]} "${extra[@]}" \
        --set run.output_dir="$W/${lay}_${mode}_$round" > "$W/log" 2>&1 &
      pid=$!
      [[ $mode == scrape ]] && scrape_loop $pid "$W/scrapes_${lay}_$round" &
      [[ $mode == scrape_py ]] && scrape_python $pid "$W/pyscrapes_${lay}_$round" &
      wait $pid || { cat "$W/log"; exit 1; }
      wait
    done
  done
done
ops=$("$BIN/hp-bench-trace-ops")
metrics_lines=$(cat framework/metrics/* | wc -l)
python3 - "$W" "$STEPS" "$ops" "$metrics_lines" <<'PY'
import json, re, sys
w, steps, ops, lines = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
def step(name):
    r = [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if l.strip()][1:]  # step 1 warms up
    return sum(x["step_seconds"] for x in r) / len(r)
def mean2(lay, mode):
    return sum(step(f"{lay}_{mode}_{r}") for r in (1, 2)) / 2
print(f"GPT 4 layers x 256 wide, seq 128, batch 8 (4 micro-batches of 2); 2 processes x 1 thread; "
      f"{steps} steps, mean of steps 2..{steps}, two runs each")
print(f"{'layout':7s} {'off s':>8s} {'profile on s':>13s} {'vs off':>8s} {'curl loop s':>12s} {'vs off':>8s} "
      f"{'one scraper s':>14s} {'vs off':>8s}")
off_ns = float(re.search(r"([0-9.]+) ns per span with profile off", ops).group(1))
on_ns = float(re.search(r"([0-9.]+) ns per span with profile on", ops).group(1))
for lay in ("pp2", "dp2"):
    off, prof, scr, py = (mean2(lay, m) for m in ("off", "profile", "scrape", "scrape_py"))
    print(f"{lay:7s} {off:8.4f} {prof:13.4f} {100 * (prof / off - 1):+7.2f}% {scr:12.4f} {100 * (scr / off - 1):+7.2f}% "
          f"{py:14.4f} {100 * (py / off - 1):+7.2f}%")
    for what, prefix in (("curl loop", "scrapes"), ("one scraper", "pyscrapes")):
        times = []
        for r in (1, 2):
            for l in open(f"{w}/{prefix}_{lay}_{r}"):
                code, t = l.split()
                if code == "200":
                    times.append(float(t) * 1e3)
        print(f"        {what}: {len(times)} scrapes answered 200, {sum(times) / max(1, len(times)):.2f} ms mean, "
              f"{max(times, default=0):.2f} ms max")
    trace = json.load(open(f"{w}/{lay}_profile_1/trace.json"))
    spans = sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
    per_step = spans / (steps - 1)
    print(f"        {per_step:.0f} spans per step on 2 ranks: off {per_step * off_ns / 1e3:.2f} us "
          f"({100 * per_step * off_ns / 1e9 / off:.5f}% of a step), on {per_step * on_ns / 1e3:.1f} us "
          f"({100 * per_step * on_ns / 1e9 / off:.3f}% of a step), plus writing the trace after the run")
print(ops)
mfu = [json.loads(l) for l in open(f"{w}/pp2_off_1/metrics.jsonl") if l.strip()][-1]
print(f"pp2 last step: {mfu['model_flops_per_second'] / 1e9:.2f} GFLOP/s of model FLOPs, MFU {100 * mfu['mfu']:.1f}% "
      f"of 2 x 85 GFLOP/s")
print(f"framework/metrics: 1523 lines before prometheus-cpp (own registry, types, text format), {lines} now")
PY
