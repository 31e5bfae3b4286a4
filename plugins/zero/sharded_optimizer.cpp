#include "plugins/zero/sharded_optimizer.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <map>

#include "hp/comm/context.h"
#include "hp/comm/group.h"
#include "hp/optim/buckets.h"

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
    double made_whole = 0;
    std::map<int, double> block_whole;  // stage 3: each block's parameters, gathered whole
    auto whole_of = [](const Cut& c) {
      return static_cast<double>(c.param.tensor.numel()) * static_cast<double>(c.param.tensor.element_size());
    };
    for (const auto& c : s_->cuts) {
      const double item = static_cast<double>(c.param.tensor.element_size());
      const double whole = whole_of(c);
      const double slice = static_cast<double>(c.numel_of(c.me)) * item;
      const bool shared = s_->dist->group(c.shard_group).size() > 1;
      const bool params_sharded = s_->options.parts.shard_params && shared;
      const bool grads_sharded = s_->options.parts.release_full_grads && shared;
      m.params += params_sharded ? slice : whole;
      m.grads += grads_sharded ? slice : whole;
      // A released gradient is made whole again in each backward.
      if (grads_sharded) made_whole += whole;
      if (params_sharded) {
        m.gathered_per_micro_batch += (s_->options.reshard_after_forward ? 2 : 1) * whole;
        block_whole[c.param.block] += whole;
      }
    }
    // At the activations' peak: the whole gradients of a backward and
    // (stage 3) a block gathered whole with the ones prefetched behind it.
    double largest_block = 0;
    for (const auto& [block, bytes] : block_whole) largest_block = std::max(largest_block, bytes);
    m.transient = made_whole + (1 + s_->options.prefetch) * largest_block;
    m.made_whole = made_whole;
    // After the update (whole parameters, stages 1 and 2): the gathers of
    // updated slices travelling, kGathersAhead buckets at a time in model
    // order, each a receive buffer of its parameters' whole size and this
    // rank's slices packed. Their bytes are taken by the next forward as it
    // goes, so they meet the activations only there (the update holds
    // none); at the activations' peak they have all arrived.
    std::vector<std::pair<std::size_t, double>> gathers;  // (first cut, bytes)
    for (const auto& [held, group] : s_->bucket_cuts()) {
      if (s_->options.parts.shard_params || s_->dist->group(group).size() <= 1) continue;
      double bytes = 0;
      for (std::size_t i : held) {
        const Cut& c = s_->cuts[i];
        bytes += whole_of(c) + static_cast<double>(c.numel_of(c.me)) * static_cast<double>(c.param.tensor.element_size());
      }
      gathers.emplace_back(*std::min_element(held.begin(), held.end()), bytes);
    }
    // Sent once per micro-batch, released gradients travel by buckets
    // (GradSlicer): the most kBucketsInFlight consecutive buckets of one
    // group hold, each a flat copy of its gradients and this rank's part.
    if (s_->options.rounds()) {
      std::vector<std::pair<std::string, double>> sends;  // (group, bytes), in launch order
      for (const auto& [held, group] : s_->bucket_cuts()) {
        if (s_->dist->group(group).size() <= 1) continue;
        double bytes = 0;
        for (std::size_t i : held) {
          const Cut& c = s_->cuts[i];
          bytes += whole_of(c) + static_cast<double>(c.numel_of(c.me)) * static_cast<double>(c.param.tensor.element_size());
        }
        sends.emplace_back(group, bytes);
      }
      for (std::size_t first = 0; first < sends.size(); ++first) {
        double window = 0;
        for (std::size_t k = first; k < std::min(sends.size(), first + kBucketsInFlight); ++k)
          if (sends[k].first == sends[first].first) window += sends[k].second;
        m.travelling = std::max(m.travelling, window);
      }
    }
    std::sort(gathers.begin(), gathers.end());
    for (std::size_t first = 0; first < gathers.size(); ++first) {
      double window = 0;
      for (std::size_t k = first; k < std::min(gathers.size(), first + kGathersAhead); ++k) window += gathers[k].second;
      m.after_update = std::max(m.after_update, window);
    }
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
