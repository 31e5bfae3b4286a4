#include "plugins/zero/sharded_optimizer.h"

#include <c10/core/GradMode.h>

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
