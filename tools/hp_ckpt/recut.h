#pragma once
// How hp-ckpt cuts a checkpoint's tensors for a target layout: a tensor
// split over groups g1, g2, ... (outermost first) along dim d becomes
// size(g1) * size(g2) * ... equal ranges along d, and a rank holds the range
// its coordinates in those groups index (inner groups vary fastest), the
// order the trainer gathers them in. Whole tensors stay whole.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backends/dist/mesh.h"
#include "checkpoint/manifest.h"

namespace hp::ckpt_tool {

/// One box of a tensor in the target layout.
struct Piece {
  std::string name;
  const ckpt::TensorRecord* record = nullptr;
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> lengths;
  std::uint64_t bytes = 0;
};

/// The target mesh; UsageError when a size is below 1 or the expert-parallel
/// size does not divide the data-parallel one.
dist::ProcessMesh target_mesh(const std::map<std::string, int>& sizes);

/// How many pieces `tensor` is cut into on `mesh`. CheckpointError naming
/// the tensor, its size, the groups and their product when they do not
/// divide it, or naming a group the mesh does not have.
std::int64_t piece_count(const std::string& name, const ckpt::TensorRecord& tensor,
                         const dist::ProcessMesh& mesh);

/// Piece `index` (0 <= index < piece_count) of `tensor`.
Piece piece(const std::string& name, const ckpt::TensorRecord& tensor,
            const dist::ProcessMesh& mesh, std::int64_t index);

/// Which piece `rank` of `mesh` holds.
std::int64_t piece_index(const ckpt::TensorRecord& tensor, const dist::ProcessMesh& mesh, int rank);

/// "rank 5: tp=1 dp=1 pp=0 ep=1 edp=0" (its index in each group)
std::string describe_rank(const dist::ProcessMesh& mesh, int rank);

}  // namespace hp::ckpt_tool
