// hp-sweep: config-toggled experiments as one job.
//
//   hp-sweep CONFIG --grid KEY=V1,V2 ... [--variant "KEY=V KEY=V" ...]
//            [--repeat K] [--nproc N] [--set KEY=V ...] --out SWEEP_DIR
//   hp-sweep CONFIG --grid ... --dry-run
//
// Runs the product of the grids (each --variant, a set of keys taken
// together, times that product) (and K seeds: run.seed, run.seed + 1, ...)
// one hp-train after another, each in SWEEP_DIR/runs/run-NNN (its output
// in run-NNN.log beside it), with a progress line and an ETA. A variant the
// config check refuses is listed with its reason and skipped. Rerunning the
// same command continues: a finished run (run-NNN/sweep_done.json) is never
// touched again; an unfinished one starts over. Another sweep in the same
// directory is refused. At the end: a summary table and the comparison
// page SWEEP_DIR/report.html (hp-report SWEEP_DIR writes it again).
// --dry-run checks every variant as hp-train --dry-run would (one process
// for the whole grid), prints one line per run, and writes nothing.
// Exit codes: 0 every accepted run finished, 1 a run failed, 2 usage error.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "framework/report/report.h"
#include "framework/runtime/setup.h"
#include "hp/config/config.h"
#include "hp/config/errors.h"
#include "framework/util/strings.h"
#include "tools/self_exe.h"

extern char** environ;

namespace fs = std::filesystem;

namespace {

struct Grid {
  std::string key;
  std::vector<std::string> values;
};

/// "KEY=V1,V2": values split at commas outside brackets and braces.
Grid parse_grid(const std::string& item) {
  const auto eq = item.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
    throw std::invalid_argument("--grid " + item + ": expected KEY=V1,V2,...");
  Grid g{item.substr(0, eq), {}};
  std::string cur;
  int depth = 0;
  for (const char c : item.substr(eq + 1)) {
    if (c == '[' || c == '{') ++depth;
    if (c == ']' || c == '}') --depth;
    if (c == ',' && depth == 0) {
      g.values.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  g.values.push_back(cur);
  for (const auto& v : g.values)
    if (v.empty()) throw std::invalid_argument("--grid " + item + ": an empty value");
  return g;
}

/// "features.tensor_parallel.size" -> "tensor_parallel.size" (the last two parts).
std::string short_key(const std::string& key) {
  const auto last = key.rfind('.');
  if (last == std::string::npos) return key;
  const auto before = key.rfind('.', last - 1);
  return before == std::string::npos ? key : key.substr(before + 1);
}


/// Runs argv with stdout and stderr into `log`; returns the exit status
/// (128 + signal when killed).
int run_logged(const std::vector<std::string>& args, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("cannot start " + args[0] + ": " + std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}


std::string cell(double v, const char* format) {
  if (std::isnan(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, format, v);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "hp-sweep: run the product of config grids (and seeds) with hp-train, one run after another, "
      "resumable; a summary table and SWEEP_DIR/report.html at the end. Exit codes: 0 every "
      "accepted run "
      "finished, 1 a run failed, 2 usage error or another sweep in SWEEP_DIR."};
  std::string config, out;
  std::vector<std::string> grid_items, sets;
  int repeat = 1, nproc = 1, threads_per_worker = 0;
  app.add_option("config", config, "The base config (YAML)")->required()->check(CLI::ExistingFile);
  std::vector<std::string> variant_items;
  app.add_option("--grid", grid_items,
                 "KEY=V1,V2,...: a config key and its values (repeat for a product)");
  app.add_option("--variant", variant_items,
                 "\"KEY=V KEY=V ...\": one variant, its keys together (repeat for a list; with --grid, each "
                 "variant times the grids' product)");
  app.add_option("--repeat", repeat, "Seeds per variant: run.seed, run.seed + 1, ...")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--nproc", nproc, "Processes per run (hp-train --nproc)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--threads-per-worker", threads_per_worker,
                 "With --nproc > 1: intra-op threads of each process")
      ->check(CLI::PositiveNumber);
  app.add_option("--set", sets, "KEY=V applied to every run before the grid's values");
  app.add_option("--out", out, "The sweep's directory (required unless --dry-run)");
  bool dry_run = false;
  app.add_flag("--dry-run", dry_run,
               "Check every variant with the config check, print one line per run (name, accepted or "
               "refused, variant, reason), write nothing, and exit 0");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : hp::kConfigErrorExitCode;
  }

  std::vector<Grid> grids;
  nlohmann::json plan;
  if (out.empty() && !dry_run) {
    std::fprintf(stderr, "hp-sweep: --out SWEEP_DIR is required (or --dry-run to check the variants only)\n");
    return hp::kConfigErrorExitCode;
  }
  if (grid_items.empty() && variant_items.empty()) {
    std::fprintf(stderr, "hp-sweep: give --grid KEY=V1,V2 or --variant \"KEY=V ...\" (see --help)\n");
    return hp::kConfigErrorExitCode;
  }
  // Each variant's keys, split at spaces.
  std::vector<std::vector<std::string>> variants;
  for (const auto& v : variant_items) {
    std::istringstream in(v);
    std::vector<std::string> keys;
    for (std::string kv; in >> kv;) {
      if (kv.find('=') == std::string::npos || kv.front() == '=') {
        std::fprintf(stderr, "hp-sweep: --variant %s: expected KEY=V items separated by spaces\n", v.c_str());
        return hp::kConfigErrorExitCode;
      }
      keys.push_back(kv);
    }
    variants.push_back(keys);
  }
  if (variants.empty()) variants.emplace_back();
  try {
    for (const auto& g : grid_items) grids.push_back(parse_grid(g));
    std::ifstream in(config);
    std::stringstream text;
    text << in.rdbuf();
    plan["config"] = fs::absolute(config).string();
    plan["config_text"] = text.str();
    plan["grid"] = nlohmann::json::array();
    for (const auto& g : grids) plan["grid"].push_back({{"key", g.key}, {"values", g.values}});
    plan["variants"] = variant_items;
    plan["repeat"] = repeat;
    plan["nproc"] = nproc;
    plan["sets"] = sets;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-sweep: %s\n", e.what());
    return hp::kConfigErrorExitCode;
  }

  // The variants: the grids' product, first grid outermost, then the seeds;
  // each checked as hp-train would check it.
  std::size_t combos = 1;
  for (const auto& g : grids) combos *= g.values.size();
  nlohmann::json runs = nlohmann::json::array();
  for (std::size_t c = 0; c < combos * variants.size(); ++c) {
    std::vector<std::string> overrides = sets;
    std::string label;
    for (const auto& kv : variants[c / combos]) {
      overrides.push_back(kv);
      const auto eq = kv.find('=');
      label += (label.empty() ? "" : " ") + short_key(kv.substr(0, eq)) + kv.substr(eq);
    }
    std::size_t rest = c % combos;
    std::vector<std::size_t> pick(grids.size());
    for (std::size_t i = grids.size(); i-- > 0;) {
      pick[i] = rest % grids[i].values.size();
      rest /= grids[i].values.size();
    }
    for (std::size_t i = 0; i < grids.size(); ++i) {
      overrides.push_back(grids[i].key + "=" + grids[i].values[pick[i]]);
      label +=
          (label.empty() ? "" : " ") + short_key(grids[i].key) + "=" + grids[i].values[pick[i]];
    }
    std::int64_t seed = 0;
    std::string refused;
    try {
      hp::RawConfig raw = hp::RawConfig::parse_file(config);
      for (const auto& o : overrides) raw.apply_override(o);
      seed = hp::prepare(raw, nproc).config.get_int("run.seed");
    } catch (const hp::ConfigException& e) {
      for (const auto& issue : e.issues())
        refused += (refused.empty() ? "" : "; ") + issue.format();
    } catch (const std::exception& e) {
      refused = e.what();
    }
    for (int r = 0; r < repeat; ++r) {
      nlohmann::json run;
      char name[32];
      std::snprintf(name, sizeof name, "run-%03zu", static_cast<std::size_t>(runs.size()));
      run["name"] = name;
      run["dir"] = std::string("runs/") + name;
      std::vector<std::string> o = overrides;
      std::string l = label;
      if (repeat > 1 && refused.empty()) {
        o.push_back("run.seed=" + std::to_string(seed + r));
        l += " seed=" + std::to_string(seed + r);
      } else if (repeat > 1) {
        l += " (seed " + std::to_string(r + 1) + " of " + std::to_string(repeat) + ")";
      }
      run["label"] = l;
      run["overrides"] = o;
      if (!refused.empty()) run["refused"] = refused;
      runs.push_back(run);
    }
  }
  plan["runs"] = runs;
  if (dry_run) {
    std::size_t refused = 0;
    for (const auto& run : runs) {
      const bool ok = !run.contains("refused");
      refused += ok ? 0 : 1;
      std::printf("%s\t%s\t%s%s%s\n", run["name"].get<std::string>().c_str(), ok ? "accepted" : "refused",
                  run["label"].get<std::string>().c_str(), ok ? "" : "\t",
                  ok ? "" : run["refused"].get<std::string>().c_str());
    }
    std::printf("dry run: %zu runs, %zu accepted, %zu refused by the config check; nothing was started\n",
                runs.size(), runs.size() - refused, refused);
    return 0;
  }

  const fs::path dir(out);
  const fs::path plan_file = dir / "sweep.json";
  try {
    if (fs::exists(plan_file)) {
      std::ifstream in(plan_file);
      const nlohmann::json old = nlohmann::json::parse(in);
      for (const char* k : {"config_text", "grid", "variants", "repeat", "nproc", "sets"}) {
        const nlohmann::json none = std::string(k) == "variants" ? nlohmann::json::array() : nlohmann::json();
        if (old.value(k, none) != plan[k])
          throw std::invalid_argument(
              out + " holds another sweep (its " + std::string(k) +
              " differs): give another --out, or rerun that sweep's command");
      }
      std::fprintf(stderr, "hp-sweep: continuing the sweep in %s\n", out.c_str());
    } else {
      fs::create_directories(dir / "runs");
      const fs::path tmp = dir / "sweep.json.tmp";
      std::ofstream(tmp) << plan.dump(2) << "\n";
      fs::rename(tmp, plan_file);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-sweep: %s\n", e.what());
    return hp::kConfigErrorExitCode;
  }

  const std::string hp_train = (fs::path(hp::tools::self_exe("hp-sweep")).parent_path() / "hp-train").string();
  const std::size_t n = runs.size();
  std::size_t done_now = 0, failed = 0, refused = 0, position = 0;
  double spent = 0;
  std::vector<std::string> status(n);
  std::vector<double> seconds(n, NAN);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& run = runs[i];
    ++position;
    const fs::path run_dir = fs::absolute(dir / run["dir"].get<std::string>());
    const std::string label = run["label"];
    if (run.contains("refused")) {
      ++refused;
      status[i] = "refused";
      std::fprintf(stderr, "hp-sweep: [%zu/%zu] %s: refused by the config check, skipped: %s\n",
                   position, n, label.c_str(), run["refused"].get<std::string>().c_str());
      continue;
    }
    if (fs::exists(run_dir / "sweep_done.json")) {
      std::ifstream in(run_dir / "sweep_done.json");
      seconds[i] = nlohmann::json::parse(in).value("seconds", NAN);
      status[i] = "done (before)";
      std::fprintf(stderr, "hp-sweep: [%zu/%zu] %s: finished before, kept\n", position, n,
                   label.c_str());
      continue;
    }
    // The progress line: the share of runs past, the one starting, the ETA
    // from this invocation's mean run time.
    const std::size_t todo_left = [&] {
      std::size_t k = 0;
      for (std::size_t j = i; j < n; ++j)
        if (!runs[j].contains("refused") &&
            !fs::exists(fs::absolute(dir / runs[j]["dir"].get<std::string>()) / "sweep_done.json"))
          ++k;
      return k;
    }();
    const int width = 24, filled = static_cast<int>(width * (position - 1) / n);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar += std::string(static_cast<std::size_t>(width - filled), '.');
    const std::string eta =
        done_now > 0
            ? hp::format_hms(spent / static_cast<double>(done_now) * static_cast<double>(todo_left))
            : "?";
    std::fprintf(stderr, "hp-sweep: [%zu/%zu] [%s] running %s (%s) | ETA %s\n", position, n,
                 bar.c_str(), run["name"].get<std::string>().c_str(), label.c_str(), eta.c_str());
    std::error_code ec;
    fs::remove_all(run_dir, ec);  // an unfinished attempt starts over
    std::vector<std::string> args{hp_train, fs::absolute(config).string()};
    if (nproc > 1) {
      args.push_back("--nproc");
      args.push_back(std::to_string(nproc));
      if (threads_per_worker > 0) {
        args.push_back("--threads-per-worker");
        args.push_back(std::to_string(threads_per_worker));
      }
    }
    for (const auto& o : run["overrides"]) {
      args.push_back("--set");
      args.push_back(o.get<std::string>());
    }
    args.push_back("--set");
    args.push_back("run.output_dir=" + run_dir.string());
    const std::string log = run_dir.string() + ".log";
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = run_logged(args, log);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spent += s;
    ++done_now;
    seconds[i] = s;
    if (rc == 0) {
      const fs::path tmp = run_dir / "sweep_done.json.tmp";
      std::ofstream(tmp) << nlohmann::json{{"seconds", s}, {"label", label}}.dump() << "\n";
      fs::rename(tmp, run_dir / "sweep_done.json");
      status[i] = "done";
    } else {
      ++failed;
      status[i] = "failed (exit " + std::to_string(rc) + ")";
      std::fprintf(stderr, "hp-sweep: %s failed (exit %d); its output: %s\n", label.c_str(), rc,
                   log.c_str());
    }
  }

  // The summary, and the comparison page.
  std::printf("%-8s %-44s %-14s %10s %10s %10s %9s %8s\n", "run", "variant", "status", "loss",
              "eval loss", "tokens/s", "peak MiB", "seconds");
  std::vector<hp::report::RunData> finished;
  for (std::size_t i = 0; i < n; ++i) {
    hp::report::RunSummary f;
    const fs::path run_dir = dir / runs[i]["dir"].get<std::string>();
    if (status[i].rfind("done", 0) == 0) {
      try {
        finished.push_back(
            hp::report::load_run(run_dir.string(), runs[i]["name"].get<std::string>()));
        f = hp::report::summarize(finished.back());
      } catch (const std::exception& e) {
        status[i] = "no metrics";
      }
    }
    std::printf("%-8s %-44s %-14s %10s %10s %10s %9s %8s\n",
                runs[i]["name"].get<std::string>().c_str(),
                runs[i]["label"].get<std::string>().c_str(), status[i].c_str(),
                cell(f.loss, "%.4f").c_str(), cell(f.eval_loss, "%.4f").c_str(),
                cell(f.tokens_per_second, "%.0f").c_str(), cell(f.peak_mib, "%.0f").c_str(),
                cell(seconds[i], "%.1f").c_str());
  }
  std::printf("%zu runs: %zu finished, %zu failed, %zu refused by the config check\n", n,
              n - failed - refused, failed, refused);
  if (!finished.empty()) {
    try {
      const std::string page = hp::report::render_comparison(finished, "", "sweep " + out);
      std::ofstream(dir / "report.html", std::ios::binary | std::ios::trunc) << page;
      std::printf("comparison page: %s\n", (dir / "report.html").string().c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "hp-sweep: the comparison page was not written: %s\n", e.what());
    }
  }
  return failed > 0 ? 1 : 0;
}
