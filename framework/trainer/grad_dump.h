#pragma once
// Gradient dumps for parity checks (`training.dump_grads_at_step`): every
// rank writes the gradient slices it holds, as they are after the reduction
// and before clipping, with no communication:
//
//   <run.output_dir>/grads_step<N>/grads-rank<RRRRR>.safetensors
//
// one tensor per gradient, named by its global name and shaped as this
// rank's slice. The file's "__metadata__" says where each slice belongs:
//
//   "format":     "hyperparallel gradient dump 1"
//   "step", "rank", "world_size", "mesh" ("pp=1 dp=2 tp=2 ep=1")
//   "placement":  JSON {"<name>": {"global_shape": [..], "offsets": [..],
//                  "shape": [..], "placements": "tp:S(0) dp:S(0)" ("replicated"
//                  when whole), "replicas": [ranks]}, ...}
//
// "replicas" is the sorted list of global ranks that hold the identical
// slice (same pipeline stage, same index in every split group of the
// ShardSpec): the data-parallel replicas of a parameter, the tp ranks of a
// parameter tp does not split (a layernorm), the edp ranks of an expert.
// hp-compare assembles the slices into full tensors, checks that they tile
// the global shape and that the copies of a replicate group are bitwise
// equal, and compares with a reference dump of the same format.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hp/model/build_context.h"

namespace hp {

namespace dist {
class ProcessMesh;
}

/// The sorted global ranks of `mesh` holding the same slice as `rank` does
/// for a tensor described by `spec` (its split groups must be mesh groups).
std::vector<int> replicate_group(const dist::ProcessMesh& mesh, int rank, const ShardSpec& spec);

/// Writes this rank's tensor dump (framework/model/tensor_dump.h) of `step`:
/// `<dir>/<kind>-rank<RRRRR>.safetensors` with the records by key and, in
/// "__metadata__", the step, rank, world size, mesh and this rank's
/// coordinates ("tag"), and the kernels that computed them ("kernels").
/// Returns its path.
std::string write_tensor_dump(const std::string& dir, const std::string& kind, std::int64_t step,
                              const std::vector<std::pair<std::string, at::Tensor>>& records,
                              const dist::ProcessMesh& mesh, int rank, const std::string& kernels);

/// Writes this rank's file of the dump of `step` under `dir` (created when
/// missing) and returns its path. Throws std::runtime_error naming the file
/// when it cannot be written.
std::string write_grad_dump(const std::string& dir, std::int64_t step,
                            const std::vector<ParamEntry>& grads, const dist::ProcessMesh& mesh,
                            int rank);

}  // namespace hp
