#pragma once
// How one parameter of this rank relates to the full, layout-independent
// tensor: its global name and shape, its placements over the mesh (which
// dimensions shard it, along which tensor dimension), the box of it this
// rank holds, and the mesh dimensions its gradient is summed over.
#include <cstdint>
#include <string>
#include <vector>

#include "hp/comm/placement.h"

namespace hp {

struct ShardSpec {
  std::string name;  ///< "blocks.3.attn.qkv.weight", the same on every layout
  std::vector<std::int64_t> global_shape;
  /// Its layout, outermost first; dimensions of size 1 are left out, so an
  /// empty list is a tensor every rank holds whole. A tensor-parallel slice
  /// cut again by zero over dp is [{tp, S(0)}, {dp, S(0)}].
  dist::Placements placements;
  /// The box of the global tensor this rank holds (empty: the whole tensor).
  dist::Box box;
  /// The gradient's layout right after backward: the parameter's own
  /// placements, then a partial sum over each mesh dimension it must be
  /// summed over, in order: a dimension of the parameter's own feature
  /// first when its ranks see different positions (sequence parallel),
  /// then the data dimensions (BuildContext derives them from the mesh's
  /// roles). The reducers turn it into the parameter's layout (or a ZeRO
  /// slice's) with dist::Redistributor.
  dist::Placements grad;

  /// The dimensions `grad` is a partial sum over, in order.
  std::vector<std::string> partial_dims() const {
    std::vector<std::string> out;
    for (const auto& p : grad)
      if (p.placement.kind == dist::Placement::Kind::kPartial) out.push_back(p.dim);
    return out;
  }
  bool sharded() const { return !dist::shard_dims(placements).empty(); }
  /// The mesh dimensions that shard it, outermost first.
  std::vector<std::string> split_groups() const { return dist::shard_dims(placements); }
  /// The one tensor dimension its shards cut, -1 when whole.
  int split_dim() const {
    for (const auto& p : placements) {
      if (p.placement.shards()) return p.placement.dim;
    }
    return -1;
  }
  /// Offsets of this rank's box in the global tensor, per dimension.
  std::vector<std::int64_t> offsets() const {
    return box.offsets.empty() ? std::vector<std::int64_t>(global_shape.size(), 0) : box.offsets;
  }
  std::vector<std::int64_t> local_shape() const { return box.lengths.empty() ? global_shape : box.lengths; }
};

}  // namespace hp
