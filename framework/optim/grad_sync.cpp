#include "framework/optim/grad_sync.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <map>
#include <stdexcept>

#include "backends/dist/context.h"

namespace hp {

void all_reduce_bucketed(dist::DistributedContext& dist, const std::vector<std::string>& group_names,
                         const std::vector<at::Tensor>& tensors, double bucket_bytes) {
  std::vector<dist::Group*> groups;
  for (const auto& name : group_names) {
    auto& g = dist.group(name);
    if (g.size() > 1) groups.push_back(&g);
  }
  if (groups.empty()) return;
  c10::NoGradGuard no_grad;
  std::size_t i = 0;
  while (i < tensors.size()) {
    std::vector<at::Tensor> bucket;
    double bytes = 0;
    while (i < tensors.size() && (bucket.empty() || bytes + tensors[i].nbytes() <= bucket_bytes)) {
      bytes += static_cast<double>(tensors[i].nbytes());
      bucket.push_back(tensors[i++]);
    }
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : bucket) flat_parts.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    for (auto* g : groups) g->all_reduce(flat);
    std::int64_t off = 0;
    for (auto& t : bucket) {
      const_cast<at::Tensor&>(t).copy_(flat.narrow(0, off, t.numel()).view_as(t));
      off += t.numel();
    }
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

class BucketedReducer : public GradReducer {
 public:
  BucketedReducer(const ReducerOptions& o, std::vector<ParamEntry> params, dist::DistributedContext& dist)
      : o_(o), params_(std::move(params)), dist_(dist) {
    for (auto& p : params_) {
      // Every parameter gets a gradient buffer up front so buckets have a
      // fixed layout even when a parameter was not used this step.
      if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
    }
  }

  void reduce() override {
    std::map<std::string, std::vector<at::Tensor>> by_group;
    // Reverse order: the last layers' gradients are ready first (as DDP
    // does), which is where overlap would start.
    for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
      by_group[it->spec.grad_sync_group].push_back(it->tensor.grad());
    }
    for (auto& [joined, grads] : by_group) {
      all_reduce_bucketed(dist_, ShardSpec::groups_of(joined), grads, o_.bucket_bytes);
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

 private:
  ReducerOptions o_;
  std::vector<ParamEntry> params_;
  dist::DistributedContext& dist_;
};

}  // namespace

std::unique_ptr<GradReducer> make_bucketed_reducer(const ReducerOptions& options, const std::vector<ParamEntry>& params,
                                                   dist::DistributedContext& dist) {
  return std::make_unique<BucketedReducer>(options, params, dist);
}

}  // namespace hp
