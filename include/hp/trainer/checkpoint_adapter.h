#pragma once
// The checkpoint IO collaborator. A run saves and restores model
// parameters and optimizer state by global name, plus the run state
// (step, RNG, data position, schedule, counters), through one CheckpointIO.
// The built-in one gathers every split tensor into its full value and has
// the leader of each partition (pipeline stage) write it; a feature
// (sharded checkpoints) may install its own. Loading reads each rank's own
// slice by its ShardSpec, so a checkpoint written under one layout loads
// under any other.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hp/model/build_context.h"

namespace hp {

class Config;
namespace dist {
class DistributedContext;
}

struct CheckpointOptions {
  std::string root;  ///< checkpoint.dir, or <run.output_dir>/checkpoints
  std::int64_t interval = 0;
  std::string resume = "auto";
  int keep = 0;
  /// checkpoint.strict: every checkpoint tensor must be one the run has,
  /// and every one the run has must be in the checkpoint (as
  /// load_state_dict(strict=True)); false loads what matches and lists the rest.
  bool strict = true;
  static CheckpointOptions from(const Config& c);
  /// The step directory to resume from per `resume`, or "".
  std::string resume_dir() const;
};

struct SavedState {
  std::int64_t step = 0;
  std::string rng_hex;  ///< CPU generator state; "" when the checkpoint has none (imported weights)
  std::int64_t optimizer_steps = 0;
  double tokens_total = 0, samples_total = 0;
  /// The resolved config the checkpoint stores ("" when it stores none).
  std::string config_text;
  /// The precision the run trained in (the model's PrecisionPolicy, by
  /// dtype name: "fp32", "bf16"); "" when the checkpoint does not record it
  /// (written before precisions were recorded, or imported). The tensors
  /// are fp32 masters either way.
  std::string param_dtype, reduce_dtype;
  /// The optimizer's parameter groups as the run resolved them
  /// (GroupPolicy::describe()); "" when not recorded.
  std::string optimizer_groups;
};

class CheckpointIO {
 public:
  virtual ~CheckpointIO() = default;
  /// Collective over the world: every rank calls it.
  virtual void save(std::int64_t step, const std::vector<ParamEntry>& params,
                    const std::vector<ParamEntry>& optimizer_state, const SavedState& state) = 0;
  /// Loads this rank's slices into `params` and `optimizer_state` (copied in
  /// place) and returns the saved state. Errors name the file and tensor.
  virtual SavedState load(const std::string& step_dir, const std::vector<ParamEntry>& params,
                          const std::vector<ParamEntry>& optimizer_state) = 0;
  /// Waits until a save still in progress (one written in the background)
  /// is committed, and throws its failure. The trainer calls it at the end
  /// of a run; an IO that saves synchronously has nothing to wait for.
  virtual void flush() {}
};

/// Gathered tensors written by each partition's leader rank.
std::unique_ptr<CheckpointIO> make_gathered_checkpoint_io(const CheckpointOptions& options,
                                                          const Config& config,
                                                          dist::DistributedContext& dist);

/// Gathers a (possibly split) tensor into its full global tensor: over each
/// of the spec's split groups, innermost first. Collective over those
/// groups; returns `t` itself when the entry is whole.
at::Tensor gather_full(dist::DistributedContext& dist, const ShardSpec& spec, const at::Tensor& t);

// The parts every checkpoint IO shares, so all write the same run state the
// same way and all read through the same any-to-any path.

/// What rank 0 runs to commit `step` (CheckpointWriter::commit): state.json
/// (step, this and every rank's RNG, data position, scheduler and metrics
/// counters), the mesh layout, the resolved config (config.yaml), `keep`,
/// and `writers`, the ranks whose parts must be there. Collective over the
/// world (the ranks exchange their RNG states); the function holds copies of
/// all it needs, so it may run later, on another thread.
std::function<void()> step_commit(dist::DistributedContext& dist, const CheckpointOptions& options,
                                  std::int64_t step, const SavedState& state,
                                  const Config& config, std::vector<int> writers);
/// The first part of a save: rank 0 prepares the staging directory of
/// `step` under `root` (CheckpointWriter::prepare), then a world barrier.
void begin_save(dist::DistributedContext& dist, const std::string& root, std::int64_t step);
/// The save sequence, collective over the world: begin_save; `write` (this
/// rank's part, CheckpointWriter::write_rank, or nothing); barrier; rank 0
/// runs `commit` (step_commit's); barrier. A save written in the background
/// calls begin_save and runs the write and the commit on its own thread.
void save_step(dist::DistributedContext& dist, const std::string& root, std::int64_t step,
               const std::function<void()>& write, const std::function<void()>& commit);

/// Reads this rank's slice of every entry by its ShardSpec from `step_dir`
/// (whatever layout wrote it: each read takes only the byte ranges it
/// needs) and returns the run state. Collective over the world (the ranks
/// exchange their tensor names, so every rank judges the whole model).
/// `strict`: a checkpoint tensor the run does not have (model or optimizer)
/// is refused naming it, and so is a run tensor the checkpoint lacks;
/// otherwise those are skipped (left at their initial values) and rank 0
/// logs them in one line. A shape or dtype mismatch is refused either way.
/// A checkpoint without any optimizer tensor (imported weights, `hp-ckpt
/// import`) leaves the optimizer state as it is.
SavedState load_checkpoint(const std::string& step_dir, const std::vector<ParamEntry>& params,
                           const std::vector<ParamEntry>& optimizer_state,
                           dist::DistributedContext& dist, bool strict = true);

/// CPU generator state as hex text, and back.
std::string rng_state_hex();
void set_rng_state_hex(const std::string& hex);

}  // namespace hp
