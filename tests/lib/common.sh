# Shared helpers for the shell-level tests. Source it; $BIN is the build's bin/.
set -uo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hp_test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# A small config every training test starts from: 2-layer GPT, synthetic task,
# dropout on (masks do not depend on the layout, so parity holds with it) and
# an evaluation every 10 steps (compared by hp-compare like the loss). Both
# configs here give metrics.peak_flops: the start-up FLOP probe (0.2 s alone,
# up to 0.8 s with another test beside it) would run in every process of
# every run, and no test here reads MFU (the probe has its unit test in
# tests/ut/metrics/trainer_series_test.cpp, and the main job runs it).
small_config() {
  cat > "$1" <<'YAML'
run: {seed: 7}
model: {type: gpt, layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab_size: 64, dropout: 0.1}
data: {type: synthetic}
training: {max_steps: 20, global_batch_size: 8, micro_batch_size: 2, log_interval: 1, eval_interval: 10}
optimizer: {type: adamw, lr: 0.002, warmup_steps: 2, grad_clip: 1.0}
checkpoint: {interval: 0}
metrics: {peak_flops: 1.0e+10}
YAML
}

# text_config FILE [SEQ_LEN]: small_config on byte tokens of a fortune
# file (vocabulary 256; model.seq_len SEQ_LEN, default 32), for the tools
# that read text (hp-eval, hp-generate, samples during training).
text_config() {
  small_config "$1"
  sed -i "s/, vocab_size: 64/, vocab_size: 256/; s/seq_len: 32/seq_len: ${2:-32}/; s|^data: .*|data: {type: text, path: /usr/share/games/fortunes/computers}|" \
    "$1"
}

# unet_config FILE [MAX_STEPS]: the skip-connection model on the field task
# (no dropout; 20 steps unless given).
unet_config() {
  cat > "$1" <<YAML
run: {seed: 7}
model: {type: unet, layers: 2, hidden: 32, seq_len: 16, channels: 4}
data: {type: field}
training: {max_steps: ${2:-20}, global_batch_size: 8, micro_batch_size: 2, log_interval: 1}
optimizer: {type: adamw, lr: 0.003, warmup_steps: 2, grad_clip: 1.0}
checkpoint: {interval: 0}
metrics: {peak_flops: 1.0e+10}
YAML
}

# loss_at RUN_DIR STEP: the logged loss of a step (full precision).
loss_at() {
  python3 -c 'import json,sys
for l in open(sys.argv[1]+"/metrics.jsonl"):
    j=json.loads(l)
    if j["step"]==int(sys.argv[2]): print(repr(j["loss"])); break' "$1" "$2"
}

# first_last RUN_DIR: "first_loss last_loss"
first_last() {
  python3 -c 'import json,sys
r=[json.loads(l) for l in open(sys.argv[1]+"/metrics.jsonl") if l.strip()]
print(r[0]["loss"], r[-1]["loss"])' "$1"
}

# replayed_every_step RUN_DIR: recompute ran, i.e. every logged step of the
# run replayed at least one region (recompute_regions_replayed > 0), so an
# "on equals off" comparison cannot pass because recompute never ran.
replayed_every_step() {
  python3 -c 'import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]+"/metrics.jsonl") if l.strip()]
bad=[r["step"] for r in rows if r.get("recompute_regions_replayed",0)<=0]
if bad: sys.exit("recompute replayed no region at steps %s of %s" % (bad[:5], sys.argv[1]))
print("recompute replayed %s regions per step on the logging rank" % sorted({r["recompute_regions_replayed"] for r in rows}))' "$1"
}

# free_ports N: the first of N consecutive ports free on 127.0.0.1 now,
# below the kernel's ephemeral range. A port found free inside that range
# can be handed to another process's outgoing connection (tests running
# side by side open many) before the server binds it: a rank's /metrics
# endpoint once failed so.
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
first, last = (10000, low - n) if low - n > 12000 else (61000, 65535 - n)
for _ in range(500):
    p = random.randrange(first, last)
    socks = []
    try:
        for r in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", p + r))
            socks.append(s)
    except OSError:
        continue
    print(p)
    break
PY
}

# run NAME NPROC ARGS...: hp-train on $WORK/c.yaml with the caller's
# `common` options (an array; may be empty) and ARGS, into $WORK/NAME, its
# log in $WORK/NAME.log (printed when the run fails).
run() {
  local name=$1 n=$2; shift 2
  "$BIN/hp-train" "$WORK/c.yaml" --nproc "$n" "${common[@]}" "$@" --set run.output_dir="$WORK/$name" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name run"; }
}

source "$(dirname "${BASH_SOURCE[0]}")/worker_pid.sh"

# compare_b4 REF RUN PHASE: RUN against REF at docs/PARITY.md's B4 bars
# (first step and step-1 gradients 1e-5, trajectory 1e-4, eval 1e-5); PHASE
# names what a later divergence is blamed on.
compare_b4() {
  echo "== $2 against $1"
  "$BIN/hp-compare" "$WORK/$1" "$WORK/$2" --grads-step 1 --first-loss-rtol 1e-5 --loss-rtol 1e-4 --eval-rtol 1e-5 \
    --grad-rtol 1e-5 --phase "$3" || fail "$2 vs $1"
}

# resumed_bitwise REF RUN FROM_STEP: RUN, resumed from REF's checkpoint at
# REF's layout, equals REF bitwise from FROM_STEP on (docs/PARITY.md B2).
resumed_bitwise() {
  echo "== $2 resumed from $1's checkpoint (same layout)"
  "$BIN/hp-compare" "$WORK/$1" "$WORK/$2" --from-step "$3" --exact --phase resume || fail "$2: same-layout resume not bitwise"
}

# resumed_within REF FROM_STEP RUN...: each RUN, resumed from REF's
# checkpoint at another layout, follows REF within 1e-4 from FROM_STEP on (B9).
resumed_within() {
  local ref=$1 from=$2 r
  shift 2
  for r in "$@"; do
    echo "== $r resumed from $ref's checkpoint"
    "$BIN/hp-compare" "$WORK/$ref" "$WORK/$r" --from-step "$from" --first-loss-rtol 1e-4 --loss-rtol 1e-4 \
      --phase resume || fail "$r resumed from $ref"
  done
}

# refused CONFIG TEXT ARGS...: `hp-train CONFIG --dry-run ARGS...` is refused
# before start (exit 2) with TEXT (a fixed string) in its output.
refused() {
  local config=$1 text=$2 out rc; shift 2
  out=$("$BIN/hp-train" "$config" --dry-run "$@" 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "hp-train $*: expected exit 2, got $rc"
  grep -qF -- "$text" <<<"$out" || fail "hp-train $*: the refusal lacks '$text': $out"
}
