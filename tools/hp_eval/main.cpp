// hp-eval: the loss and perplexity of a checkpoint on a corpus, at any layout.
//
//   hp-eval STEP_DIR [--data PATH] [--nproc N] [--set KEY=V ...] [--out DIR]
//
// The run is the checkpoint's stored config (its model, data, seed and
// features) with --data as data.path and the --set overrides (a layout:
// --set features.tensor_parallel.enabled=true ...), resumed from STEP_DIR
// and evaluated once on the validation samples training evaluates
// (training.eval_samples of the data's validation split): at the training
// layout it prints the run's own eval loss at that step. Nothing is
// trained or saved; the run's files go to --out (a new temporary directory
// by default), never to the training run's directory.
// Exit codes: 0 success, 1 a failure (the rank and the cause), 2 a usage
// error or a refused config.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "checkpoint/error.h"
#include "checkpoint/reader.h"
#include "framework/runtime/setup.h"
#include "framework/trainer/trainer.h"
#include "hp/comm/env.h"
#include "hp/config/config.h"
#include "framework/trainer/checkpoint_run.h"
#include "tools/self_exe.h"
#include "tools/exit_now.h"
#include "tools/hp_launch/launcher.h"

namespace fs = std::filesystem;

namespace {



/// The run: the stored config, the caller's overrides, then what keeps it
/// an evaluation writing only into `out`.
std::vector<std::string> overrides_for(const std::string& step, const std::string& data,
                                       const std::vector<std::string>& sets, const std::string& out) {
  std::vector<std::string> o;
  if (!data.empty()) {
    o.push_back("data.path=" + data);
    o.push_back("data.blend=[]");
  }
  o.insert(o.end(), sets.begin(), sets.end());
  for (const auto& kv : hp::checkpoint_run_overrides(step, out)) o.push_back(kv);
  return o;
}

int evaluate_here(const std::string& config_yaml, const std::vector<std::string>& overrides, const std::string& out) {
  int rank = 0;
  try {
    rank = hp::dist::read_dist_env().rank;
    hp::RawConfig raw = hp::RawConfig::parse_string(config_yaml, "checkpoint config.yaml");
    for (const auto& o : overrides) raw.apply_override(o);
    hp::Trainer trainer(raw);
    const hp::EvalResult r = trainer.evaluate();
    if (rank == 0) {
      nlohmann::json j{{"step", r.step}, {"eval_loss", r.loss}, {"perplexity", std::exp(r.loss)},
                       {"samples", r.samples}, {"seq_len", r.seq}};
      std::ofstream(fs::path(out) / "eval.json") << j.dump() << "\n";
    }
    return 0;
  } catch (const hp::ConfigException& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return hp::kConfigErrorExitCode;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-eval: rank %d failed: %s\n", rank, e.what());
    return 1;
  }
}

int run(int argc, char** argv) {
  CLI::App app{
      "hp-eval: loss and perplexity of a checkpoint on a corpus, at any layout (the checkpoint's stored config with "
      "--data and --set applied). Exit codes: 0 success, 1 failure, 2 usage error or refused config."};
  std::string step, data, out, config_file;
  int nproc = 0, threads_per_worker = 0;
  std::vector<std::string> sets;
  app.add_option("step", step, "A checkpoint step directory, or a checkpoint root (its latest step)")->required();
  app.add_option("--data", data, "The corpus (data.path: a text file or directory, or a prepared token directory)");
  app.add_option("--nproc", nproc, "Launch this many local processes")->check(CLI::PositiveNumber);
  app.add_option("--threads-per-worker", threads_per_worker, "With --nproc: intra-op threads of each process")
      ->check(CLI::PositiveNumber);
  app.add_option("--set", sets, "Override a key, e.g. a layout: --set features.tensor_parallel.enabled=true");
  app.add_option("--config", config_file,
                 "The config to use when the checkpoint stores none (an imported one: hp-ckpt import's model.yaml "
                 "beside a data section)");
  app.add_option("--out", out, "Directory of the run's files and eval.json (default: a new temporary directory)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : hp::kConfigErrorExitCode;
  }

  std::string config_yaml;
  try {
    step = hp::checkpoint_step_dir(step);
    config_yaml = hp::checkpoint_config_text(step, config_file);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-eval: %s\n", e.what());
    return hp::kConfigErrorExitCode;
  }
  if (out.empty()) {
    char tmpl[] = "/tmp/hp-eval.XXXXXX";
    if (!mkdtemp(tmpl)) {
      std::fprintf(stderr, "hp-eval: cannot create a temporary directory\n");
      return 1;
    }
    out = tmpl;
  }
  fs::create_directories(out);
  const auto overrides = overrides_for(fs::absolute(step).string(), data, sets, out);

  hp::dist::DistEnv env;
  try {
    env = hp::dist::read_dist_env();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-eval: %s\n", e.what());
    return hp::kConfigErrorExitCode;
  }
  const bool launched = std::getenv("HP_LAUNCHED") != nullptr || env.source != "single";
  const int world = nproc > 0 && !launched ? nproc : env.world_size;
  try {
    hp::RawConfig raw = hp::RawConfig::parse_string(config_yaml, "checkpoint config.yaml");
    for (const auto& o : overrides) raw.apply_override(o);
    hp::prepare(raw, world);
  } catch (const hp::ConfigException& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fprintf(stderr, "hp-eval: the config was refused (%zu problem%s); nothing was started\n",
                 e.issues().size(), e.issues().size() == 1 ? "" : "s");
    return hp::kConfigErrorExitCode;
  }

  int code = 0;
  if (nproc > 0 && !launched) {
    std::vector<std::string> cmd{hp::tools::self_exe("hp-eval"), step, "--out", out};
    if (!data.empty()) cmd.insert(cmd.end(), {"--data", data});
    if (!config_file.empty()) cmd.insert(cmd.end(), {"--config", config_file});
    for (const auto& s : sets) cmd.insert(cmd.end(), {"--set", s});
    hp::launch::LaunchOptions lo;
    lo.nproc_per_node = nproc;
    lo.threads_per_worker = threads_per_worker;
    lo.in_process = [&] {
      const int c = evaluate_here(config_yaml, overrides, out);
      spdlog::shutdown();
      return c;
    };
    code = hp::launch::run(lo, cmd);
  } else {
    code = evaluate_here(config_yaml, overrides, out);
  }
  if (code != 0 || launched) return code;
  // The one line on standard output, from rank 0's file.
  std::ifstream in(fs::path(out) / "eval.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception&) {
    std::fprintf(stderr, "hp-eval: rank 0 wrote no %s/eval.json\n", out.c_str());
    return 1;
  }
  std::printf("step %lld | eval loss %.6f | perplexity %.4f | %lld samples x %lld tokens\n",
              static_cast<long long>(j["step"].get<std::int64_t>()), j["eval_loss"].get<double>(),
              j["perplexity"].get<double>(), static_cast<long long>(j["samples"].get<std::int64_t>()),
              static_cast<long long>(j["seq_len"].get<std::int64_t>()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { hp::tools::exit_now(run(argc, argv)); }
