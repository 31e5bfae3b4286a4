#pragma once
// The optimizer collaborator: SGD (with momentum), Adam and AdamW over this
// rank's parameters, state kept per parameter by global name so checkpoints
// are layout-independent. The update formulas are PyTorch's (torch.optim),
// in one function (apply_update) that every implementation shares, so a
// feature that shards the state (zero) updates with the same numbers.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/model/build_context.h"
#include "hp/optim/param_groups.h"

namespace hp {

class Config;

enum class OptimizerKind { kSgd, kAdam, kAdamW };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double weight_decay = 0.0, momentum = 0.0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  /// Global gradient-norm clip (0: off).
  double grad_clip = 1.0;
  /// Per parameter (by global name): its group's weight decay and
  /// learning-rate scale (include/hp/optim/param_groups.h), set by the
  /// trainer once the model is built. Null, or a name it lacks: weight_decay
  /// and a scale of 1.
  std::shared_ptr<const std::map<std::string, ParamHyper>> param_hypers;
  static OptimizerOptions from(const Config& c);
  /// The state tensors this kind keeps per parameter ("exp_avg", ...).
  std::vector<std::string> state_names() const;
  /// These options with parameter `name`'s weight decay; its learning-rate
  /// scale in `*lr_scale`.
  OptimizerOptions for_param(const std::string& name, double* lr_scale) const;
};

/// Every parameter's group under `policy` (by global name), from the
/// entries' global shapes and embedding marks.
std::map<std::string, ParamHyper> resolve_param_groups(const GroupPolicy& policy,
                                                       const std::vector<ParamEntry>& params);

/// The learning-rate schedule, read once from the config.
struct ScheduleOptions {
  double lr = 1e-3, min_lr = 0.0;
  std::int64_t warmup_steps = 0, max_steps = 1;
  bool cosine = true;
  static ScheduleOptions from(const Config& c);
};

/// Learning rate at `step` (0-based): linear warm-up over warmup_steps, then
/// constant or cosine decay to min_lr at max_steps.
double learning_rate(const ScheduleOptions& s, std::int64_t step);

/// One update of `param` from `grad` at 1-based step `t`. `state` holds the
/// tensors named by OptimizerOptions::state_names(), shaped like `param`.
void apply_update(const OptimizerOptions& o, std::int64_t t, double lr, at::Tensor param, at::Tensor grad,
                  std::vector<at::Tensor>& state);

/// What a rank keeps for its parameters between steps, in bytes.
struct ModelStateBytes {
  double params = 0;     ///< the parameters (master copies)
  double grads = 0;      ///< their gradients
  double optimizer = 0;  ///< the optimizer's state
  /// Held at the activations' peak beyond the above (gradients made whole
  /// in backward before they are sharded again, parameters gathered whole).
  double transient = 0;
  /// Held after the update until the next forward has taken it (updated
  /// slices travelling back into whole parameters), while the forward's
  /// first activations are made.
  double after_update = 0;
  /// Of `transient`: the gradients made whole in each backward (released
  /// after the step), placed among the activations as they are made.
  double made_whole = 0;
  /// Gradients released as they are sent, once per micro-batch: what one
  /// micro-batch's sends can still hold when the next backward has made
  /// its gradients whole (the most kBucketsInFlight consecutive buckets
  /// hold: each a flat copy and the part received).
  double travelling = 0;
  /// Whether the gradients are summed once per micro-batch (else once a
  /// step), and the parameter bytes gathered per micro-batch (sharded
  /// parameters made whole for forward and backward).
  bool grads_per_micro_batch = false;
  double gathered_per_micro_batch = 0;
  double total() const { return params + grads + optimizer; }
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Between steps, for the parameters it was made with: by default each
  /// whole (its local shape) with a gradient of its size, plus state_bytes().
  /// An optimizer that shards them says what it keeps (hp-plan asks, on the
  /// meta device, before anything runs).
  virtual ModelStateBytes model_state(const std::vector<ParamEntry>& params);
  /// One update with learning rate `lr` from the gradients the reducer left.
  virtual void step(double lr) = 0;
  virtual void zero_grad() = 0;
  virtual std::int64_t steps_taken() const = 0;
  virtual void set_steps_taken(std::int64_t s) = 0;
  /// State tensors as entries named "<kind>/<param name>" (exp_avg,
  /// exp_avg_sq, momentum), each with a ShardSpec saying which slice of the
  /// global tensor this rank holds. The tensors are the live state: loading
  /// copies into them.
  virtual std::vector<ParamEntry> state() = 0;
  /// Bytes of optimizer state this rank holds.
  std::int64_t state_bytes();
};

/// State entries named "<kind>/<param name>" (Optimizer::state): for each
/// i, state[i][k] is state_names()[k] of the tensor `specs[i]` describes.
std::vector<ParamEntry> named_state(const OptimizerOptions& o, const std::vector<ShardSpec>& specs,
                                    const std::vector<std::vector<at::Tensor>>& state);
/// Zeroed state tensors shaped like `like`, one per state_names() entry.
std::vector<at::Tensor> fresh_state(const OptimizerOptions& o, const at::Tensor& like);

/// The bookkeeping every optimizer here shares: the step count and per-tensor
/// state named by parameter (state()). Subclasses add a tensor's state with
/// add_state and update it in step().
class NamedStateOptimizer : public Optimizer {
 public:
  std::int64_t steps_taken() const override { return steps_; }
  void set_steps_taken(std::int64_t s) override { steps_ = s; }
  std::vector<ParamEntry> state() override { return named_state(o_, specs_, state_); }

 protected:
  explicit NamedStateOptimizer(OptimizerOptions o) : o_(o) {}
  /// State for the tensor `spec` describes (named spec.name), shaped like `like`.
  void add_state(const ShardSpec& spec, const at::Tensor& like) {
    specs_.push_back(spec);
    state_.push_back(fresh_state(o_, like));
  }
  OptimizerOptions o_;
  std::vector<ShardSpec> specs_;
  std::vector<std::vector<at::Tensor>> state_;
  std::int64_t steps_ = 0;
};

/// Every parameter's state on this rank (no sharding).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, const std::vector<ParamEntry>& params);

/// Sets every parameter's .grad() to zero (allocating it when missing).
void zero_gradients(const std::vector<ParamEntry>& params);

}  // namespace hp
