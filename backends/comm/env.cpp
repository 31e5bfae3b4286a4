#include "hp/comm/env.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
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

/// OMP_NUM_THREADS is "N" or OpenMP's nested list "N,M,...": the first level counts.
int omp_threads(const char* value) {
  std::string s(value);
  const std::string first = s.substr(0, s.find(','));
  char* end = nullptr;
  const long v = std::strtol(first.c_str(), &end, 10);
  if (first.empty() || *end != '\0' || v < 1 || v > 1 << 16) {
    throw std::runtime_error(
        std::string("environment variable OMP_NUM_THREADS='") + value +
        "' is not a positive number of threads (OpenMP's form: N or N,M,...); set "
        "it to e.g. 1, or unset it to get the cores divided by the local ranks");
  }
  return static_cast<int>(v);
}

bool parse_bool(const char* name, const char* value) {
  const std::string v(value);
  if (v == "True" || v == "true" || v == "1") return true;
  if (v == "False" || v == "false" || v == "0") return false;
  throw std::runtime_error(
      std::string("environment variable ") + name + "='" + value +
      "' is neither True nor False (torchrun sets True for its static rendezvous, "
      "False for c10d); set one of them or unset it");
}

/// RANK/WORLD_SIZE set by hand (no launcher's mark) next to another
/// launcher's own names: both must tell the same place.
void check_agree(const char* name, int value, const char* other, const char* other_value,
                 const std::string& launcher) {
  const int o = parse_int(other, other_value);
  if (o == value) return;
  throw std::runtime_error(
      std::string(name) + "=" + std::to_string(value) + " and " + other + "=" + other_value +
      " disagree: " + name +
      " without a launcher's mark (HP_LAUNCHED, TORCHELASTIC_RUN_ID) would override " + launcher +
      "'s place for this process; unset " + name +
      " (often left exported in the shell) or make it equal to " + other);
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
  std::string origin = "nothing set";

  if (get("RANK") || get("WORLD_SIZE")) {
    // hp-launch and torchrun mark their workers; RANK without either mark is
    // a plain environment (a Kubernetes PyTorchJob, or set by hand).
    env.source = get("HP_LAUNCHED") ? "hp-launch" : get("TORCHELASTIC_RUN_ID") ? "torchrun" : "env";
    origin = "RANK/WORLD_SIZE" + (env.source == "env" ? std::string() : " from " + env.source);
    env.rank = get("RANK") ? parse_int("RANK", get("RANK")) : need("RANK", "WORLD_SIZE");
    env.world_size = need("WORLD_SIZE", "RANK");
    env.local_rank = opt("LOCAL_RANK", env.rank);
    env.local_world_size = opt("LOCAL_WORLD_SIZE", env.world_size);
    if (env.source == "env") {
      // An inner launcher (hp-launch or torchrun under srun/mpirun) marks its
      // workers, so only a hand-set RANK can contradict the outer launcher.
      if (const char* r = get("OMPI_COMM_WORLD_RANK")) {
        check_agree("RANK", env.rank, "OMPI_COMM_WORLD_RANK", r, "Open MPI");
        if (const char* w = get("OMPI_COMM_WORLD_SIZE")) {
          check_agree("WORLD_SIZE", env.world_size, "OMPI_COMM_WORLD_SIZE", w, "Open MPI");
        }
      } else if (const char* r2 = get("SLURM_PROCID")) {
        check_agree("RANK", env.rank, "SLURM_PROCID", r2, "Slurm");
        if (const char* w = get("SLURM_NTASKS"))
          check_agree("WORLD_SIZE", env.world_size, "SLURM_NTASKS", w, "Slurm");
      }
    }
  } else if (get("OMPI_COMM_WORLD_RANK")) {
    // Open MPI before Slurm: mpirun inside an allocation is the inner launcher
    // (its daemons' SLURM_PROCID numbers nodes, not ranks).
    env.source = "openmpi";
    origin = "OMPI_COMM_WORLD_RANK/SIZE";
    env.rank = parse_int("OMPI_COMM_WORLD_RANK", get("OMPI_COMM_WORLD_RANK"));
    env.world_size = need("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK");
    env.local_rank = opt("OMPI_COMM_WORLD_LOCAL_RANK", env.rank);
    env.local_world_size = opt("OMPI_COMM_WORLD_LOCAL_SIZE", env.world_size);
  } else if (get("SLURM_PROCID")) {
    env.source = "slurm";
    origin = "SLURM_PROCID/SLURM_NTASKS";
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
  if (const char* t = get("OMP_NUM_THREADS")) env.omp_threads = omp_threads(t);

  // torchrun's static rendezvous: its agent serves the store on the master
  // port already and says so; PyTorch's workers then connect as clients and
  // keep each restart attempt's keys apart under /worker/attempt_<n>.
  if (const char* a = get("TORCHELASTIC_USE_AGENT_STORE")) {
    env.agent_store = parse_bool("TORCHELASTIC_USE_AGENT_STORE", a);
  }
  if (env.agent_store) {
    env.restart_count = need("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE=True");
    env.store_prefix = "/worker/attempt_" + std::to_string(env.restart_count);
    if (env.source == "single") {
      throw std::runtime_error(
          "TORCHELASTIC_USE_AGENT_STORE=True is set, but RANK and WORLD_SIZE are not; torchrun "
          "sets them all "
          "for its workers: start hp-train through torchrun, or unset "
          "TORCHELASTIC_USE_AGENT_STORE");
    }
  } else {
    env.restart_count = opt("TORCHELASTIC_RESTART_COUNT", 0);
  }

  if (env.world_size < 1) {
    throw std::runtime_error("world size is " + std::to_string(env.world_size) + " (from " +
                             origin + "); it must be >= 1");
  }
  if (env.rank >= env.world_size) {
    throw std::runtime_error("rank " + std::to_string(env.rank) + " is not below the world size " +
                             std::to_string(env.world_size) + " (from " + origin +
                             "); ranks count from 0 to the world size - 1");
  }
  if (env.local_world_size < 1 || env.local_rank >= env.local_world_size) {
    throw std::runtime_error("local rank " + std::to_string(env.local_rank) +
                             " is not below the local world size " +
                             std::to_string(env.local_world_size) + " (from " + origin + ")");
  }
  if (env.master_port < 1 || env.master_port > 65535) {
    throw std::runtime_error("MASTER_PORT=" + std::to_string(env.master_port) +
                             " is not a TCP port (1..65535)");
  }
  return env;
}

std::string describe_launch(const DistEnv& env) {
  if (env.source == "single") return "one process (no launcher variables)";
  const std::string who = env.source == "openmpi" ? "Open MPI"
                          : env.source == "slurm" ? "Slurm"
                          : env.source == "env"   ? "plain RANK/WORLD_SIZE (no launcher's mark)"
                                                  : env.source;
  std::string s = who + ": rank " + std::to_string(env.rank) + " of " +
                  std::to_string(env.world_size) + ", local " + std::to_string(env.local_rank) +
                  " of " + std::to_string(env.local_world_size);
  const std::string at = env.master_addr + ":" + std::to_string(env.master_port);
  if (env.agent_store) {
    s += ", store: torchrun's agent at " + at + " (client), keys under " + env.store_prefix;
  } else {
    s += ", store: served by rank 0 at " + at;
    if (env.source == "torchrun") s += ", restart " + std::to_string(env.restart_count);
  }
  return s;
}

IntraOpThreads choose_intra_op_threads(const DistEnv& env, int cores) {
  IntraOpThreads t;
  if (env.threads > 0) {
    t.threads = env.threads;
    t.why = "HP_INTRA_OP_THREADS=" + std::to_string(env.threads) +
            (env.source == "hp-launch" ? ", hp-launch's share" : "");
  } else if (env.omp_threads > 0) {
    t.threads = env.omp_threads;
    t.why = "OMP_NUM_THREADS=" + std::to_string(env.omp_threads);
  } else {
    const int local = std::max(1, env.local_world_size);
    cores = std::max(1, cores);
    t.threads = std::max(1, cores / local);
    t.why = std::to_string(cores) + (cores == 1 ? " core / " : " cores / ") +
            std::to_string(local) + (local == 1 ? " local rank" : " local ranks");
  }
  return t;
}

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

}  // namespace hp::dist
