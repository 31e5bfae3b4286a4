#include "tools/hp_ckpt/layout.h"

#include <algorithm>
#include <stdexcept>

namespace hp::ckpt_tool {

const std::vector<std::string>& layout_dims() {
  static const std::vector<std::string> kDims = {"tp", "dp", "ep", "pp"};
  return kDims;
}

dist::ProcessMesh layout_mesh(const std::map<std::string, int>& sizes) {
  std::map<std::string, int> full{{"pp", 1}, {"dp", 1}, {"tp", 1}, {"ep", 1}};
  for (const auto& [dim, n] : sizes) {
    if (full.count(dim) == 0) {
      throw std::invalid_argument("unknown mesh dimension '" + dim + "' (a layout is given by tp, dp, ep and pp)");
    }
    if (n < 1) throw std::invalid_argument(dim + " size " + std::to_string(n) + " is below 1: every size is at least 1");
    full[dim] = n;
  }
  dist::MeshPlan plan;
  plan.claim("tp", full["tp"], "tensor_parallel", dist::MeshRole::kSplit);
  plan.claim("pp", full["pp"], "pipeline_parallel", dist::MeshRole::kPartition);
  plan.carve("ep", full["ep"], "edp", "expert_parallel", dist::MeshRole::kSplit);
  dist::ProcessMesh mesh;
  dist::MeshProblem problem;
  const int world = full["tp"] * full["pp"] * full["dp"];
  if (!dist::resolve_mesh(plan, world, full["dp"], mesh, problem)) {
    throw std::invalid_argument(problem.value + ": " + problem.rule + " (legal: " + problem.legal + ")");
  }
  return mesh;
}

std::map<std::string, int> layout_sizes(const dist::ProcessMesh& mesh) {
  std::map<std::string, int> out;
  for (const auto& d : layout_dims()) out[d] = std::max(1, mesh.group_size(d));
  return out;
}

}  // namespace hp::ckpt_tool
