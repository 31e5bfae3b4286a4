#pragma once
// SGD, Adam and AdamW over this rank's parameters, with state kept per
// parameter by global name so checkpoints are layout-independent. The update
// formulas are PyTorch's (torch.optim) so numbers match what users know.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "framework/model/build_context.h"

namespace hp {

class Config;

struct OptimizerOptions {
  std::string type = "adamw";  ///< sgd | adam | adamw
  double weight_decay = 0.0, momentum = 0.0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  static OptimizerOptions from(const Config& c);
};

class Optimizer {
 public:
  Optimizer(OptimizerOptions options, std::vector<ParamEntry> params);

  /// One update with learning rate `lr` from the parameters' .grad().
  void step(double lr);
  void zero_grad();
  std::int64_t steps_taken() const { return steps_; }
  void set_steps_taken(std::int64_t s) { steps_ = s; }

  /// State tensors as entries named "<kind>/<param name>" (exp_avg,
  /// exp_avg_sq, momentum), sharing each parameter's ShardSpec. The tensors
  /// are the live state: loading copies into them.
  std::vector<ParamEntry> state();
  const std::vector<ParamEntry>& params() const { return params_; }

 private:
  OptimizerOptions o_;
  std::vector<ParamEntry> params_;
  std::vector<at::Tensor> m_, v_;  // exp_avg / momentum buffer, exp_avg_sq
  std::int64_t steps_ = 0;
};

/// Learning rate at `step` (0-based): linear warm-up over warmup_steps, then
/// constant or cosine decay to min_lr at max_steps.
double learning_rate(const Config& config, std::int64_t step);

}  // namespace hp
