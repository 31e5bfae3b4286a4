#include "backends/dist/env.h"

#include <cstdlib>
#include <stdexcept>

namespace hp::dist {

namespace {

int parse_int(const char* name, const char* value) {
  char* end = nullptr;
  long v = std::strtol(value, &end, 10);
  if (!*value || *end != '\0' || v < 0 || v > 1 << 24) {
    throw std::runtime_error(std::string("environment variable ") + name + "='" + value +
                             "' is not a non-negative integer");
  }
  return static_cast<int>(v);
}

/// Slurm's "2(x3),1" task lists: the first number is this node's count on
/// homogeneous jobs, which is the only kind we support for local sizes.
int first_number(const char* name, const char* value) {
  std::string s(value);
  auto end = s.find_first_not_of("0123456789");
  return parse_int(name, s.substr(0, end).c_str());
}

}  // namespace

DistEnv read_dist_env(const GetEnv& getenv_fn) {
  GetEnv get = getenv_fn ? getenv_fn : GetEnv([](const char* n) { return std::getenv(n); });
  DistEnv env;
  auto need = [&](const char* name, const char* because) -> int {
    const char* v = get(name);
    if (!v) {
      throw std::runtime_error(std::string("environment variable ") + name + " is not set, but " +
                               because + " is; set both (hp-launch and torchrun set them all)");
    }
    return parse_int(name, v);
  };
  auto opt = [&](const char* name, int def) -> int {
    const char* v = get(name);
    return v ? parse_int(name, v) : def;
  };

  if (get("RANK") || get("WORLD_SIZE")) {
    env.source = "torchrun";
    env.rank = get("RANK") ? parse_int("RANK", get("RANK")) : need("RANK", "WORLD_SIZE");
    env.world_size = need("WORLD_SIZE", "RANK");
    env.local_rank = opt("LOCAL_RANK", env.rank);
    env.local_world_size = opt("LOCAL_WORLD_SIZE", env.world_size);
  } else if (get("OMPI_COMM_WORLD_RANK")) {
    env.source = "openmpi";
    env.rank = parse_int("OMPI_COMM_WORLD_RANK", get("OMPI_COMM_WORLD_RANK"));
    env.world_size = need("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK");
    env.local_rank = opt("OMPI_COMM_WORLD_LOCAL_RANK", env.rank);
    env.local_world_size = opt("OMPI_COMM_WORLD_LOCAL_SIZE", env.world_size);
  } else if (get("SLURM_PROCID")) {
    env.source = "slurm";
    env.rank = parse_int("SLURM_PROCID", get("SLURM_PROCID"));
    env.world_size = need("SLURM_NTASKS", "SLURM_PROCID");
    env.local_rank = opt("SLURM_LOCALID", env.rank);
    if (const char* t = get("SLURM_NTASKS_PER_NODE")) {
      env.local_world_size = first_number("SLURM_NTASKS_PER_NODE", t);
    } else if (const char* t2 = get("SLURM_STEP_TASKS_PER_NODE")) {
      env.local_world_size = first_number("SLURM_STEP_TASKS_PER_NODE", t2);
    } else {
      env.local_world_size = env.world_size;
    }
    if (!get("MASTER_ADDR") && get("SLURM_LAUNCH_NODE_IPADDR")) {
      env.master_addr = get("SLURM_LAUNCH_NODE_IPADDR");
    }
  }
  if (const char* a = get("MASTER_ADDR")) env.master_addr = a;
  env.master_port = opt("MASTER_PORT", env.master_port);
  env.threads = opt("HP_INTRA_OP_THREADS", 0);

  if (env.world_size < 1) {
    throw std::runtime_error("world size is " + std::to_string(env.world_size) +
                             " (from " + env.source + " variables); it must be >= 1");
  }
  if (env.rank >= env.world_size) {
    throw std::runtime_error("rank " + std::to_string(env.rank) + " is not below the world size " +
                             std::to_string(env.world_size) + " (from " + env.source +
                             " variables)");
  }
  if (env.local_world_size < 1 || env.local_rank >= env.local_world_size) {
    throw std::runtime_error("local rank " + std::to_string(env.local_rank) +
                             " is not below the local world size " +
                             std::to_string(env.local_world_size));
  }
  if (env.master_port < 1 || env.master_port > 65535) {
    throw std::runtime_error("MASTER_PORT=" + std::to_string(env.master_port) +
                             " is not a TCP port (1..65535)");
  }
  return env;
}

}  // namespace hp::dist
