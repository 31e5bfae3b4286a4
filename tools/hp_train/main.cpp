// hp-train: validates a config, then trains on this process (under a
// launcher) or launches N processes of itself (--nproc N).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "hp/comm/env.h"
#include "hp/comm/mesh.h"
#include "hp/fault/fault.h"
#include "hp/config/config.h"
#include "framework/model/packed_gemm.h"
#include "framework/plan/plan.h"
#include "framework/runtime/setup.h"
#include "framework/trainer/param_groups_report.h"
#include "framework/trainer/trainer.h"
#include "tools/exit_now.h"
#include "tools/self_exe.h"
#include "tools/hp_launch/launcher.h"

namespace {

/// Local processes `--nproc` starts at most (one machine's worth and more).
constexpr int kMaxLocalProcesses = 4096;


void print_features(const hp::Setup& s) {
  std::cout << "features:";
  if (s.features.empty()) std::cout << " (none enabled)";
  std::cout << "\n";
  for (const auto& f : s.features) std::cout << "  " << f.name << " <- " << f.path << "\n";
}

/// This process's rank's training run (under a launcher, or the one process).
int train(const std::string& config_file, const std::vector<std::string>& overrides) {
  int rank = 0;
  try {
    rank = hp::dist::read_dist_env().rank;
    hp::Trainer trainer = hp::Trainer::from_file(config_file, overrides);
    trainer.fit();  // writes run.report's page itself
    return 0;
  } catch (const hp::ConfigException& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return hp::kConfigErrorExitCode;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-train: rank %d failed: %s\n", rank, e.what());
    return 1;
  }
}

int run(int argc, char** argv) {
  CLI::App app{"hp-train: train a model with hyperparallel"};
  std::string config_file;
  int nproc = 0, threads_per_worker = 0;
  std::vector<std::string> overrides;
  bool dry_run = false, print_config = false, options_markdown = false, fault_points = false;
  app.add_option("config", config_file, "YAML config file");
  bool all_ranks = false;
  app.add_option("--nproc", nproc,
                 "Launch this many local processes (through hp-launch; at most " +
                     std::to_string(kMaxLocalProcesses) + "); with --dry-run, any world size to check")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads-per-worker", threads_per_worker,
                 "With --nproc: intra-op threads of each process (default: the usable cores split among them)")
      ->check(CLI::PositiveNumber);
  app.add_option("--set", overrides, "Override a key: --set training.max_steps=10 (repeatable)");
  app.add_flag("--dry-run", dry_run,
               "Validate, load plugins, print the resolved config and the mesh, and exit");
  app.add_flag("--all-ranks", all_ranks,
               "With --dry-run: one line per rank (coordinates and groups) at any world size (default: up to " +
                   std::to_string(hp::dist::ProcessMesh::kRankLines) + " ranks)");
  app.add_flag("--print-config", print_config, "Print the resolved config and exit");
  app.add_flag("--options-markdown", options_markdown,
               "Print the option table (core + features named in the config) as Markdown");
  app.add_flag(
      "--fault-points", fault_points,
      "Print the fault points HP_FAULT_INJECT may name (for tests), with their actions, and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : hp::kConfigErrorExitCode;
  }

  if (nproc > kMaxLocalProcesses && !dry_run) {
    std::fprintf(stderr,
                 "hp-train: --nproc %d: at most %d local processes can be started (--dry-run checks any world "
                 "size; for more processes use several nodes with hp-launch)\n",
                 nproc, kMaxLocalProcesses);
    return hp::kConfigErrorExitCode;
  }
  if (fault_points) {
    for (const auto& p : hp::fault::points()) {
      std::printf("%-26s %-5s %s\n", p.name, hp::fault::action_name(p.action), p.where);
    }
    return 0;
  }

  hp::dist::DistEnv env;
  try {
    env = hp::dist::read_dist_env();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-train: %s\n", e.what());
    return hp::kConfigErrorExitCode;
  }
  const bool launched = std::getenv("HP_LAUNCHED") != nullptr || env.source != "single";
  const int world = nproc > 0 && !launched ? nproc : env.world_size;

  hp::Setup setup;
  try {
    hp::RawConfig raw = config_file.empty() ? hp::RawConfig::parse_string("", "<defaults>")
                                            : hp::RawConfig::parse_file(config_file);
    for (const auto& o : overrides) raw.apply_override(o);
    setup = hp::prepare(raw, world);
  } catch (const hp::ConfigException& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fprintf(stderr, "hp-train: the config was refused (%zu problem%s); nothing was started\n",
                 e.issues().size(), e.issues().size() == 1 ? "" : "s");
    return hp::kConfigErrorExitCode;
  }
  // The environment every rank inherits: a bad kernel choice is refused here,
  // before any process starts, not by each rank at its first MoE layer.
  try {
    hp::packed_gemm::best_kernel();
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "hp-train: %s; nothing was started\n", e.what());
    return hp::kConfigErrorExitCode;
  }

  if (options_markdown) {
    std::cout << setup.schema->to_markdown();
    return 0;
  }
  if (print_config || dry_run) {
    std::cout << setup.config.to_yaml();
    if (!dry_run) return 0;
    std::cout << "---\n";
    print_features(setup);
    std::cout << setup.mesh.describe(all_ranks);
    std::cout << hp::describe_optimizer_groups(setup.config);
    try {
      std::cout << hp::plan::describe_schedule(setup);
    } catch (const std::exception& e) {
      std::cout << "schedule: not described (" << e.what() << ")\n";
    }
    // Memory per rank: the model state from each rank's build on the meta
    // device; activations too when hp-plan has calibrated this model here.
    try {
      hp::plan::Calibration cal;
      if (hp::plan::load_calibration(setup, cal)) {
        std::cout << hp::plan::describe_memory(hp::plan::estimate(setup, cal), true);
      } else {
        hp::plan::LayoutEstimate e;
        e.world = setup.mesh.world_size();
        e.ranks = hp::plan::model_state(setup);
        std::cout << hp::plan::describe_memory(e, false)
                  << "  (activations: not calibrated on this machine for this model; hp-plan measures them once)\n";
      }
    } catch (const std::exception& e) {
      std::cout << "memory per rank: not estimated (" << e.what() << ")\n";
    }
    std::cout << "dry run: config valid for " << world << " process" << (world == 1 ? "" : "es")
              << "; nothing was started\n";
    return 0;
  }
  if (config_file.empty()) {
    std::fprintf(stderr, "hp-train: a config file is required to train (see --help)\n");
    return hp::kConfigErrorExitCode;
  }

  if (nproc > 0 && !launched) {
    std::vector<std::string> cmd{hp::tools::self_exe("hp-train"), config_file};
    for (const auto& o : overrides) {
      cmd.push_back("--set");
      cmd.push_back(o);
    }
    hp::launch::LaunchOptions lo;
    lo.nproc_per_node = nproc;
    lo.threads_per_worker = threads_per_worker;
    if (setup.config.get_bool("distributed.flight_recorder")) {
      lo.flight_dir = setup.config.get_string("run.output_dir") + "/flight";
    }
    // Each worker a fork of this process, which has loaded LibTorch and the
    // plugins already (`cmd`, the same run, when it cannot be).
    lo.in_process = [&] {
      const int code = train(config_file, overrides);
      spdlog::shutdown();
      return code;
    };
    return hp::launch::run(lo, cmd);
  }
  return train(config_file, overrides);
}

}  // namespace

// Every object of the run is gone when run() returns (its files closed, its
// threads joined, its checkpoint written); the loggers are flushed, and the
// process ends without the static destructors (tools/exit_now.h).
int main(int argc, char** argv) {
  const int code = run(argc, argv);
  spdlog::shutdown();
  hp::tools::exit_now(code);
}
