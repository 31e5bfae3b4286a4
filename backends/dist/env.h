#pragma once
// Where this process sits in the job, read from the environment the launcher
// left: torchrun's names (also set by hp-launch), Open MPI's, or Slurm's.
#include <functional>
#include <string>

namespace hp::dist {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// "torchrun", "openmpi", "slurm" or "single" (nothing set: one process).
  std::string source = "single";
  /// Where master_addr and master_port came from, e.g. "address from first
  /// host of SLURM_STEP_NODELIST, port from 15000 + SLURM_JOB_ID mod 10000".
  std::string master_from;
  /// Intra-op threads the launcher granted this worker (0: not set).
  int threads = 0;
};

using GetEnv = std::function<const char*(const char*)>;

/// Reads the environment. Throws std::runtime_error naming the variable, its
/// value and the rule when something is inconsistent (RANK without
/// WORLD_SIZE, rank >= world size, a non-number...).
DistEnv read_dist_env(const GetEnv& getenv_fn = nullptr);

}  // namespace hp::dist
