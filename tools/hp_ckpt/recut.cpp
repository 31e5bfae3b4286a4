#include "tools/hp_ckpt/recut.h"

#include <c10/core/ScalarType.h>

#include <stdexcept>

#include "backends/dist/slice.h"
#include "checkpoint/error.h"
#include "tools/hp_ckpt/hp_ckpt.h"
#include "tools/hp_ckpt/layout.h"

namespace hp::ckpt_tool {
namespace {

/// The groups a split may name: every group of the mesh but the world.
std::vector<std::string> split_group_names() {
  std::vector<std::string> out;
  for (const auto& g : layout_mesh({}).group_names()) {
    if (g != "world") out.push_back(g);
  }
  return out;
}

}  // namespace

dist::ProcessMesh target_mesh(const std::map<std::string, int>& sizes) {
  try {
    return layout_mesh(sizes);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("target layout: ") + e.what());
  }
}

std::int64_t piece_count(const std::string& name, const ckpt::TensorRecord& tensor,
                         const dist::ProcessMesh& mesh) {
  if (tensor.split_dim < 0) {
    return 1;
  }
  std::int64_t count = 1;
  std::string product;
  for (const auto& g : tensor.split_groups) {
    const int n = mesh.group_size(g);
    if (n == 0) {
      throw ckpt::CheckpointError("cannot cut tensor '" + name + "': it is split over group '" + g +
                                  "', which hp-ckpt does not know (it knows " + join(split_group_names(), ", ") +
                                  ")");
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
  // The trainer's own cut (piece_count has refused a size the groups do not
  // divide, so every piece is equal).
  auto box = dist::slice_box(tensor.global_shape, tensor.split_dim,
                             piece_count(name, tensor, mesh), index);
  p.offsets = std::move(box.offsets);
  p.lengths = std::move(box.lengths);
  p.bytes = c10::elementSize(tensor.dtype);
  for (const auto l : p.lengths) p.bytes *= static_cast<std::uint64_t>(l);
  return p;
}

std::int64_t piece_index(const ckpt::TensorRecord& tensor, const dist::ProcessMesh& mesh,
                         int rank) {
  if (tensor.split_dim < 0) {
    return 0;
  }
  std::int64_t index = 0;
  for (const auto& g : tensor.split_groups) {
    index = index * mesh.group_size(g) + mesh.group_index(g, rank);
  }
  return index;
}

std::string describe_rank(const dist::ProcessMesh& mesh, int rank) {
  std::string out = "rank " + std::to_string(rank) + ":";
  for (const auto& g : split_group_names()) out += " " + g + "=" + std::to_string(mesh.group_index(g, rank));
  return out;
}

}  // namespace hp::ckpt_tool
