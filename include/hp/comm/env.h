#pragma once
// Where this process sits in the job, read from the environment the launcher
// left: hp-launch's and torchrun's names (RANK, WORLD_SIZE, ...; also the
// plain form a Kubernetes PyTorchJob sets), Open MPI's, or Slurm's.
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
  /// Who set the variables: "hp-launch" (HP_LAUNCHED), "torchrun"
  /// (TORCHELASTIC_RUN_ID), "env" (RANK/WORLD_SIZE with neither mark, e.g. a
  /// PyTorchJob), "openmpi", "slurm", or "single" (nothing set: one process).
  std::string source = "single";
  /// torchrun's static rendezvous (TORCHELASTIC_USE_AGENT_STORE=True): the
  /// agent already serves the store at master_addr:master_port; every rank
  /// connects to it as a client and keeps its keys under store_prefix.
  bool agent_store = false;
  /// TORCHELASTIC_RESTART_COUNT: how many times torchrun restarted the workers.
  int restart_count = 0;
  /// "/worker/attempt_<restart_count>" with the agent's store (the prefix
  /// PyTorch's own workers use, so attempts never read each other's keys).
  std::string store_prefix;
  /// Where master_addr and master_port came from, e.g. "address from first
  /// host of SLURM_STEP_NODELIST, port from 15000 + SLURM_JOB_ID mod 10000".
  std::string master_from;
  /// Intra-op threads the launcher granted this worker (HP_INTRA_OP_THREADS; 0: not set).
  int threads = 0;
  /// OMP_NUM_THREADS (its first number; 0: not set).
  int omp_threads = 0;
};

using GetEnv = std::function<const char*(const char*)>;

/// Reads the environment. Throws std::runtime_error (one line naming the
/// variable, its value, the rule and the fix) when something is inconsistent
/// (RANK without WORLD_SIZE, rank >= world size, a non-number, RANK and
/// OMPI_COMM_WORLD_RANK disagreeing...).
DistEnv read_dist_env(const GetEnv& getenv_fn = nullptr);

/// One line for the log: who launched this process and where its store is.
std::string describe_launch(const DistEnv& env);

struct IntraOpThreads {
  int threads = 1;
  std::string why;  ///< e.g. "OMP_NUM_THREADS=1" or "2 cores / 1 local ranks"
};

/// The intra-op threads of this worker: HP_INTRA_OP_THREADS (hp-launch's
/// share), else OMP_NUM_THREADS, else `cores` divided by the local ranks (at
/// least 1).
IntraOpThreads choose_intra_op_threads(const DistEnv& env, int cores);

/// The cores this process may run on (its CPU affinity), at least 1.
int usable_cores();

}  // namespace hp::dist
