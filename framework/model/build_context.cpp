#include "framework/model/build_context.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>

#include <stdexcept>

#include "backends/dist/context.h"
#include "framework/config/config.h"

namespace hp {

namespace {
/// FNV-1a over the name, mixed with the seed (splitmix64 finaliser).
std::uint64_t name_seed(std::uint64_t seed, const std::string& name) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  std::uint64_t z = h ^ (seed + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

at::Tensor initial_value(std::uint64_t seed, const std::string& global_name,
                         const std::vector<std::int64_t>& shape, Init init) {
  switch (init.kind) {
    case Init::Kind::kZeros: return at::zeros(shape);
    case Init::Kind::kOnes: return at::ones(shape);
    case Init::Kind::kNormal: {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(name_seed(seed, global_name));
      return at::normal(0.0, init.std, shape, gen);
    }
  }
  return {};
}

BuildContext::BuildContext(const Config& config, dist::DistributedContext& dist,
                           const LayerRegistry& layers, std::uint64_t seed)
    : config_(config), dist_(&dist), layers_(layers), seed_(seed) {}

int BuildContext::group_size(const std::string& g) const { return dist_->group(g).size(); }
int BuildContext::group_rank(const std::string& g) const { return dist_->group(g).rank(); }
dist::Group* BuildContext::group(const std::string& g) const { return &dist_->group(g); }

std::string BuildContext::data_sync(const std::string& first) const {
  std::string out = first;
  for (const auto& d : dist_->mesh().data_dims()) out += (out.empty() ? "" : "+") + d;
  return out;
}

at::Tensor BuildContext::param(torch::nn::Module& module, const std::string& global_name,
                               const std::string& local_name,
                               const std::vector<std::int64_t>& global_shape, Init init,
                               int split_dim, const std::string& split_group,
                               const std::string& grad_sync_group) {
  if (split_dim >= 0 && split_group.empty()) {
    throw std::logic_error("internal error: parameter '" + global_name + "' is split without a group, please report");
  }
  if (split_dim < 0 || group_size(split_group) == 1) {
    return param_slice(module, global_name, local_name, global_shape, init, -1, 0, 0, "",
                       grad_sync_group);
  }
  const auto box =
      dist::slice_box(global_shape, split_dim, group_size(split_group), group_rank(split_group));
  const auto d = static_cast<std::size_t>(split_dim);
  return param_slice(module, global_name, local_name, global_shape, init, split_dim,
                     box.offsets[d], box.lengths[d], split_group, grad_sync_group);
}

at::Tensor BuildContext::param_slice(torch::nn::Module& module, const std::string& global_name,
                                     const std::string& local_name,
                                     const std::vector<std::int64_t>& global_shape, Init init,
                                     int split_dim, std::int64_t offset, std::int64_t length,
                                     const std::string& split_group,
                                     const std::string& grad_sync_group) {
  for (const auto& p : params_) {
    if (p.spec.name == global_name) {
      throw std::logic_error("model error: parameter '" + global_name +
                             "' is created twice; every parameter needs a unique global name");
    }
  }
  at::Tensor full = initial_value(seed_, global_name, global_shape, init);
  ShardSpec spec;
  spec.name = global_name;
  spec.global_shape = global_shape;
  spec.grad_sync_group = grad_sync_group.empty() ? data_sync() : grad_sync_group;
  at::Tensor local = full;
  if (split_dim >= 0) {
    spec.split_dim = split_dim;
    spec.offset = offset;
    spec.length = length;
    spec.split_group = split_group;
    local = dist::slice_of(full, dist::range_box(global_shape, split_dim, offset, length)).clone();
  }
  at::Tensor p = module.register_parameter(local_name, local.contiguous());
  params_.push_back({spec, p});
  return p;
}

at::Tensor BuildContext::buffer(torch::nn::Module& module, const std::string& global_name,
                                const std::string& local_name, const std::vector<std::int64_t>& shape) {
  ShardSpec spec;
  spec.name = global_name;
  spec.global_shape = shape;
  at::Tensor b = module.register_buffer(local_name, at::zeros(shape));
  buffers_.push_back({spec, b});
  return b;
}

at::Tensor BuildContext::shared(const std::string& key) const {
  auto it = shared_.find(key);
  if (it == shared_.end()) {
    throw std::logic_error("model error: shared tensor '" + key +
                           "' was not created by an earlier block on this rank");
  }
  return it->second;
}

void BuildContext::set_wrapper(const std::string& scope, Wrapper w,
                               WrapperFilter applies) {
  wrappers_[scope] = ScopedWrapper{std::move(w), std::move(applies)};
}

const Wrapper* BuildContext::wrapper(const std::string& scope) const {
  auto it = wrappers_.find(scope);
  if (it == wrappers_.end()) return nullptr;
  if (it->second.applies && !it->second.applies(current_block_, current_block_name_)) return nullptr;
  return &it->second.fn;
}

}  // namespace hp
