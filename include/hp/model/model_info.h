#pragma once
// What a model states about itself before anything is built, so features and
// config rules can check a layout without knowing which model it is: the
// layer kinds it asks for, the sizes a split must divide, the batch inputs
// it reads and its blocks' costs. Free of LibTorch.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace hp {

class ConfigErrors;

/// A size some split must divide, and the option it comes from.
struct SplitSize {
  std::int64_t value = 0;
  std::string key;   ///< "model.heads"
  std::string what;  ///< "the head count"
};

struct ModelInfo {
  std::string name;
  /// Layer kinds the model asks for ("attention.heads", "mlp", ...).
  std::set<std::string> layer_kinds;
  /// Sizes by role: heads, hidden, ffn, vocab, sequence, blocks (all of
  /// them), layers (the repeated ones, "blocks.N"), experts.
  /// A size the model cannot split (the unet's grid) is simply absent.
  std::map<std::string, SplitSize> split_sizes;
  /// Names of the batch inputs its first block reads ("tokens", "field").
  std::vector<std::string> inputs;
  /// The option that makes two blocks share a parameter (tied embeddings),
  /// "" when none does: those blocks cannot yet live on different stages.
  std::string shared_parameter_key;
  /// Forward FLOPs per token of each block in model order, and of the loss.
  std::vector<double> block_flops;
  double loss_flops = 0;
  /// Model FLOPs of one training step per token, forward and backward: the
  /// numerator of MFU. Each model states its own (gpt: 6 N + 12 L h s, with
  /// N the weights every token multiplies); model_info() fills a model that
  /// states none with 3 x (the blocks' forward FLOPs + the loss's).
  double train_flops_per_token = 0;
  /// Rows each token sends to routed experts in a MoE layer (top-k): what
  /// an expert-parallel exchange moves per token; 0 without experts.
  int expert_rows_per_token = 0;

  /// Options that may differ between a checkpoint and the run resuming it:
  /// choices that change neither which tensors the model has nor what they
  /// mean (dropout, initialisation, an attention algorithm). Any other
  /// changed `model.*` option is refused at a strict resume.
  std::set<std::string> free_keys;

  bool uses(const std::string& kind) const { return layer_kinds.count(kind) > 0; }
  const SplitSize* size(const std::string& role) const {
    auto it = split_sizes.find(role);
    return it == split_sizes.end() ? nullptr : &it->second;
  }
  /// Adds `<key> = <by>: <what> = <value> (<size key>) is not divisible by it`
  /// when the model has a `role` size that `by` does not divide. Returns
  /// false when it added an error.
  bool check_divides(const std::string& role, std::int64_t by, const std::string& key,
                     ConfigErrors& errors) const;
};

}  // namespace hp
