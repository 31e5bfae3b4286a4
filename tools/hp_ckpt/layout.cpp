#include "tools/hp_ckpt/layout.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <stdexcept>

namespace hp::ckpt_tool {

const std::vector<std::string>& layout_dims() {
  static const std::vector<std::string> kDims = {"tp", "dp", "ep", "pp"};
  return kDims;
}

namespace {

/// A view as `v` was, with the sizes given in `sizes`; of the dimensions not
/// given, one takes what the others leave (size 0): the replicate one when
/// exactly one is, else the last; the rest are 1.
dist::MeshView resized(dist::MeshView v, const std::map<std::string, int>& sizes) {
  std::vector<std::size_t> missing;
  for (std::size_t i = 0; i < v.dims.size(); ++i) {
    auto it = sizes.find(v.dims[i].name);
    if (it != sizes.end()) {
      v.dims[i].size = it->second;
    } else {
      v.dims[i].size = 1;
      missing.push_back(i);
    }
  }
  if (!missing.empty()) {
    std::size_t rest = missing.back();
    const auto replicate = std::count_if(missing.begin(), missing.end(), [&](std::size_t i) {
      return v.dims[i].role == dist::MeshRole::kReplicate;
    });
    if (replicate == 1) {
      rest = *std::find_if(missing.begin(), missing.end(),
                           [&](std::size_t i) { return v.dims[i].role == dist::MeshRole::kReplicate; });
    }
    v.dims[rest].size = 0;
  }
  return v;
}

}  // namespace

dist::ProcessMesh layout_mesh(const std::map<std::string, int>& sizes, const dist::ProcessMesh* like) {
  const std::string& data = dist::ProcessMesh::data_dim();
  for (const auto& [dim, n] : sizes) {
    if (n < 1) throw std::invalid_argument(dim + " size " + std::to_string(n) + " is below 1: every size is at least 1");
  }
  auto size_of = [&](const std::string& d) {
    auto it = sizes.find(d);
    return it == sizes.end() ? 1 : it->second;
  };
  dist::MeshPlan plan;
  std::set<std::string> known{data}, base{data};
  if (like != nullptr) {
    // The checkpoint's own mesh: every dimension any feature registered.
    for (const auto& d : like->dims()) {
      if (d.name == data) continue;
      plan.claim(d.name, size_of(d.name), d.by, d.role);
      known.insert(d.name);
      base.insert(d.name);
    }
    for (const auto& v : like->views()) {
      plan.view(resized(v, sizes));
      for (const auto& d : v.dims) known.insert(d.name);
    }
    for (const auto& f : like->flats()) {
      plan.flatten(f.name, f.dims, f.by);
      known.insert(f.name);
    }
  }
  // The shipped features' dimensions, for a checkpoint whose run did not
  // have them (a dp-only run converted to tp=2) or that records no mesh.
  if (!known.count("tp")) {
    plan.claim("tp", size_of("tp"), "tensor_parallel", dist::MeshRole::kSplit);
    known.insert("tp");
    base.insert("tp");
  }
  if (!known.count("pp")) {
    plan.claim("pp", size_of("pp"), "pipeline_parallel", dist::MeshRole::kPartition);
    known.insert("pp");
    base.insert("pp");
  }
  if (!known.count("ep")) {
    plan.carve("ep", size_of("ep"), "expert_parallel", dist::MeshRole::kSplit);
    known.insert("ep");
    known.insert(dist::ProcessMesh::carve_remainder("ep"));
  }
  for (const auto& [dim, n] : sizes) {
    if (!known.count(dim)) {
      std::string names;
      for (const auto& k : known) names += (names.empty() ? "" : ", ") + k;
      throw std::invalid_argument("unknown mesh dimension '" + dim + "' (this layout has " + names + ")");
    }
  }
  if (like != nullptr) {
    // Keep the run's rank order when it names every base dimension planned.
    std::set<std::string> ordered;
    std::stringstream ss(like->order());
    for (std::string d; std::getline(ss, d, '-');) ordered.insert(d);
    if (ordered == base) plan.order = like->order();
  }
  int world = 1;
  for (const auto& d : base) world *= size_of(d);
  dist::ProcessMesh mesh;
  dist::MeshProblem problem;
  if (!dist::resolve_mesh(plan, world, size_of(data), mesh, problem)) {
    throw std::invalid_argument(problem.value + ": " + problem.rule + " (legal: " + problem.legal + ")");
  }
  return mesh;
}

std::map<std::string, int> layout_sizes(const dist::ProcessMesh& mesh) {
  std::map<std::string, int> out;
  for (const auto& d : layout_dims()) out[d] = std::max(1, mesh.group_size(d));
  // Any other dimension a feature registered, but what a carve leaves (a
  // layout gives the carved size; the remainder follows).
  std::set<std::string> remainders;
  for (const auto& v : mesh.views())
    for (const auto& d : v.dims) remainders.insert(dist::ProcessMesh::carve_remainder(d.name));
  for (const auto& [d, n] : mesh.sizes()) {
    if (!out.count(d) && !remainders.count(d)) out[d] = n;
  }
  return out;
}

}  // namespace hp::ckpt_tool
