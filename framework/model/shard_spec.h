#pragma once
// How one parameter of this rank relates to the full, layout-independent
// tensor: its global name and shape, which dimension is split and which slice
// this rank holds, and over which group its gradient is averaged.
#include <cstdint>
#include <string>
#include <vector>

#include "backends/dist/mesh.h"

namespace hp {

struct ShardSpec {
  std::string name;                       ///< "blocks.3.attn.qkv.weight", the same on every layout
  std::vector<std::int64_t> global_shape;
  int split_dim = -1;                     ///< -1: this rank holds the whole tensor
  std::int64_t offset = 0;                ///< start of this rank's slice along split_dim
  std::int64_t length = 0;                ///< its length along split_dim
  /// Group(s) the tensor is split over, "" when whole. Several joined by
  /// '+' split it again, outermost first: "tp+dp" is a tensor-parallel slice
  /// cut once more over the data-parallel ranks (zero's optimizer state);
  /// all levels split the same dimension, so the slice is still one range.
  std::string split_group;
  /// Group(s) the gradient is summed over after backward, joined by '+'
  /// in order: the mesh's data dimensions normally (BuildContext fills them
  /// in: replicate and sequence roles), a split group first for replicated
  /// parameters used on a sequence slice, a view's replicate dimension for
  /// parameters held along a view (experts).
  std::string grad_sync_group = dist::ProcessMesh::data_dim();

  bool sharded() const { return split_dim >= 0; }
  /// split_group / grad_sync_group as a list.
  std::vector<std::string> split_groups() const { return groups_of(split_group); }
  std::vector<std::string> grad_sync_groups() const { return groups_of(grad_sync_group); }
  static std::vector<std::string> groups_of(const std::string& joined) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (start < joined.size()) {
      auto end = joined.find('+', start);
      if (end == std::string::npos) end = joined.size();
      if (end > start) out.push_back(joined.substr(start, end - start));
      start = end + 1;
    }
    return out;
  }
  /// Offsets of this rank's slice in the global tensor, per dimension.
  std::vector<std::int64_t> offsets() const {
    std::vector<std::int64_t> o(global_shape.size(), 0);
    if (sharded()) o[static_cast<std::size_t>(split_dim)] = offset;
    return o;
  }
  std::vector<std::int64_t> local_shape() const {
    auto s = global_shape;
    if (sharded()) s[static_cast<std::size_t>(split_dim)] = length;
    return s;
  }
};

}  // namespace hp
