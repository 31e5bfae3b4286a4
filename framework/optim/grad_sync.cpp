#include "framework/optim/grad_sync.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cmath>
#include <map>
#include <stdexcept>

#include "backends/dist/context.h"
#include "backends/dist/group.h"

namespace hp {

namespace {

/// Consecutive runs of `tensors`, each at most `bucket_bytes` (a tensor
/// larger than that is a bucket alone): the one bucketing rule.
std::vector<std::vector<std::size_t>> cut_buckets(const std::vector<at::Tensor>& tensors, double bucket_bytes) {
  std::vector<std::vector<std::size_t>> out;
  std::size_t i = 0;
  while (i < tensors.size()) {
    std::vector<std::size_t> bucket;
    double bytes = 0;
    while (i < tensors.size() && (bucket.empty() || bytes + tensors[i].nbytes() <= bucket_bytes)) {
      bytes += static_cast<double>(tensors[i].nbytes());
      bucket.push_back(i++);
    }
    out.push_back(std::move(bucket));
  }
  return out;
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> parts;
  parts.reserve(tensors.size());
  for (const auto& t : tensors) parts.push_back(t.reshape({-1}));
  return at::cat(parts);
}

void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  std::int64_t off = 0;
  for (const auto& t : tensors) {
    const_cast<at::Tensor&>(t).copy_(flat.narrow(0, off, t.numel()).view_as(t));
    off += t.numel();
  }
}

std::vector<dist::Group*> groups_to_sum(dist::DistributedContext& dist, const std::vector<std::string>& names) {
  std::vector<dist::Group*> groups;
  for (const auto& name : names) {
    auto& g = dist.group(name);
    if (g.size() > 1) groups.push_back(&g);
  }
  return groups;
}

}  // namespace

void all_reduce_bucketed(dist::DistributedContext& dist, const std::vector<std::string>& group_names,
                         const std::vector<at::Tensor>& tensors, double bucket_bytes) {
  const auto groups = groups_to_sum(dist, group_names);
  if (groups.empty()) return;
  c10::NoGradGuard no_grad;
  for (const auto& idx : cut_buckets(tensors, bucket_bytes)) {
    std::vector<at::Tensor> bucket;
    for (auto i : idx) bucket.push_back(tensors[i]);
    at::Tensor flat = flatten(bucket);
    for (auto* g : groups) g->all_reduce(flat);
    unflatten(flat, bucket);
  }
}

double global_grad_norm(dist::DistributedContext& dist, const std::vector<ParamEntry>& grads) {
  c10::NoGradGuard no_grad;
  // Sum of squares per split group: whole tensors are identical on every
  // rank of their stage and count once; split ones are summed over the
  // groups that split them. Accumulated as tensors and read once per group.
  std::map<std::string, at::Tensor> acc;
  for (const auto& p : grads) {
    if (!p.tensor.defined()) continue;
    at::Tensor sq = p.tensor.to(at::kDouble).pow(2).sum();
    auto& slot = acc[p.spec.sharded() ? p.spec.split_group : ""];
    slot = slot.defined() ? slot + sq : sq;
  }
  // Every rank of a stage holds the same names, so the same split groups in
  // the same (sorted) order: no collective is left waiting.
  double total = 0;
  for (const auto& [joined, t] : acc) {
    at::Tensor s = t.reshape({1});
    for (const auto& name : ShardSpec::groups_of(joined)) {
      auto& g = dist.group(name);
      if (g.size() > 1) g.all_reduce(s);
    }
    total += s.item<double>();
  }
  auto& partition = dist.group(dist::MeshRole::kPartition);
  if (partition.size() > 1) {
    at::Tensor t = at::full({1}, total, at::kDouble);
    partition.all_reduce(t);
    total = t.item<double>();
  }
  return std::sqrt(total);
}

void clip_to(const std::vector<ParamEntry>& grads, double norm, double max_norm) {
  if (max_norm <= 0 || norm <= max_norm) return;
  c10::NoGradGuard no_grad;
  const double coef = max_norm / (norm + 1e-6);
  for (const auto& p : grads) {
    if (p.tensor.defined()) const_cast<at::Tensor&>(p.tensor).mul_(coef);
  }
}

namespace {

class BucketedReducer;

/// Tells the reducer that parameter `index` has accumulated a gradient
/// (a post-hook of its AccumulateGrad node: LibTorch 1.13 has no
/// post-accumulate-grad hook). Holds the reducer through a token the
/// reducer clears when it goes, since a hook cannot be removed.
class AccumulatedHook : public torch::autograd::FunctionPostHook {
 public:
  AccumulatedHook(std::shared_ptr<BucketedReducer*> owner, std::size_t index)
      : owner_(std::move(owner)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override;

 private:
  std::shared_ptr<BucketedReducer*> owner_;
  std::size_t index_;
};

class BucketedReducer : public GradReducer {
 public:
  BucketedReducer(const ReducerOptions& o, std::vector<ParamEntry> params, dist::DistributedContext& dist)
      : o_(o), params_(std::move(params)), dist_(dist) {
    for (auto& p : params_) {
      // Every parameter gets a gradient buffer up front so buckets have a
      // fixed layout even when a parameter was not used this step.
      if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
    }
    plan();
    fires_.assign(params_.size(), 0);
    if (o_.overlap && !buckets_.empty()) {
      token_ = std::make_shared<BucketedReducer*>(this);
      for (std::size_t i = 0; i < params_.size(); ++i) {
        if (bucket_of_[i] < 0 || !params_[i].tensor.requires_grad()) continue;
        // Kept alive here: the variable holds its accumulator weakly, and a
        // new one (without the hook) would be made for each backward.
        auto acc = torch::autograd::impl::grad_accumulator(params_[i].tensor);
        acc->add_post_hook(std::make_unique<AccumulatedHook>(token_, i));
        accumulators_.push_back(std::move(acc));
      }
    }
  }

  ~BucketedReducer() override {
    if (token_) *token_ = nullptr;
  }

  /// A parameter's gradient was accumulated (from its hook).
  void accumulated(std::size_t i) {
    fires_[i] += 1;
    if (!learned_) return;
    const int b = bucket_of_[i];
    Bucket& bucket = buckets_[static_cast<std::size_t>(b)];
    if (fires_[i] == expected_[i]) {
      if (--bucket.waiting == 0) launch_ready(bucket.queue);
    } else if (fires_[i] > expected_[i] && bucket.work) {
      throw std::runtime_error(
          "rank " + std::to_string(dist_.rank()) + ": gradient reduction overlap: " + params_[i].spec.name +
          " received gradient " + std::to_string(fires_[i]) + " of the step after its bucket was launched (the "
          "first step gave it " + std::to_string(expected_[i]) +
          "); the model's backward differs between steps: set distributed.overlap: false");
    }
  }

  void backward_done() override {
    if (!learned_ || flushed_) return;
    flushed_ = true;
    early_ = 0;
    for (const auto& b : buckets_) early_ += b.work ? 1 : 0;
    for (auto& q : queues_) {
      while (q.next < q.order.size()) launch(q.order[q.next++]);
    }
  }

  void reduce() override {
    c10::NoGradGuard no_grad;
    if (!learned_) {
      // The first step: count each parameter's gradients (hooks fire once
      // per backward that reaches it), then reduce without overlap.
      for (auto& set : sets_) {
        for (auto b : set.buckets) {
          at::Tensor flat = flatten(grads_of(buckets_[b]));
          for (auto* g : set.groups) g->all_reduce(flat);
          unflatten(flat, grads_of(buckets_[b]));
        }
      }
      expected_ = fires_;
      learned_ = !accumulators_.empty();
    } else {
      backward_done();
      for (auto& set : sets_) {
        for (auto b : set.buckets) {
          Bucket& bucket = buckets_[b];
          at::Tensor flat = bucket.work->wait();
          for (std::size_t k = 1; k < set.groups.size(); ++k) set.groups[k]->all_reduce(flat);
          unflatten(flat, grads_of(bucket));
          bucket.work.reset();
        }
      }
    }
    flushed_ = false;
    // Ready for the next step.
    std::fill(fires_.begin(), fires_.end(), 0);
    for (auto& q : queues_) q.next = 0;
    for (auto& bucket : buckets_) {
      // A bucket holding a parameter that got no gradient in the first step
      // is never ready from hooks: backward_done launches it.
      bucket.waiting = static_cast<int>(bucket.params.size());
      for (auto i : bucket.params) {
        if (expected_[i] == 0) bucket.waiting = -1;
      }
      bucket.ready = false;
    }
  }

  double clip(double max_norm) override {
    const auto grads = gradients();
    const double norm = global_grad_norm(dist_, grads);
    clip_to(grads, norm, max_norm);
    return norm;
  }

  std::vector<ParamEntry> gradients() const override {
    std::vector<ParamEntry> out;
    for (const auto& p : params_) out.push_back({p.spec, p.tensor.grad()});
    return out;
  }

  void report(std::map<std::string, double>& figures) const override {
    figures["grad_buckets"] = static_cast<double>(buckets_.size());
    // Launched during backward, from the hooks (0 in the first step and
    // without overlap).
    figures["grad_buckets_early"] = static_cast<double>(early_);
  }

 private:
  struct Bucket {
    std::vector<std::size_t> params;  ///< indices into params_
    std::size_t set = 0;              ///< index into sets_
    std::size_t queue = 0;            ///< index into queues_
    int waiting = 0;                  ///< parameters still to receive their last gradient (-1: never ready early)
    bool ready = false;
    std::unique_ptr<dist::Work> work;  ///< the first group's all-reduce, once launched
  };
  /// Parameters with one grad_sync_group list, bucketed.
  struct Set {
    std::vector<dist::Group*> groups;
    std::vector<std::size_t> buckets;
  };
  /// The buckets that start on one group, in the blocking path's order:
  /// launched strictly in that order, so every member issues the same
  /// sequence on that group whatever the order gradients arrive in.
  struct Queue {
    dist::Group* group = nullptr;
    std::vector<std::size_t> order;
    std::size_t next = 0;
  };

  void plan() {
    // Reverse order: the last layers' gradients are ready first (as DDP does).
    std::map<std::string, std::vector<std::size_t>> by_set;
    for (std::size_t i = params_.size(); i-- > 0;) by_set[params_[i].spec.grad_sync_group].push_back(i);
    bucket_of_.assign(params_.size(), -1);
    for (const auto& [joined, idx] : by_set) {
      Set set;
      set.groups = groups_to_sum(dist_, ShardSpec::groups_of(joined));
      if (set.groups.empty()) continue;
      std::size_t q = 0;
      while (q < queues_.size() && queues_[q].group != set.groups[0]) ++q;
      if (q == queues_.size()) queues_.push_back({set.groups[0], {}, 0});
      std::vector<at::Tensor> grads;
      for (auto i : idx) grads.push_back(params_[i].tensor.grad());
      for (const auto& run : cut_buckets(grads, o_.bucket_bytes)) {
        Bucket b;
        for (auto k : run) {
          b.params.push_back(idx[k]);
          bucket_of_[idx[k]] = static_cast<int>(buckets_.size());
        }
        b.set = sets_.size();
        b.queue = q;
        b.waiting = static_cast<int>(b.params.size());
        set.buckets.push_back(buckets_.size());
        queues_[q].order.push_back(buckets_.size());
        buckets_.push_back(std::move(b));
      }
      sets_.push_back(std::move(set));
    }
  }

  std::vector<at::Tensor> grads_of(const Bucket& b) const {
    std::vector<at::Tensor> out;
    for (auto i : b.params) out.push_back(params_[i].tensor.grad());
    return out;
  }

  void launch(std::size_t b) {
    Bucket& bucket = buckets_[b];
    if (bucket.work) return;
    c10::NoGradGuard no_grad;
    bucket.work = sets_[bucket.set].groups[0]->all_reduce_async(flatten(grads_of(bucket)));
  }

  /// Marks the bucket ready and launches every ready bucket at the head of
  /// its queue.
  void launch_ready(std::size_t q) {
    Queue& queue = queues_[q];
    for (auto b : queue.order) {
      if (buckets_[b].waiting == 0) buckets_[b].ready = true;
    }
    while (queue.next < queue.order.size() && buckets_[queue.order[queue.next]].ready) {
      launch(queue.order[queue.next++]);
    }
  }

  ReducerOptions o_;
  std::vector<ParamEntry> params_;
  dist::DistributedContext& dist_;
  std::vector<Set> sets_;
  std::vector<Bucket> buckets_;
  std::vector<Queue> queues_;
  std::vector<int> bucket_of_;  ///< bucket of each parameter, -1: nothing to sum over
  std::vector<int> fires_;      ///< gradients accumulated this step, per parameter
  std::vector<int> expected_;   ///< the same, counted in the first step
  bool learned_ = false;        ///< expected_ is known and hooks launch buckets
  std::size_t early_ = 0;       ///< buckets of the last step launched during backward
  bool flushed_ = false;        ///< backward_done ran this step
  std::shared_ptr<BucketedReducer*> token_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
};

torch::autograd::variable_list AccumulatedHook::operator()(const torch::autograd::variable_list& outputs,
                                                           const torch::autograd::variable_list& /*inputs*/) {
  if (*owner_) (*owner_)->accumulated(index_);
  return outputs;
}

}  // namespace

std::unique_ptr<GradReducer> make_bucketed_reducer(const ReducerOptions& options, const std::vector<ParamEntry>& params,
                                                   dist::DistributedContext& dist) {
  return std::make_unique<BucketedReducer>(options, params, dist);
}

}  // namespace hp
