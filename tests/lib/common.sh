# Shared helpers for the shell-level tests. Source it; $BIN is the build's bin/.
set -uo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hp_test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# A small config every training test starts from: 2-layer GPT, synthetic task,
# dropout on (masks do not depend on the layout, so parity holds with it) and
# an evaluation every 10 steps (compared by hp-compare like the loss).
small_config() {
  cat > "$1" <<'YAML'
run: {seed: 7}
model: {type: gpt, layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab_size: 64, dropout: 0.1}
data: {type: synthetic}
training: {max_steps: 20, global_batch_size: 8, micro_batch_size: 2, log_interval: 1, eval_interval: 10}
optimizer: {type: adamw, lr: 0.002, warmup_steps: 2, grad_clip: 1.0}
checkpoint: {interval: 0}
YAML
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
