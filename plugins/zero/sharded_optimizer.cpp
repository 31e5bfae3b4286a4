#include "plugins/zero/sharded_optimizer.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <map>

#include "hp/comm/context.h"
#include "hp/comm/group.h"

namespace hp::zero {

namespace {

class ShardedOptimizer : public NamedStateOptimizer {
 public:
  ShardedOptimizer(OptimizerOptions o, std::shared_ptr<SlicePlan> s, std::shared_ptr<ParamResidency> residency)
      : NamedStateOptimizer(o), s_(std::move(s)), residency_(std::move(residency)) {
    for (const auto& c : s_->cuts) {
      ShardSpec spec = c.slice_spec;
      spec.name = c.param.spec.name;
      add_state(spec, c.slice_grad);
      scale_.push_back(1.0);
      per_param_.push_back(o_.for_param(spec.name, &scale_.back()));
    }
  }
  void step(double lr) override {
    {
      c10::NoGradGuard no_grad;
      ++steps_;
      for (std::size_t i = 0; i < s_->cuts.size(); ++i) {
        auto& c = s_->cuts[i];
        // The parameter's slice, or the slice kept aside while a sharded
        // parameter is released (gathered before its block's next forward).
        at::Tensor target = residency_->update_target(c);
        apply_update(per_param_[i], steps_, lr * scale_[i], target, c.slice_grad, state_[i]);
      }
    }
    residency_->after_update();
  }
  /// Stage 1 keeps each parameter and its full gradient (the reduced slice
  /// inside it); stage 2 a gradient slice (the whole one made in backward);
  /// stage 3 a parameter slice too (gathered for forward and backward).
  /// Over a group of one member nothing is sharded.
  ModelStateBytes model_state(const std::vector<ParamEntry>&) override {
    ModelStateBytes m;
    double gathered_after_step = 0, made_whole = 0;
    std::map<int, double> block_whole;  // stage 3: each block's parameters, gathered whole
    for (const auto& c : s_->cuts) {
      const double item = static_cast<double>(c.param.tensor.element_size());
      const double whole = static_cast<double>(c.param.tensor.numel()) * item;
      const double slice = static_cast<double>(c.numel_of(c.me)) * item;
      const bool shared = s_->dist->group(c.shard_group).size() > 1;
      const bool params_sharded = s_->options.parts.shard_params && shared;
      const bool grads_sharded = s_->options.parts.release_full_grads && shared;
      m.params += params_sharded ? slice : whole;
      m.grads += grads_sharded ? slice : whole;
      // A released gradient is made whole again in each backward; whole
      // parameters take their updated slices back after the step, through
      // receive buffers of the gathers in flight (kGathersAhead buckets).
      if (grads_sharded) made_whole += whole;
      if (shared && !params_sharded) gathered_after_step += whole;
      if (params_sharded) {
        m.gathered_per_micro_batch += (s_->options.reshard_after_forward ? 2 : 1) * whole;
        block_whole[c.param.block] += whole;
      }
    }
    // At the peak: the whole gradients of a backward, the gathers of updated
    // slices in flight, and (stage 3) a block gathered whole with the ones
    // prefetched behind it.
    double largest_block = 0;
    for (const auto& [block, bytes] : block_whole) largest_block = std::max(largest_block, bytes);
    m.transient = made_whole + std::min(gathered_after_step, kGathersAhead * s_->options.bucket_bytes) +
                  (1 + s_->options.prefetch) * largest_block;
    m.grads_per_micro_batch = s_->options.rounds();
    m.optimizer = static_cast<double>(state_bytes());
    return m;
  }
  void zero_grad() override {
    std::vector<ParamEntry> params;
    for (const auto& c : s_->cuts) {
      // Stage 2: a released gradient stays released (the backward makes it
      // anew); one kept (a group of one, a bucket summed first) is zeroed.
      if (s_->options.parts.release_full_grads && !c.param.tensor.grad().defined()) continue;
      params.push_back(c.param);
    }
    zero_gradients(params);
  }

 private:
  std::shared_ptr<SlicePlan> s_;
  std::shared_ptr<ParamResidency> residency_;
  std::vector<OptimizerOptions> per_param_;  ///< each parameter's group's weight decay
  std::vector<double> scale_;                ///< each parameter's learning-rate scale
};

}  // namespace

std::unique_ptr<Optimizer> make_sharded_optimizer(const OptimizerOptions& options, std::shared_ptr<SlicePlan> plan,
                                                  std::shared_ptr<ParamResidency> residency) {
  return std::make_unique<ShardedOptimizer>(options, std::move(plan), std::move(residency));
}

}  // namespace hp::zero
