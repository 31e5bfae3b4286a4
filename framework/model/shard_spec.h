#pragma once
// How one parameter of this rank relates to the full, layout-independent
// tensor: its global name and shape, which dimension is split and which slice
// this rank holds, and over which group its gradient is averaged.
#include <cstdint>
#include <string>
#include <vector>

namespace hp {

struct ShardSpec {
  std::string name;                       ///< "blocks.3.attn.qkv.weight", the same on every layout
  std::vector<std::int64_t> global_shape;
  int split_dim = -1;                     ///< -1: this rank holds the whole tensor
  std::int64_t offset = 0;                ///< start of this rank's slice along split_dim
  std::int64_t length = 0;                ///< its length along split_dim
  /// Group the parameter is split over ("tp", or "ep" for experts); "" when whole.
  std::string split_group;
  /// Group whose ranks hold replicas whose gradients are averaged: "dp"
  /// normally, "edp" for expert parameters.
  /// Group(s) the gradient is summed over after backward; "tp+dp" sums over
  /// tp, then dp.
  std::string grad_sync_group = "dp";

  bool sharded() const { return split_dim >= 0; }
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
