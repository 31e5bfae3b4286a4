#pragma once
// The distributed context: this process's place in the job, the store every
// rank met at, and one Group per mesh group kind (world, every dimension,
// every view's dimensions, every flat group), all created at creation in the
// mesh's group order, the same on every rank. A group of one rank has no process group and costs
// nothing.
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/comm/env.h"
#include "hp/comm/group.h"
#include "hp/comm/mesh.h"

namespace hp::dist {

struct ContextOptions {
  /// "gloo" or "nccl" ("auto" is resolved by the caller).
  std::string backend = "gloo";
  /// "env": TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 serves it, unless
  /// torchrun's agent does: DistEnv::agent_store);
  /// "file": FileStore at `init_file`.
  std::string init_method = "env";
  std::string init_file;
  /// Address Gloo binds to; empty: 127.0.0.1 when the master is local, else
  /// this host's name.
  std::string gloo_hostname;
  std::chrono::milliseconds timeout{300000};
  /// Operations each rank keeps in its flight recorder (0: no recorder).
  std::size_t flight_entries = 4096;
  /// The collectives of a group whose members share a host (all-reduce,
  /// reduce-scatter, all-gather, all-to-all) go through one shared-memory
  /// segment instead of Gloo's TCP loopback (detail/shm_collectives.h).
  bool shm_collectives = true;

  ContextOptions& with_backend(std::string b) { backend = std::move(b); return *this; }
  ContextOptions& with_file(std::string f) { init_method = "file"; init_file = std::move(f); return *this; }
  ContextOptions& with_timeout(std::chrono::milliseconds t) { timeout = t; return *this; }
};

/// Whether this LibTorch can run `backend` ("gloo" always; "nccl" only with CUDA).
bool backend_available(const std::string& backend);

class DistributedContext {
 public:
  /// Rendezvous with every rank and create all groups of `mesh`. Throws
  /// CommError naming this rank and the cause (unreachable master, timeout,
  /// mesh that does not match the world size, backend not built).
  static std::shared_ptr<DistributedContext> create(const DistEnv& env, const ProcessMesh& mesh,
                                                    const ContextOptions& options);
  /// The context of a job of one process: every group has one member and
  /// every collective is local. Code never checks for "no context".
  static std::shared_ptr<DistributedContext> single();
  /// Rank `rank`'s place in `mesh` without any other process: every group
  /// with its members and this rank's index, none able to communicate (an
  /// operation on a group of several ranks throws CommError). What a
  /// planner builds a rank's model with (on the meta device) to learn its
  /// parameters' local shapes.
  static std::shared_ptr<DistributedContext> planning(const ProcessMesh& mesh, int rank);
  ~DistributedContext();

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  const DistEnv& env() const { return env_; }
  const ProcessMesh& mesh() const { return mesh_; }
  /// Any of mesh().group_names(): "world", a dimension, a view's dimension,
  /// a flat group.
  Group& group(const std::string& name);
  /// The partition group (this rank alone when nothing partitions), or the
  /// data-parallel remainder's group for kReplicate.
  Group& group(MeshRole role);
  const std::map<std::string, std::unique_ptr<Group>>& groups() const { return groups_; }
  /// This rank's flight recorder (null when ContextOptions::flight_entries is 0).
  const std::shared_ptr<flight::Recorder>& recorder() const { return recorder_; }
  /// This rank's groups whose collectives go through shared memory.
  const std::vector<std::string>& shm_groups() const { return shm_groups_; }
  /// This rank's groups left on Gloo although ContextOptions::shm_collectives
  /// asked for shared memory, each "group: why".
  const std::vector<std::string>& shm_fallbacks() const { return shm_fallbacks_; }

 private:
  DistributedContext() = default;
  DistEnv env_;
  ProcessMesh mesh_;
  std::map<std::string, std::unique_ptr<Group>> groups_;
  std::unique_ptr<Group> self_;  ///< this rank alone
  std::shared_ptr<flight::Recorder> recorder_;
  struct StoreHolder;
  std::unique_ptr<StoreHolder> store_;
  std::vector<std::string> shm_groups_, shm_fallbacks_;
};

}  // namespace hp::dist
