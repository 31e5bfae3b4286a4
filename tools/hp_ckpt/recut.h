#pragma once
// How hp-ckpt cuts a checkpoint's tensors for a target layout: by the
// placements recorded in the manifest, at each target rank's coordinates,
// with the trainer's own function (dist::part_of). Whole tensors stay whole.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hp/comm/mesh.h"
#include "hp/checkpoint/manifest.h"

namespace hp::ckpt_tool {

/// One box of a tensor in the target layout.
struct Piece {
  std::string name;
  const ckpt::TensorRecord* record = nullptr;
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> lengths;
  std::uint64_t bytes = 0;
};

/// The target mesh: `source`'s mesh (every dimension its run registered)
/// at `sizes`; UsageError when a dimension is unknown, a size is below 1 or
/// the sizes do not fit (ep must divide dp).
dist::ProcessMesh target_mesh(const std::map<std::string, int>& sizes, const ckpt::Manifest& source);

/// Refuses (CheckpointError naming the tensor, its size, the groups and
/// their product) a tensor with fewer elements along a dimension than the
/// target cuts it into, or one placed over a group the mesh does not have.
/// Uneven cuts are allowed: they are the trainer's (dist::part_of).
void check_cut(const std::string& name, const ckpt::TensorRecord& tensor, const dist::ProcessMesh& mesh);

/// The piece of `tensor` that `rank` of `mesh` holds: its placements cut at
/// the rank's coordinates (dist::part_of, the trainer's own rule).
Piece piece_of(const std::string& name, const ckpt::TensorRecord& tensor, const dist::ProcessMesh& mesh, int rank);

/// "rank 5: tp=1 dp=1 pp=0 ep=1 edp=0" (its index in each group)
std::string describe_rank(const dist::ProcessMesh& mesh, int rank);

}  // namespace hp::ckpt_tool
