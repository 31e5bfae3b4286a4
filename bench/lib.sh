# Shared by the bench scripts; source it.
# bench_gpt_config FILE STEPS: the 4 x 256 GPT on the fortunes corpus that
# the step-time benchmarks compare runs on (4 micro-batches of 2, constant
# learning rate, no checkpoints).
bench_gpt_config() {
  cat > "$1" <<YAML
model: {type: gpt, layers: 4, hidden: 256, heads: 4, seq_len: 128}
data: {type: text}
training: {max_steps: $2, global_batch_size: 8, micro_batch_size: 2, log_interval: 1}
optimizer: {lr: 0.001, schedule: constant}
checkpoint: {interval: 0, resume: never}
YAML
}

source "$(dirname "${BASH_SOURCE[0]}")/../tests/lib/worker_pid.sh"
