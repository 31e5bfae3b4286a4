#include "tools/hp_ckpt/recut.h"

#include <c10/core/ScalarType.h>

#include <stdexcept>

#include "checkpoint/error.h"
#include "tools/hp_ckpt/hp_ckpt.h"

namespace hp::ckpt_tool {
namespace {

const char* const kKnownGroups = "tp, dp, ep, edp, pp";

/// Size of group `group` on `mesh`, or 0 when the mesh has no such group.
int group_size(const dist::ProcessMesh& mesh, const std::string& group) {
  if (group == "tp") return mesh.tp_size();
  if (group == "dp") return mesh.dp_size();
  if (group == "ep") return mesh.ep_size();
  if (group == "edp") return mesh.edp_size();
  if (group == "pp") return mesh.pp_size();
  return 0;
}

int group_coord(const dist::MeshCoord& c, const std::string& group) {
  if (group == "tp") return c.tp;
  if (group == "dp") return c.dp;
  if (group == "ep") return c.ep;
  if (group == "edp") return c.edp;
  return c.pp;
}

}  // namespace

dist::ProcessMesh target_mesh(int pp, int dp, int tp, int ep) {
  if (pp < 1 || dp < 1 || tp < 1 || ep < 1) {
    throw UsageError("target layout pp=" + std::to_string(pp) + " dp=" + std::to_string(dp) +
                     " tp=" + std::to_string(tp) + " ep=" + std::to_string(ep) +
                     ": every size must be at least 1");
  }
  if (dp % ep != 0) {
    throw UsageError("target layout --ep " + std::to_string(ep) + " --dp " + std::to_string(dp) +
                     ": expert parallel is carved out of data parallel, so --ep must divide --dp");
  }
  return dist::ProcessMesh(pp, dp, tp, ep);
}

std::int64_t piece_count(const std::string& name, const ckpt::TensorRecord& tensor,
                         const dist::ProcessMesh& mesh) {
  if (tensor.split_dim < 0) {
    return 1;
  }
  std::int64_t count = 1;
  std::string product;
  for (const auto& g : tensor.split_groups) {
    const int n = group_size(mesh, g);
    if (n == 0) {
      throw ckpt::CheckpointError("cannot cut tensor '" + name + "': it is split over group '" + g +
                                  "', which hp-ckpt does not know (it knows " + kKnownGroups + ")");
    }
    count *= n;
    product += (product.empty() ? "" : " x ") + g + "=" + std::to_string(n);
  }
  const auto size = tensor.global_shape.at(static_cast<std::size_t>(tensor.split_dim));
  if (size % count != 0) {
    throw ckpt::CheckpointError(
        "cannot cut tensor '" + name + "' for the target layout: its size " + std::to_string(size) +
        " along dim " + std::to_string(tensor.split_dim) + " (split over " +
        join(tensor.split_groups, "+") + ") is not divisible by " + product +
        (tensor.split_groups.size() > 1 ? " = " + std::to_string(count) : "") +
        "; choose sizes that divide " + std::to_string(size));
  }
  return count;
}

Piece piece(const std::string& name, const ckpt::TensorRecord& tensor,
            const dist::ProcessMesh& mesh, std::int64_t index) {
  Piece p;
  p.name = name;
  p.record = &tensor;
  p.offsets.assign(tensor.global_shape.size(), 0);
  p.lengths = tensor.global_shape;
  if (tensor.split_dim >= 0) {
    const auto d = static_cast<std::size_t>(tensor.split_dim);
    const auto length = tensor.global_shape[d] / piece_count(name, tensor, mesh);
    p.offsets[d] = index * length;
    p.lengths[d] = length;
  }
  p.bytes = c10::elementSize(tensor.dtype);
  for (const auto l : p.lengths) p.bytes *= static_cast<std::uint64_t>(l);
  return p;
}

std::int64_t piece_index(const ckpt::TensorRecord& tensor, const dist::ProcessMesh& mesh,
                         int rank) {
  if (tensor.split_dim < 0) {
    return 0;
  }
  const auto c = mesh.coord(rank);
  std::int64_t index = 0;
  for (const auto& g : tensor.split_groups) {
    index = index * group_size(mesh, g) + group_coord(c, g);
  }
  return index;
}

std::string describe_rank(const dist::ProcessMesh& mesh, int rank) {
  const auto c = mesh.coord(rank);
  return "rank " + std::to_string(rank) + ": pp=" + std::to_string(c.pp) +
         " dp=" + std::to_string(c.dp) + " tp=" + std::to_string(c.tp) +
         " ep=" + std::to_string(c.ep) + " edp=" + std::to_string(c.edp);
}

}  // namespace hp::ckpt_tool
