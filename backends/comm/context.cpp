#include "hp/comm/context.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>

#include "backends/comm/detail/pg_handle.h"
#include "backends/comm/detail/shm_collectives.h"
#include "hp/comm/flight_recorder.h"

namespace hp::dist {

struct DistributedContext::StoreHolder {
  c10::intrusive_ptr<c10d::Store> store;
};

bool backend_available(const std::string& backend) {
  if (backend == "gloo") return true;
#ifdef HP_HAVE_CUDA
  if (backend == "nccl") return true;
#endif
  return false;
}

namespace {

bool is_local_address(const std::string& a) {
  return a == "127.0.0.1" || a == "localhost" || a == "::1" || a.rfind("127.", 0) == 0;
}

std::string first_line(const std::string& s) {
  auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

}  // namespace

DistributedContext::~DistributedContext() {
  // Groups hold connections made through the store; drop them first.
  groups_.clear();
  store_.reset();
}

std::shared_ptr<DistributedContext> DistributedContext::create(const DistEnv& env,
                                                               const ProcessMesh& mesh,
                                                               const ContextOptions& options) {
  const std::string who = "rank " + std::to_string(env.rank) + ": ";
  if (mesh.world_size() != env.world_size) {
    throw CommError(who + "the mesh (" + mesh.shape() + ") has " +
                    std::to_string(mesh.world_size()) + " ranks but the job has " +
                    std::to_string(env.world_size));
  }
  if (!backend_available(options.backend)) {
    throw CommError(who + "backend '" + options.backend +
                    "' is not built into this hyperparallel: " +
                    (options.backend == "nccl"
                         ? "NCCL needs a LibTorch with CUDA, and Debian's libtorch-dev is CPU-only"
                         : "unknown backend") +
                    "; use gloo");
  }
  if (options.backend == "nccl") {
    throw CommError(who + "the NCCL process group is not wired in this build; use gloo");
  }

  std::shared_ptr<DistributedContext> ctx(new DistributedContext());
  ctx->env_ = env;
  ctx->mesh_ = mesh;
  ctx->store_ = std::make_unique<StoreHolder>();

  if (env.world_size > 1) {
    try {
      if (options.init_method == "file") {
        ctx->store_->store = c10::make_intrusive<c10d::FileStore>(options.init_file, env.world_size);
      } else {
        c10d::TCPStoreOptions so;
        so.port = static_cast<std::uint16_t>(env.master_port);
        // Under torchrun's static rendezvous its agent serves the store on
        // this port already: every rank is a client, and each restart
        // attempt keeps its keys apart under the prefix PyTorch's workers use.
        so.isServer = env.rank == 0 && !env.agent_store;
        so.numWorkers = env.world_size;
        so.waitWorkers = false;
        so.timeout = options.timeout;
        auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
        if (env.agent_store) {
          ctx->store_->store = c10::make_intrusive<c10d::PrefixStore>(env.store_prefix, tcp);
        } else {
          ctx->store_->store = tcp;
        }
      }
      ctx->store_->store->setTimeout(options.timeout);
    } catch (const std::exception& e) {
      throw CommError(who + "rendezvous at " +
                      (options.init_method == "file"
                           ? "file " + options.init_file
                           : env.master_addr + ":" + std::to_string(env.master_port) +
                                 (env.agent_store ? " (torchrun agent's store, as a client)"
                                  : env.rank == 0 ? " (served by rank 0)"
                                                  : " (as a client)")) +
                      " failed: " + first_line(e.what()));
    }
  }

  if (options.flight_entries > 0) ctx->recorder_ = std::make_shared<flight::Recorder>(env.rank, options.flight_entries);

  std::string host = options.gloo_hostname;
  if (host.empty()) host = is_local_address(env.master_addr) ? "127.0.0.1" : "";

  ctx->self_ = std::make_unique<Group>("self", std::vector<int>{env.rank}, env.rank, nullptr, options.timeout);
  for (const auto& name : mesh.group_names()) {
    const auto all = mesh.all_groups(name);
    for (std::size_t gi = 0; gi < all.size(); ++gi) {
      const auto& members = all[gi];
      auto it = std::find(members.begin(), members.end(), env.rank);
      if (it == members.end()) continue;
      std::shared_ptr<PgHandle> handle;
      if (members.size() > 1) {
        try {
          auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
              "hp/" + name + "/" + std::to_string(gi), ctx->store_->store);
          auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
          opts->devices.push_back(host.empty()
                                      ? c10d::ProcessGroupGloo::createDefaultDevice()
                                      : c10d::ProcessGroupGloo::createDeviceForHostname(host));
          opts->threads = 1;
          handle = std::make_shared<PgHandle>();
          handle->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
              prefixed, static_cast<int>(it - members.begin()), static_cast<int>(members.size()),
              opts);
          if (options.shm_collectives) {
            std::string why_not;
            handle->shm = ShmCollectives::create(prefixed, static_cast<int>(it - members.begin()),
                                               static_cast<int>(members.size()), options.timeout, &why_not);
            if (handle->shm) {
              ctx->shm_groups_.push_back(name);
            } else {
              ctx->shm_fallbacks_.push_back(name + ": " + why_not);
            }
          }
        } catch (const std::exception& e) {
          std::string m;
          for (std::size_t i = 0; i < members.size(); ++i) m += (i ? "," : "") + std::to_string(members[i]);
          throw CommError(who + "creating group '" + name + "' (global ranks [" + m +
                          "]) failed: " + first_line(e.what()));
        }
      }
      ctx->groups_[name] = std::make_unique<Group>(name, members, env.rank, handle, options.timeout);
      if (ctx->recorder_ && members.size() > 1) {
        ctx->groups_[name]->set_recorder(ctx->recorder_);
        ctx->recorder_->add_group(name, members);
      }
    }
  }
  return ctx;
}

std::shared_ptr<DistributedContext> DistributedContext::single() {
  DistEnv env;
  env.rank = 0;
  env.world_size = 1;
  return create(env, ProcessMesh(), ContextOptions());
}

std::shared_ptr<DistributedContext> DistributedContext::planning(const ProcessMesh& mesh, int rank) {
  std::shared_ptr<DistributedContext> ctx(new DistributedContext());
  ctx->env_.rank = rank;
  ctx->env_.world_size = mesh.world_size();
  ctx->mesh_ = mesh;
  ctx->store_ = std::make_unique<StoreHolder>();
  const auto timeout = ContextOptions().timeout;
  ctx->self_ = std::make_unique<Group>("self", std::vector<int>{rank}, rank, nullptr, timeout);
  for (const auto& name : mesh.group_names()) {
    for (const auto& members : mesh.all_groups(name)) {
      if (std::find(members.begin(), members.end(), rank) == members.end()) continue;
      // A handle without a process group: the group knows its members and
      // refuses to communicate (Group::launch).
      auto handle = members.size() > 1 ? std::make_shared<PgHandle>() : nullptr;
      ctx->groups_[name] = std::make_unique<Group>(name, members, rank, handle, timeout);
    }
  }
  return ctx;
}

Group& DistributedContext::group(MeshRole role) {
  if (role == MeshRole::kPartition) {
    const auto dim = mesh_.partition_dim();
    return dim.empty() ? *self_ : group(dim);
  }
  if (role == MeshRole::kReplicate) {
    // Every base replicate dimension (the data dimension and any a feature
    // claims): the one larger than 1, or the mesh's flat group joining them.
    const auto dims = mesh_.replicate_dims();
    const std::string name = mesh_.flat_over(dims);
    if (!name.empty()) return group(name);
    for (const auto& d : dims) {
      if (mesh_.group_size(d) > 1) {
        throw std::logic_error("internal error: no group joins the replicate dimensions of mesh " + mesh_.shape() +
                               ", please report");
      }
    }
    return group(ProcessMesh::data_dim());
  }
  throw std::logic_error(std::string("internal error: the ") + to_string(role) +
                         " role has several groups (ProcessMesh::dims_with), please report");
}

Group& DistributedContext::group(const std::string& name) {
  auto it = groups_.find(name);
  if (it == groups_.end()) {
    std::string have;
    for (const auto& [n, g] : groups_) have += (have.empty() ? "" : ", ") + n;
    throw std::logic_error("no mesh group named '" + name + "' on rank " + std::to_string(env_.rank) + " (mesh " +
                           mesh_.shape() + " has " + have +
                           "): the feature that claims that dimension is not enabled, or it is misspelt");
  }
  return *it->second;
}

}  // namespace hp::dist
