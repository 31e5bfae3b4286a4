// hp-launch: starts the workers of one node, watches them and ends the job when one fails.
//
// Workers get the environment torchrun gives them (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus HP_LAUNCHED=1
// and a share of the cores (OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS,
// HP_INTRA_OP_THREADS), so the same binaries also run under torchrun, srun or mpirun.
// No rendezvous happens here: with several nodes, each node runs its own hp-launch.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace hp::launch {

/// What to start on this node. Zero in `master_port` and `threads_per_worker` means "choose":
/// a free port on 127.0.0.1 for a single node (29500 for several), and the cores this process
/// may use divided by `nproc_per_node`.
struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  int threads_per_worker = 0;
  /// How many of the failed rank's last output lines the failure summary repeats.
  int tail_lines = 20;
  /// Where the workers write their flight records on a failure
  /// (<run.output_dir>/flight); the failure summary lists them. "" also
  /// reads HP_FLIGHT_DIR.
  std::string flight_dir;
  /// When set, each worker is a fork of this process that calls this
  /// function (with the worker's environment in place) and exits with what
  /// it returns, instead of exec'ing `command`: the worker keeps the
  /// libraries this process loaded and initialised already (LibTorch's
  /// start-up, about 0.8 s of CPU per process on Debian's build, which
  /// links some 290 libraries). Only when this process has one thread at
  /// the fork (a fork of a multi-threaded process may only exec) and
  /// HP_LAUNCH_EXEC is not 1; else `command` is exec'd, as hp-launch does.
  /// `command` must run the same thing either way (hp-train --nproc: the
  /// rank's training run).
  std::function<int()> in_process;
};

/// A mistake in the command line or in LaunchOptions. what() names the flag, the value and the
/// rule; hp-launch prints it and exits with kUsageExitCode.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr int kUsageExitCode = 2;

struct ParsedArgs {
  LaunchOptions options;
  /// Everything after "--": the program and its arguments, run once per local worker.
  std::vector<std::string> command;
  /// --help was given; nothing else is filled in. Print usage() and exit 0.
  bool help = false;
};

/// Parses `hp-launch [flags] -- CMD ARGS...`. Throws UsageError.
ParsedArgs parse_args(int argc, const char* const* argv);

/// The --help text.
std::string usage();

/// Throws UsageError unless the options describe a possible job.
void validate(const LaunchOptions& options);

/// Starts the workers, relays their output line by line as "[rank R] ...", and returns once all
/// have ended: 0 if every worker exited 0; the first failed worker's exit code (128 + signal
/// if it died on a signal) after stopping the others; 128 + signal if SIGINT or SIGTERM
/// reached this process. A failed worker's other ranks get SIGTERM to their process groups,
/// then SIGKILL after a 5 s grace.
///
/// Throws UsageError if validate() would or `command` is empty. While it runs it owns the handlers
/// of SIGINT, SIGTERM and SIGCHLD (restoring the previous ones before returning), so only one run()
/// may be active per process. Workers are killed if the thread that called run() dies
/// (PR_SET_PDEATHSIG), so call it from a thread that outlives the job.
int run(const LaunchOptions& options, const std::vector<std::string>& command);

/// parse_args + run, with hp-launch's exit codes: what hp-launch's main() does.
int run_cli(int argc, const char* const* argv);

}  // namespace hp::launch
