#include "plugins/zero/grad_slicer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <deque>

#include "hp/comm/context.h"
#include "hp/comm/group.h"
#include "hp/memory/block_cache.h"
#include "hp/optim/buckets.h"

namespace hp::zero {

namespace {

/// Reduce-scatters gradient buckets; with distributed.overlap each bucket
/// without a pre-sum is launched during backward as soon as its gradients
/// are complete (BucketLauncher), those with one (tp first) after backward,
/// once their pre-sum is done.
class GradSlicer : public GradReducer {
 public:
  GradSlicer(std::shared_ptr<SlicePlan> s, std::shared_ptr<ParamResidency> residency)
      : s_(std::move(s)), residency_(std::move(residency)) {
    const bool overlap = s_->options.overlap;
    plan_ = s_->buckets();
    std::vector<std::vector<std::size_t>> members, queues;
    std::vector<bool> hooked;
    std::map<std::pair<bool, std::string>, std::size_t> queue_of;  // hooked queues sort first
    for (std::size_t b = 0; b < plan_.size(); ++b) {
      std::vector<std::size_t> params;
      for (auto i : plan_[b].cuts) params.push_back(i);
      members.push_back(params);
      const bool hook = plan_[b].hooked;
      queue_of.emplace(std::make_pair(!hook, plan_[b].group), 0);
    }
    for (auto& [key, q] : queue_of) {
      q = queues.size();
      queues.emplace_back();
      hooked.push_back(!key.first);
    }
    for (std::size_t b = 0; b < plan_.size(); ++b) {
      const bool hook = plan_[b].hooked;
      queues[queue_of.at({!hook, plan_[b].group})].push_back(b);
    }
    works_.resize(plan_.size());
    finished_.assign(plan_.size(), false);
    std::vector<ParamEntry> params;
    for (const auto& c : s_->cuts) params.push_back(c.param);
    launcher_ = std::make_unique<BucketLauncher>(params, std::move(members), std::move(queues), std::move(hooked),
                                                 overlap, s_->dist->rank(), [this](std::size_t b) { launch(b); });
    // reduce_per_micro_batch (stages 2 and 3: what a launch sent is
    // released, so each round carries its own micro-batch's gradients).
    // The rounds (micro-batches) are learned from the first step's counts.
    if (s_->options.rounds()) launcher_->learn_rounds();
  }
  // Stages 2 and 3 release what a launch sent, so the first step can launch
  // on a guess (one gradient per micro-batch) instead of holding every full
  // gradient until its end.
  void begin_step(int micro_batches) override {
    if (release()) launcher_->guess_first_step(micro_batches);
    // A rank that sums the full gradients of several micro-batches before
    // reducing holds all of them at its peak: the block cache keeps their
    // bytes on top of block_cache_mb, so they are not unmapped after each
    // reduction and faulted in again the next step.
    if (s_->options.block_cache_bytes > 0 && micro_batches != micro_batches_) {
      micro_batches_ = micro_batches;
      std::size_t full = 0;
      if (micro_batches > 1 && !s_->options.rounds()) {
        for (const auto& c : s_->cuts) full += static_cast<std::size_t>(c.param.tensor.numel()) * c.param.tensor.element_size();
      }
      memory::use_block_cache(kBlockCacheMin, s_->options.block_cache_bytes + full);
    }
  }
  void backward_done() override { launcher_->flush(); }
  void reduce() override {
    launcher_->flush();
    for (std::size_t b = 0; b < plan_.size(); ++b) finish(b);
    launched_.clear();
    finished_.assign(plan_.size(), false);
    for (auto& c : s_->cuts) c.summed = false;
    launcher_->end_step();
    residency_->step_end();
    memory::trim_block_cache();
  }
  void accumulated(const at::Tensor& param) override {
    if (launcher_) launcher_->accumulated(param);
  }
  void report(std::map<std::string, double>& figures) const override {
    figures["grad_buckets"] = static_cast<double>(launcher_->size());
    figures["grad_buckets_early"] = static_cast<double>(launcher_->early());
    // Reduce-scatters of the step: one per bucket, or one per bucket and
    // micro-batch with reduce_per_micro_batch.
    figures["zero_reduce_scatters"] = static_cast<double>(launches_);
    launches_ = 0;
    // Gradient memory after the reduction: full gradients still held (stage
    // 1 keeps every one; stage 2 only those of groups of one) and slices.
    double full = 0, slices = 0;
    for (const auto& c : s_->cuts) {
      const auto& g = c.param.tensor.grad();
      if (g.defined()) full += static_cast<double>(g.nbytes());
      if (c.slice_grad.defined() && !(g.defined() && c.slice_grad.is_alias_of(g))) {
        slices += static_cast<double>(c.slice_grad.numel() * c.slice_grad.element_size());
      }
    }
    figures["zero_full_grad_bytes"] = full;
    figures["zero_slice_grad_bytes"] = slices;
    // Parameter bytes held and the gathers of the step.
    residency_->report(figures);
  }
  double clip(double max_norm) override {
    const auto grads = s_->gradients();
    const double norm = global_grad_norm(*s_->dist, grads);
    clip_to(grads, norm, max_norm);
    return norm;
  }
  std::vector<ParamEntry> gradients() const override { return s_->gradients(); }

 private:
  /// Stage 2: drops the full gradients of a bucket's parameters (its
  /// reduce-scatter has copied them); the next backward starts them afresh.
  void release_grads(const Bucket& bucket) {
    for (std::size_t i : bucket.cuts) s_->cuts[i].param.tensor.mutable_grad() = at::Tensor();
  }

  /// Starts the redistribution of one bucket's gradients (every member's
  /// slices packed member-major, summed in member order, so every replica
  /// adds in the same order).
  std::unique_ptr<dist::Redistributor::Pending> launch_scatter(const Bucket& bucket) const {
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> grads;
    for (std::size_t i : bucket.cuts) {
      // Stage 2 starts a step without gradients: one no backward reached has none.
      auto& p = s_->cuts[i].param.tensor;
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      grads.push_back(p.grad());
    }
    return bucket.redist->start(grads);
  }

  /// Waits a bucket's redistribution; the slices' gradients are views into
  /// the summed bucket (no copy), or the full gradients for a group of one.
  void finish_scatter(const Bucket& bucket, std::unique_ptr<dist::Redistributor::Pending> work) {
    c10::NoGradGuard no_grad;
    const auto parts = bucket.redist->finish(std::move(work));
    const bool keep_full = !release() && !bucket.redist->steps().empty();
    for (std::size_t k = 0; k < bucket.cuts.size(); ++k) {
      auto& c = s_->cuts[bucket.cuts[k]];
      if (keep_full) {
        // Stage 1 keeps the full gradient: the reduced slice is stored in
        // its own range of it (the full gradient's other ranges are this
        // rank's unreduced sums, read by nothing), so no second buffer of
        // half the gradients outlives the reduction.
        auto own = c.slice_of(c.param.tensor.grad(), c.me);
        own.copy_(parts[k]);
        c.slice_grad = own;
      } else if (c.summed) {
        // A later round of the step (reduce_per_micro_batch) adds to the sum.
        c.slice_grad.add_(parts[k]);
      } else if (c.own_slice_grad) {
        c.slice_grad.copy_(parts[k]);
      } else {
        c.slice_grad = parts[k];
      }
      c.summed = true;
    }
  }

  void launch(std::size_t b) {
    // A bucket launched again in the same step (another round) first
    // collects its previous launch.
    if (works_[b] && !finished_[b]) finish(b);
    finished_[b] = false;
    ++launches_;
    works_[b] = launch_scatter(plan_[b]);
    // Stage 2: the redistribution holds its own copy of the bucket's
    // gradients (a group of one has none to send and keeps them).
    if (release() && !plan_[b].redist->steps().empty()) release_grads(plan_[b]);
    // At most kBucketsInFlight buckets travel at once: each holds a flat copy of
    // its gradients, a receive buffer of the same size and its sum, so
    // launching every bucket before waiting any held three times the
    // gradients at the end of backward. Finishing the oldest is the same
    // sum, earlier.
    launched_.push_back(b);
    while (launched_.size() > kBucketsInFlight) {
      finish(launched_.front());
      launched_.pop_front();
    }
  }
  void finish(std::size_t b) {
    if (finished_[b]) return;
    finish_scatter(plan_[b], std::move(works_[b]));
    works_[b].reset();
    finished_[b] = true;
  }
  mutable std::size_t launches_ = 0;  ///< this step's, until reported
  int micro_batches_ = 0;             ///< of the last step (the block cache's cap follows it)
  std::deque<std::size_t> launched_;
  std::vector<bool> finished_;
  bool release() const { return s_->options.parts.release_full_grads; }
  std::shared_ptr<SlicePlan> s_;
  std::shared_ptr<ParamResidency> residency_;
  std::vector<Bucket> plan_;
  std::vector<std::unique_ptr<dist::Redistributor::Pending>> works_;
  std::unique_ptr<BucketLauncher> launcher_;
};

}  // namespace

std::unique_ptr<GradReducer> make_grad_slicer(std::shared_ptr<SlicePlan> plan,
                                              std::shared_ptr<ParamResidency> residency) {
  return std::make_unique<GradSlicer>(std::move(plan), std::move(residency));
}

}  // namespace hp::zero
