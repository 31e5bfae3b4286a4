#pragma once
#include <stdexcept>
#include <string>
// A model is an ordered list of named blocks plus a loss. Each block maps
// Activations -> Activations and can say what it costs, which the pipeline
// feature uses to balance stages.
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>

#include "hp/model/activations.h"

namespace hp {

struct BlockCost {
  std::int64_t parameters = 0;       ///< global (unsharded) parameter count
  double flops_per_token = 0.0;      ///< forward FLOPs per token
};

class Block : public torch::nn::Module {
 public:
  virtual Activations forward(const Activations& in) = 0;
  virtual BlockCost cost() const { return {}; }
};

/// Loss over the last block's Activations and the batch targets. Returns the
/// SUM of per-token losses (so micro-batches and data-parallel ranks can be
/// averaged exactly by the global token count) and the number of tokens.
struct LossOutput {
  at::Tensor sum;        ///< scalar, differentiable
  std::int64_t count = 0;
};

class LossBlock : public torch::nn::Module {
 public:
  /// `targets`: the batch's named targets ("labels", "field", ...).
  virtual LossOutput forward(const Activations& out, const Activations& targets) = 0;
  /// The name of the output whose rows are token logits ("logits"), or ""
  /// when the model predicts no tokens (generation refuses it).
  virtual std::string logits_name() const { return ""; }
  /// Log-probabilities over the vocabulary of rows of that output
  /// ([rows, local vocabulary] -> [rows, vocabulary]); see
  /// LossLayer::log_probs.
  virtual at::Tensor log_probs(const at::Tensor& logits_rows) {
    (void)logits_rows;
    throw std::logic_error("this model's loss gives no token probabilities");
  }
  /// The rows of `t` ([samples, ...], this rank's samples) of every sample
  /// whose logits the loss sees, in the logits' order: `t` itself, unless
  /// the LM head gathers other ranks' samples (a per-module degree above
  /// the stream's). Every rank of such a head calls it at once.
  virtual at::Tensor gather_samples(const at::Tensor& t) { return t; }
};

}  // namespace hp
