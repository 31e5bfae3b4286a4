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

/// The first host of a Slurm host list: "gpu[07-09,12]-ib,cpu1" -> "gpu07-ib".
/// Each bracket of the first name gives the first number of its first range,
/// zero padding kept. Empty when the list is malformed.
std::string first_slurm_host(const std::string& list) {
  std::string host;
  for (std::size_t i = 0; i < list.size() && list[i] != ','; ++i) {
    if (list[i] != '[') {
      if (list[i] == ']') return "";
      host += list[i];
      continue;
    }
    const std::size_t close = list.find(']', i);
    if (close == std::string::npos) return "";
    const std::string first = list.substr(i + 1, list.find_first_of("-,]", i + 1) - i - 1);
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos) return "";
    host += first;
    i = close;
  }
  return host;
}

/// Where rank 0 listens when MASTER_ADDR / MASTER_PORT are not set: task 0
/// runs on the first node of the step, and the port is 15000 + the job id
/// mod 10000 (the job's last four digits; below Linux's ephemeral ports), so
/// two jobs sharing a node do not collide. Says where each came from.
void slurm_rendezvous(const GetEnv& get, DistEnv& env, std::string& addr_from,
                      std::string& port_from) {
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (get("MASTER_ADDR")) break;
    const char* list = get(name);
    if (!list) continue;
    env.master_addr = first_slurm_host(list);
    if (env.master_addr.empty()) {
      throw std::runtime_error(std::string("environment variable ") + name + "='" + list +
                               "' is not a Slurm host list (node[01-04],other); set MASTER_ADDR to "
                               "rank 0's host instead");
    }
    addr_from = std::string("first host of ") + name;
    break;
  }
  if (addr_from.empty() && !get("MASTER_ADDR")) {
    if (const char* ip = get("SLURM_LAUNCH_NODE_IPADDR")) {
      env.master_addr = ip;
      addr_from = "SLURM_LAUNCH_NODE_IPADDR";
    }
  }
  const char* id = get("MASTER_PORT") ? nullptr : get("SLURM_JOB_ID");
  if (id) {
    const std::string s(id);
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) {
      throw std::runtime_error("environment variable SLURM_JOB_ID='" + s +
                               "' is not a job number; set MASTER_PORT instead");
    }
    const std::string last4 = s.size() > 4 ? s.substr(s.size() - 4) : s;
    env.master_port = 15000 + std::stoi(last4);
    port_from = "15000 + SLURM_JOB_ID mod 10000";
  }
}

}  // namespace

DistEnv read_dist_env(const GetEnv& getenv_fn) {
  GetEnv get = getenv_fn ? getenv_fn : GetEnv([](const char* n) { return std::getenv(n); });
  DistEnv env;
  std::string addr_from, port_from;
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
    slurm_rendezvous(get, env, addr_from, port_from);
  }
  if (const char* a = get("MASTER_ADDR")) env.master_addr = a;
  env.master_port = opt("MASTER_PORT", env.master_port);
  if (get("MASTER_ADDR")) addr_from = "MASTER_ADDR";
  if (get("MASTER_PORT")) port_from = "MASTER_PORT";
  env.master_from = "address from " + (addr_from.empty() ? "the default" : addr_from) +
                    ", port from " + (port_from.empty() ? "the default" : port_from);
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
