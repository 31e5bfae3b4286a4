#pragma once
// Saves and restores a training run through checkpoint/: model parameters
// and optimizer state by global name (gathered into full tensors, written by
// the first data-parallel and tensor-parallel rank of every pipeline stage),
// plus state.json (step, RNG, data position, schedule, counters). Loading
// reads each rank's own slice, so a checkpoint written under one layout loads
// under any other.
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "framework/model/build_context.h"

namespace hp {

class Config;
namespace dist {
class DistributedContext;
}

struct SavedState {
  std::int64_t step = 0;
  std::string rng_hex;        ///< CPU generator state
  std::int64_t optimizer_steps = 0;
  double tokens_total = 0, samples_total = 0;
};

class CheckpointAdapter {
 public:
  CheckpointAdapter(const Config& config, dist::DistributedContext* dist);

  const std::string& root() const { return root_; }
  /// The step directory to resume from per `checkpoint.resume`, or "".
  std::string resume_dir() const;

  /// Collective over the world: every rank calls it. Returns seconds spent.
  double save(std::int64_t step, const std::vector<ParamEntry>& params,
              const std::vector<ParamEntry>& optimizer_state, const SavedState& state);
  /// Loads this rank's slices into `params` and `optimizer_state` (copied in
  /// place) and returns the saved state. Errors name the file and tensor.
  SavedState load(const std::string& step_dir, const std::vector<ParamEntry>& params,
                  const std::vector<ParamEntry>& optimizer_state);

 private:
  const Config& config_;
  dist::DistributedContext* dist_;
  std::string root_;
  int keep_;
};

/// Gathers a (possibly split) parameter-shaped tensor into its full global
/// tensor. Collective over the entry's split group; returns `t` itself when
/// the entry is whole.
at::Tensor gather_full(dist::DistributedContext* dist, const ShardSpec& spec, const at::Tensor& t);

/// CPU generator state as hex text, and back.
std::string rng_state_hex();
void set_rng_state_hex(const std::string& hex);

}  // namespace hp
