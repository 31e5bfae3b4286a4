#include "tools/hp_ckpt/recut.h"

#include <c10/core/ScalarType.h>

#include <map>
#include <stdexcept>

#include "hp/comm/placement.h"
#include "checkpoint/error.h"
#include "tools/hp_ckpt/hp_ckpt.h"
#include "tools/hp_ckpt/layout.h"

namespace hp::ckpt_tool {
namespace {

/// The groups a split may name: every group of the mesh but the world.
std::vector<std::string> split_group_names(const dist::ProcessMesh& mesh) {
  std::vector<std::string> out;
  for (const auto& g : mesh.group_names()) {
    if (g != "world") out.push_back(g);
  }
  return out;
}

}  // namespace

dist::ProcessMesh target_mesh(const std::map<std::string, int>& sizes, const ckpt::Manifest& source) {
  try {
    return layout_mesh(sizes, source.mesh.get());
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("target layout: ") + e.what());
  }
}

void check_cut(const std::string& name, const ckpt::TensorRecord& tensor, const dist::ProcessMesh& mesh) {
  // Per tensor dimension: the product of the sizes of the groups sharding it.
  std::map<int, std::pair<std::int64_t, std::vector<std::string>>> along;
  for (const auto& p : tensor.placements) {
    if (!p.placement.shards()) continue;
    const int n = mesh.group_size(p.dim);
    if (n == 0) {
      throw ckpt::CheckpointError("cannot cut tensor '" + name + "': it is split over group '" + p.dim +
                                  "', which hp-ckpt does not know (it knows " + join(split_group_names(mesh), ", ") +
                                  ")");
    }
    auto& a = along[p.placement.dim];
    if (a.second.empty()) a.first = 1;
    a.first *= n;
    a.second.push_back(p.dim);
  }
  for (const auto& [dim, a] : along) {
    const auto& [count, groups] = a;
    std::string product;
    for (const auto& g : groups) product += (product.empty() ? "" : " x ") + g + "=" + std::to_string(mesh.group_size(g));
    // An uneven cut is the trainer's own (dist::part_of: the first
    // size % parts pieces one longer, e.g. a vocabulary over tp); a piece of
    // nothing is not: no rank of a run holds an empty shard.
    const auto size = tensor.global_shape.at(static_cast<std::size_t>(dim));
    if (size < count) {
      throw ckpt::CheckpointError(
          "cannot cut tensor '" + name + "' for the target layout: its size " + std::to_string(size) +
          " along dim " + std::to_string(dim) + " (split over " + join(groups, "+") + ") is smaller than " +
          product + (groups.size() > 1 ? " = " + std::to_string(count) : "") +
          " parts, so some ranks would hold nothing; choose sizes whose product is at most " + std::to_string(size));
    }
  }
}

Piece piece_of(const std::string& name, const ckpt::TensorRecord& tensor, const dist::ProcessMesh& mesh, int rank) {
  Piece p;
  p.name = name;
  p.record = &tensor;
  // The trainer's own cut: the tensor's placements at the rank's coordinates.
  const auto part = dist::part_of(tensor.global_shape, tensor.placements, dist::coords_of(mesh, tensor.placements, rank));
  p.offsets = part.boxes.at(0).offsets;
  p.lengths = part.boxes.at(0).lengths;
  p.bytes = c10::elementSize(tensor.dtype);
  for (const auto l : p.lengths) p.bytes *= static_cast<std::uint64_t>(l);
  return p;
}

std::string describe_rank(const dist::ProcessMesh& mesh, int rank) {
  std::string out = "rank " + std::to_string(rank) + ":";
  for (const auto& g : split_group_names(mesh)) out += " " + g + "=" + std::to_string(mesh.group_index(g, rank));
  return out;
}

}  // namespace hp::ckpt_tool
