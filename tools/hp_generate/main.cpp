// hp-generate: text from a checkpoint, at any layout.
//
//   hp-generate STEP_DIR --prompt TEXT | --prompts FILE [--max-new-tokens N]
//               [--greedy | --temperature T --top-k K --top-p P --seed S]
//               [--nproc N] [--set KEY=V ...] [--out DIR]
//
// The checkpoint's stored config (model, data, features) with the --set
// overrides (a layout: --set features.tensor_parallel.enabled=true ...) is
// resumed from STEP_DIR; each prompt is continued one token at a time, the
// whole context through the model's forward at that layout (no KV cache
// yet). The tokenizer is the one the checkpoint was trained with: bytes for
// data.type text, the prepared corpus's for data.type tokens. Standard
// output carries only the generated text (rank 0, as it comes with one
// prompt; prompt by prompt with several); logs go to standard error.
// Exit codes: 0 success, 1 a failure (the rank and the cause), 2 a usage
// error or a refused config or prompt.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "checkpoint/reader.h"
#include "framework/runtime/setup.h"
#include "framework/trainer/trainer.h"
#include "hp/comm/env.h"
#include "hp/config/config.h"
#include "hp/data/token_shards.h"
#include "hp/data/tokenizer.h"
#include "hp/data/tokens.h"
#include "framework/trainer/checkpoint_run.h"
#include "tools/exit_now.h"
#include "tools/self_exe.h"
#include "tools/hp_launch/launcher.h"

namespace fs = std::filesystem;

namespace {

/// The caller's standard output, kept before a launcher redirects the
/// workers' (rank 0 writes the text there, unprefixed, as it comes).
int g_text_fd = 1;



struct Job {
  std::string config_yaml;
  std::vector<std::string> overrides;
  std::vector<std::string> prompts;
  hp::GenerateOptions options;
  bool ids = false;  ///< prompts and output as token ids
  std::string out;
};

int generate_here(Job& job) {
  int rank = 0;
  try {
    const auto env = hp::dist::read_dist_env();
    rank = env.rank;
    hp::RawConfig raw = hp::RawConfig::parse_string(job.config_yaml, "checkpoint config.yaml");
    for (const auto& o : job.overrides) raw.apply_override(o);
    const auto tok = hp::run_tokenizer(hp::prepare(raw, env.world_size).config);
    hp::GenerateOptions o = job.options;
    for (const auto& p : job.prompts) {
      std::vector<std::int64_t> ids;
      for (auto id : tok->encode(p)) ids.push_back(id);
      o.prompts.push_back(ids);
    }
    o.stop_token = tok->eos_id();
    o.vocab_limit = tok->vocab_size();
    const bool stream = job.prompts.size() == 1;
    if (stream) {
      o.on_token = [&](std::size_t, std::int64_t t) {
        const std::string s = tok->decode({static_cast<std::int32_t>(t)});
        if (::write(g_text_fd, s.data(), s.size()) < 0) {
        }
      };
    }
    hp::Generator generator(raw);
    const hp::GenerateResult r = generator.generate(o);
    if (rank == 0) {
      if (r.kv_bytes > 0) {
        std::fprintf(stderr,
                     "hp-generate: key/value cache on rank 0: %lld bytes per token (%lld layers x 2 x %lld kv heads x "
                     "%lld head dim x %lld bytes), %.1f MiB\n",
                     static_cast<long long>(r.kv_bytes_per_token), static_cast<long long>(r.kv_layers),
                     static_cast<long long>(r.kv_heads), static_cast<long long>(r.kv_head_dim),
                     static_cast<long long>(r.kv_element_bytes), static_cast<double>(r.kv_bytes) / (1 << 20));
      }
      if (r.decode_steps > 0) {
        std::fprintf(stderr,
                     "hp-generate: prefill %.3f s, %lld decode steps %.3f s (%.1f ms per step, %.0f bytes sent per "
                     "step by rank 0)\n",
                     r.prefill_seconds, static_cast<long long>(r.decode_steps), r.decode_seconds,
                     1e3 * r.decode_seconds / static_cast<double>(r.decode_steps),
                     static_cast<double>(r.decode_bytes) / static_cast<double>(r.decode_steps));
      }
      nlohmann::json j;
      j["step"] = r.step;
      j["prompts"] = job.prompts;
      j["tokens"] = r.tokens;
      j["log_probs"] = r.log_probs;
      j["top2_gaps"] = r.top2_gaps;
      j["kv_cache"] = {{"bytes", r.kv_bytes},
                       {"bytes_per_token", r.kv_bytes_per_token},
                       {"layers", r.kv_layers},
                       {"kv_heads", r.kv_heads},
                       {"head_dim", r.kv_head_dim},
                       {"element_bytes", r.kv_element_bytes}};
      if (!r.teacher_forced.empty()) j["teacher_forced"] = r.teacher_forced;
      j["split_params"] = {{"count", r.split_params}, {"held_whole_by_some_rank", r.split_params_held_whole}};
      j["prefill_seconds"] = r.prefill_seconds;
      j["decode_seconds"] = r.decode_seconds;
      j["decode_steps"] = r.decode_steps;
      j["decode_bytes"] = r.decode_bytes;
      std::vector<std::string> texts;
      for (const auto& ids : r.tokens) {
        std::vector<std::int32_t> v(ids.begin(), ids.end());
        texts.push_back(tok->decode(v));
      }
      j["texts"] = texts;
      // Generated bytes need not be valid UTF-8 (a byte-level model early in
      // training): invalid sequences are replaced by U+FFFD in the JSON.
      std::ofstream(fs::path(job.out) / "generate.json")
          << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      std::string text;
      if (stream) {
        text = "\n";
      } else {
        for (std::size_t i = 0; i < texts.size(); ++i) text += job.prompts[i] + texts[i] + "\n";
      }
      if (::write(g_text_fd, text.data(), text.size()) < 0) {
      }
    }
    return 0;
  } catch (const hp::ConfigException& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return hp::kConfigErrorExitCode;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "hp-generate: %s\n", e.what());
    return hp::kConfigErrorExitCode;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-generate: rank %d failed: %s\n", rank, e.what());
    return 1;
  }
}

int run(int argc, char** argv) {
  CLI::App app{
      "hp-generate: continue prompts from a checkpoint at any layout (the checkpoint's stored config with --set "
      "applied). Standard output: the text only. Exit codes: 0 success, 1 failure, 2 usage error or refusal."};
  Job job;
  std::string step, prompt, prompts_file, config_file;
  int nproc = 0, threads_per_worker = 0;
  bool greedy = false, dry_run = false;
  std::vector<std::string> sets;
  app.add_option("step", step, "A checkpoint step directory, or a checkpoint root (its latest step)")->required();
  app.add_option("--prompt", prompt, "The prompt");
  app.add_option("--prompts", prompts_file, "A file of prompts, one per line (a batch)");
  app.add_option("--max-new-tokens", job.options.max_new_tokens, "Tokens to generate per prompt")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_flag("--greedy", greedy, "The most likely token each time (the default)");
  app.add_option("--temperature", job.options.temperature, "Sampling temperature (0: greedy)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", job.options.top_k, "Sample among the K most likely (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", job.options.top_p, "Sample within the smallest set of probability >= P")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", job.options.seed, "The sampling seed");
  bool no_cache = false;
  app.add_option("--micro-batches", job.options.micro_batches,
                 "Cut each rank's requests into this many micro-batches (pipeline stages pass them along)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--no-kv-cache", no_cache, "Recompute the whole context every step (no key/value cache)");
  app.add_flag("--teacher-forcing", job.options.teacher_forcing,
               "Also score each generated sequence with one forward over it (generate.json: teacher_forced)");
  app.add_option("--nproc", nproc, "Launch this many local processes")->check(CLI::PositiveNumber);
  app.add_option("--threads-per-worker", threads_per_worker, "With --nproc: intra-op threads of each process")
      ->check(CLI::PositiveNumber);
  app.add_option("--set", sets, "Override a key, e.g. a layout: --set features.tensor_parallel.enabled=true");
  app.add_option("--config", config_file,
                 "The config to use when the checkpoint stores none (an imported one: hp-ckpt import's model.yaml "
                 "beside a data section)");
  app.add_option("--out", job.out, "Directory of the run's files and generate.json (default: a new temporary one)");
  app.add_flag("--dry-run", dry_run,
               "Check the config, the tokenizer and the prompts, print the layout (the mesh) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : hp::kConfigErrorExitCode;
  }
  if (greedy) job.options.temperature = 0;
  if (no_cache) job.options.kv_cache = false;
  try {
    if (prompt.empty() == prompts_file.empty()) throw std::invalid_argument("give one of --prompt TEXT or --prompts FILE");
    if (!prompt.empty()) {
      job.prompts.push_back(prompt);
    } else {
      std::ifstream in(prompts_file);
      if (!in) throw std::invalid_argument("--prompts " + prompts_file + ": cannot be read");
      for (std::string line; std::getline(in, line);)
        if (!line.empty()) job.prompts.push_back(line);
      if (job.prompts.empty()) throw std::invalid_argument("--prompts " + prompts_file + ": no prompt");
    }
    step = hp::checkpoint_step_dir(step);
    job.config_yaml = hp::checkpoint_config_text(step, config_file);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-generate: %s\n", e.what());
    return hp::kConfigErrorExitCode;
  }
  if (job.out.empty()) {
    char tmpl[] = "/tmp/hp-generate.XXXXXX";
    if (!mkdtemp(tmpl)) {
      std::fprintf(stderr, "hp-generate: cannot create a temporary directory\n");
      return 1;
    }
    job.out = tmpl;
  }
  fs::create_directories(job.out);
  job.overrides = sets;
  for (const auto& kv : hp::checkpoint_run_overrides(step, job.out)) job.overrides.push_back(kv);

  hp::dist::DistEnv env;
  try {
    env = hp::dist::read_dist_env();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-generate: %s\n", e.what());
    return hp::kConfigErrorExitCode;
  }
  const bool launched = std::getenv("HP_LAUNCHED") != nullptr || env.source != "single";
  const int world = nproc > 0 && !launched ? nproc : env.world_size;
  try {
    hp::RawConfig raw = hp::RawConfig::parse_string(job.config_yaml, "checkpoint config.yaml");
    for (const auto& o : job.overrides) raw.apply_override(o);
    const hp::Setup setup = hp::prepare(raw, world);
    if (dry_run) std::cout << setup.mesh.describe(false);
    // A missing tokenizer, and a prompt the model cannot hold, refused
    // before any process starts.
    const auto tok = hp::run_tokenizer(setup.config);
    const std::int64_t T = setup.config.get_int("model.seq_len");
    for (std::size_t i = 0; i < job.prompts.size(); ++i) {
      const auto len = static_cast<std::int64_t>(tok->encode(job.prompts[i]).size());
      if (len >= T)
        throw std::invalid_argument("prompt " + std::to_string(i) + " is " + std::to_string(len) +
                                    " tokens; model.seq_len " + std::to_string(T) + " holds at most " +
                                    std::to_string(T - 1) + " (one position for the next token)");
    }
  } catch (const hp::ConfigException& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fprintf(stderr, "hp-generate: the config was refused (%zu problem%s); nothing was started\n",
                 e.issues().size(), e.issues().size() == 1 ? "" : "s");
    return hp::kConfigErrorExitCode;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-generate: %s\n", e.what());
    return hp::kConfigErrorExitCode;
  }
  if (dry_run) {
    std::cout << "dry run: " << job.prompts.size() << " prompt" << (job.prompts.size() == 1 ? "" : "s")
              << " fit model.seq_len; valid for " << world << " process" << (world == 1 ? "" : "es")
              << "; nothing was started\n";
    return 0;
  }
  if (nproc > 0 && !launched) {
    g_text_fd = ::dup(1);  // the forked workers inherit it; the launcher takes over their 1
    std::vector<std::string> cmd{hp::tools::self_exe("hp-generate")};
    for (int i = 1; i < argc; ++i) cmd.push_back(argv[i]);
    hp::launch::LaunchOptions lo;
    lo.nproc_per_node = nproc;
    lo.threads_per_worker = threads_per_worker;
    lo.in_process = [&] {
      const int c = generate_here(job);
      spdlog::shutdown();
      return c;
    };
    return hp::launch::run(lo, cmd);
  }
  return generate_here(job);
}

}  // namespace

int main(int argc, char** argv) { hp::tools::exit_now(run(argc, argv)); }
