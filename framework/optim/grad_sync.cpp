#include "framework/optim/grad_sync.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <map>
#include <stdexcept>

#include "backends/dist/context.h"

namespace hp {

GradSync::GradSync(dist::DistributedContext* dist, std::vector<ParamEntry> params,
                   double bucket_bytes)
    : dist_(dist), params_(std::move(params)), bucket_bytes_(bucket_bytes) {
  for (auto& p : params_) {
    // Every parameter gets a gradient buffer up front so buckets have a fixed
    // layout even when a parameter was not used this step.
    if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
  }
}

void GradSync::all_reduce() {
  if (!dist_) return;
  c10::NoGradGuard no_grad;
  std::map<std::string, std::vector<at::Tensor>> by_group;
  // Reverse order: the last layers' gradients are ready first (as DDP does),
  // which is where overlap would start.
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    by_group[it->spec.grad_sync_group].push_back(it->tensor.grad());
  }
  for (auto& [group_spec, grads] : by_group) {
    // "tp+dp": summed over tp, then over dp (replicated parameters used on
    // a sequence slice under sequence parallel).
    std::vector<dist::Group*> groups;
    std::size_t start = 0;
    while (start <= group_spec.size()) {
      const auto end = std::min(group_spec.find('+', start), group_spec.size());
      auto& g = dist_->group(group_spec.substr(start, end - start));
      if (g.size() > 1) groups.push_back(&g);
      start = end + 1;
    }
    if (groups.empty()) continue;
    std::size_t i = 0;
    while (i < grads.size()) {
      std::vector<at::Tensor> bucket;
      double bytes = 0;
      while (i < grads.size() && (bucket.empty() || bytes + grads[i].nbytes() <= bucket_bytes_)) {
        bytes += static_cast<double>(grads[i].nbytes());
        bucket.push_back(grads[i++]);
      }
      std::vector<at::Tensor> flat_parts;
      for (const auto& t : bucket) flat_parts.push_back(t.reshape({-1}));
      at::Tensor flat = at::cat(flat_parts);
      for (auto* g : groups) g->all_reduce(flat);
      std::int64_t off = 0;
      for (auto& t : bucket) {
        t.copy_(flat.narrow(0, off, t.numel()).view_as(t));
        off += t.numel();
      }
    }
  }
}

double GradSync::global_norm() const {
  c10::NoGradGuard no_grad;
  // Sum of squares per split group: whole parameters are identical on every
  // rank of their tensor-parallel group and count once; split ones are
  // summed over the group that splits them.
  // Accumulated as tensors and read once per group: one .item() per
  // parameter would synchronise on every parameter of every step.
  std::map<std::string, at::Tensor> acc;
  for (const auto& p : params_) {
    const at::Tensor g = p.tensor.grad();
    if (!g.defined()) continue;
    at::Tensor sq = g.to(at::kDouble).pow(2).sum();
    auto& slot = acc[p.spec.sharded() ? p.spec.split_group : ""];
    slot = slot.defined() ? slot + sq : sq;
  }
  std::map<std::string, double> sums;
  for (const auto& [group, t] : acc) sums[group] = t.item<double>();
  double total = sums[""];
  // Every rank reduces the same groups in the same order, whether or not it
  // holds split parameters, so no collective is left waiting.
  for (const char* group : {"tp", "ep"}) {
    const double s = sums.count(group) ? sums[group] : 0.0;
    if (!dist_ || dist_->group(group).size() == 1) {
      total += s;
      continue;
    }
    at::Tensor t = at::full({1}, s, at::kDouble);
    dist_->group(group).all_reduce(t);
    total += t.item<double>();
  }
  for (const auto& [group, s] : sums) {
    if (!group.empty() && group != "tp" && group != "ep") {
      throw std::logic_error("internal error: parameters split over group '" + group +
                             "' are not counted in the gradient norm, please report");
    }
  }
  if (dist_ && dist_->group("pp").size() > 1) {
    at::Tensor t = at::full({1}, total, at::kDouble);
    dist_->group("pp").all_reduce(t);
    total = t.item<double>();
  }
  return std::sqrt(total);
}

double GradSync::clip(double max_norm) {
  const double norm = global_norm();
  if (max_norm > 0 && norm > max_norm) {
    c10::NoGradGuard no_grad;
    const double coef = max_norm / (norm + 1e-6);
    for (auto& p : params_) {
      if (p.tensor.grad().defined()) p.tensor.mutable_grad().mul_(coef);
    }
  }
  return norm;
}

}  // namespace hp
