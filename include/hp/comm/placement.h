#pragma once
// A tensor's layout over the mesh: one placement per mesh dimension, as
// DTensor has them (shard along a tensor dimension, replicate, partial sum),
// plus head-tail, a sharding whose two chunks are not contiguous (context
// parallel's load balance: of 2n chunks along the dimension, member r holds
// r and 2n - 1 - r). Dimensions a layout does not name are replicated.
//
// Placements are applied outermost first: each shard cuts what the ones
// before it left, by split_range (even, or the first `size % parts` pieces
// one longer), so a tensor-parallel slice cut again by zero over dp is
// [{tp, S(0)}, {dp, S(0)}]. cut() and place() are the one implementation of
// "this member's part of a global tensor" and its inverse: parameter
// initialisation, zero, both checkpoint IOs and hp-ckpt use them.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hp/comm/slice.h"

namespace hp::dist {

class ProcessMesh;

struct Placement {
  enum class Kind : std::uint8_t { kReplicate, kShard, kHeadTail, kPartial };
  Kind kind = Kind::kReplicate;
  int dim = -1;  ///< the tensor dimension a shard or head-tail cuts

  static Placement replicate() { return {}; }
  static Placement shard(int d) { return {Kind::kShard, d}; }
  static Placement head_tail(int d) { return {Kind::kHeadTail, d}; }
  static Placement partial() { return {Kind::kPartial, -1}; }
  bool shards() const { return kind == Kind::kShard || kind == Kind::kHeadTail; }
  bool operator==(const Placement& o) const { return kind == o.kind && dim == o.dim; }
  bool operator!=(const Placement& o) const { return !(*this == o); }

  /// "R", "S(0)", "HT(1)", "P".
  std::string str() const;
  /// The inverse of str(); false for anything else.
  static bool parse(const std::string& text, Placement& out);
};

/// The placement of a tensor over one named mesh dimension.
struct DimPlacement {
  std::string dim;
  Placement placement;
  bool operator==(const DimPlacement& o) const { return dim == o.dim && placement == o.placement; }
  bool operator!=(const DimPlacement& o) const { return !(*this == o); }
};

/// Outermost first.
using Placements = std::vector<DimPlacement>;

/// "tp:S(0) dp:S(0)"; "replicated" when empty.
std::string describe(const Placements& placements);
/// The mesh dimensions the placements shard over (shard or head-tail), in order.
std::vector<std::string> shard_dims(const Placements& placements);

/// A member's position along one placement's mesh dimension.
struct MeshCoord {
  int size = 1;
  int index = 0;
};

/// The position of `rank` along each placement's dimension of `mesh`.
std::vector<MeshCoord> coords_of(const ProcessMesh& mesh, const Placements& placements, int rank);

/// What the member at `coords` (one per placement) holds of a tensor of
/// `shape`: boxes of the global tensor, concatenated along `cat_dim` in the
/// local tensor (one box and cat_dim -1 unless a head-tail placement cut it).
/// Throws std::invalid_argument for a placement on a tensor dimension the
/// shape does not have or head-tail on two tensor dimensions.
struct Part {
  std::vector<Box> boxes;
  int cat_dim = -1;
  bool partial = false;       ///< a partial placement: members' values add up to the tensor
  bool partial_zero = false;  ///< a partial placement at index > 0: the member holds zeros
  std::vector<std::int64_t> local_shape() const;
};
Part part_of(const std::vector<std::int64_t>& shape, const Placements& placements,
             const std::vector<MeshCoord>& coords);

/// The member's local tensor cut out of `full` (a new tensor). A partial
/// placement gives index 0 the value and the others zeros.
at::Tensor cut(const at::Tensor& full, const Part& part);
/// Writes a member's local tensor into `full` (partial: adds it, so `full`
/// must start at zero).
void place(at::Tensor& full, const at::Tensor& local, const Part& part);

}  // namespace hp::dist
