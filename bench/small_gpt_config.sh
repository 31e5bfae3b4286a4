# Sourced by bench scripts: small_gpt_config FILE LAYERS HIDDEN STEPS [moe]
# writes the GPT (heads 4, sequence 128, fortunes, global batch 16 of
# micro-batches 2, a line of metrics per step, no eval, no checkpoints),
# with `moe` 8 experts of top-2.
small_gpt_config() {
  local moe=""
  [[ -n ${5:-} ]] && moe=", moe: {num_experts: 8, top_k: 2}"
  cat > "$1" <<YAML
model: {type: gpt, layers: $2, hidden: $3, heads: 4, seq_len: 128$moe}
data: {type: text, path: /usr/share/games/fortunes}
training: {max_steps: $4, global_batch_size: 16, micro_batch_size: 2, log_interval: 1, eval_interval: 0}
optimizer: {type: adamw, lr: 0.001, schedule: constant}
checkpoint: {interval: 0, resume: never}
YAML
}
