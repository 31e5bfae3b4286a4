#include "hp/model/build_context.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <stdexcept>

#include "hp/comm/context.h"
#include "hp/config/config.h"

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

at::Tensor BuildContext::param(torch::nn::Module& module, const std::string& global_name,
                               const std::string& local_name,
                               const std::vector<std::int64_t>& global_shape, Init init,
                               dist::Placements placements, std::vector<std::string> partial_grad) {
  // A placement over a dimension of one rank changes nothing: leave it out,
  // so the same parameter has the same spec whatever the feature's size.
  placements.erase(std::remove_if(placements.begin(), placements.end(),
                                  [&](const dist::DimPlacement& p) { return group_size(p.dim) == 1; }),
                   placements.end());
  partial_grad.erase(std::remove_if(partial_grad.begin(), partial_grad.end(),
                                    [&](const std::string& d) { return group_size(d) == 1; }),
                     partial_grad.end());
  const auto coords = dist::coords_of(dist_->mesh(), placements, dist_->rank());
  return param_at(module, global_name, local_name, global_shape, init, std::move(placements), coords,
                  std::move(partial_grad));
}

at::Tensor BuildContext::param_at(torch::nn::Module& module, const std::string& global_name,
                                  const std::string& local_name, const std::vector<std::int64_t>& global_shape,
                                  Init init, dist::Placements placements, const std::vector<dist::MeshCoord>& coords,
                                  std::vector<std::string> partial_grad) {
  for (const auto& p : params_) {
    if (p.spec.name == global_name) {
      throw std::logic_error("model error: parameter '" + global_name +
                             "' is created twice; every parameter needs a unique global name");
    }
  }
  const auto part = dist::part_of(global_shape, placements, coords);
  if (part.boxes.size() != 1 || part.partial) {
    throw std::logic_error("model error: parameter '" + global_name + "' is placed " + dist::describe(placements) +
                           "; a parameter's part must be one box (shard or replicate, no head-tail or partial)");
  }
  ShardSpec spec;
  spec.name = global_name;
  spec.global_shape = global_shape;
  spec.grad = placements;
  for (const auto& d : partial_grad) spec.grad.push_back({d, dist::Placement::partial()});
  for (const auto& d : dist_->mesh().grad_sync_dims(dist::shard_dims(placements))) {
    spec.grad.push_back({d, dist::Placement::partial()});
  }
  spec.placements = std::move(placements);
  spec.box = part.boxes[0];
  at::Tensor full = meta_ ? at::empty(global_shape, at::TensorOptions().device(at::kMeta))
                         : initial_value(seed_, global_name, global_shape, init);
  at::Tensor p = module.register_parameter(local_name, dist::cut(full, part));
  params_.push_back({spec, p, current_block_});
  return p;
}

at::Tensor BuildContext::buffer(torch::nn::Module& module, const std::string& global_name,
                                const std::string& local_name, const std::vector<std::int64_t>& shape) {
  ShardSpec spec;
  spec.name = global_name;
  spec.global_shape = shape;
  at::Tensor b = module.register_buffer(
      local_name, meta_ ? at::empty(shape, at::TensorOptions().device(at::kMeta)) : at::zeros(shape));
  buffers_.push_back({spec, b});
  return b;
}

void BuildContext::mark_embedding(const at::Tensor& p) {
  for (auto& e : params_) {
    if (e.tensor.is_same(p)) e.embedding = true;
  }
}

void BuildContext::mark_kept_copies(const at::Tensor& p, int copies) {
  for (auto& e : params_) {
    if (e.tensor.is_same(p)) e.kept_copies = copies;
  }
}

at::Tensor BuildContext::shared(const std::string& key) {
  auto it = shared_.find(key);
  if (it == shared_.end()) {
    throw std::logic_error("model error: shared tensor '" + key +
                           "' was not created by an earlier block on this rank");
  }
  for (auto& p : params_) {
    if (p.tensor.is_same(it->second) && p.block != current_block_) p.also_used_by.push_back(current_block_);
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
