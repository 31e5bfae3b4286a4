// hp-plan: which layout of N processes fits and which is fastest, predicted
// before anything runs, and checked against measurements on request.
//
//   hp-plan CONFIG --nproc N [--memory-per-rank GB] [--set KEY=V ...]
//           [--micro-batch-sizes 1,2] [--precisions fp32,bf16] [--only REGEX] [--top K] [--all]
//           [--measure K [--rounds R] --out DIR]
//
// Enumerates the layouts of N ranks (data, tensor with and without sequence
// parallel and with per-module degrees, pipeline with each schedule and
// chunk count, context and expert parallel (and its tensor size), ZeRO
// stages, recompute, micro-batch sizes, and with --precisions fp32 and bf16
// mixed precision), keeps those the config check
// accepts (hp-train's own prepare), predicts each one's memory per rank and
// step time (framework/plan/plan.h), and prints them fastest first with the
// best one's breakdown. The calibration it needs is measured once per
// machine and model and cached. --measure K runs the first K through
// hp-sweep and prints predicted against measured with the error; with
// --rounds R the K runs R times over, round after round, each layout's
// step its fastest round and its memory its largest.
// Exit codes: 0 done, 1 a measured run failed, 2 usage or config error.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "framework/model/registry.h"
#include "framework/plan/plan.h"
#include "framework/report/report.h"
#include "framework/runtime/setup.h"
#include "framework/util/strings.h"
#include "hp/config/config.h"
#include "hp/config/errors.h"
#include "hp/logging/logging.h"
#include "hp/model/model_info.h"
#include "tools/exit_now.h"
#include "tools/self_exe.h"

namespace fs = std::filesystem;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

struct Candidate {
  std::vector<std::string> overrides;  ///< the layout's keys
  std::string label;
  std::string extra;  ///< the label's part after the degrees
  std::string refused;
  std::string precision;  ///< "fp32" or "bf16" when --precisions names it, else "" (the config's own)
  hp::plan::LayoutEstimate estimate;
};

/// The keys that set a precision ("" sets none: the config's own).
std::vector<std::string> precision_keys(const std::string& precision) {
  if (precision.empty()) return {};
  return {std::string("features.mixed_precision.enabled=") + (precision == "bf16" ? "true" : "false")};
}

std::vector<std::string> parse_precisions(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream s(list);
  for (std::string item; std::getline(s, item, ',');) {
    if (item != "fp32" && item != "bf16")
      throw std::invalid_argument("--precisions " + list + ": each of fp32 and bf16 (bf16: mixed precision)");
    out.push_back(item);
  }
  return out;
}

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

std::vector<int> parse_ints(const std::string& list, const char* what) {
  std::vector<int> out;
  std::stringstream s(list);
  std::string item;
  while (std::getline(s, item, ',')) {
    try {
      out.push_back(std::stoi(item));
    } catch (const std::exception&) {
      throw std::invalid_argument(std::string(what) + " " + list + ": expected integers separated by commas");
    }
    if (out.back() < 1) throw std::invalid_argument(std::string(what) + " " + list + ": each at least 1");
  }
  return out;
}

/// What the enumeration needs to know of the model.
struct ModelShape {
  bool experts = false;  ///< it builds moe layers (expert parallel and its tensor size apply)
  bool tied = false;     ///< the LM head shares the embedding's weight (their degrees are one)
  int blocks = 0;        ///< the pipeline's units (virtual stages up to blocks / pp)
};

/// The tensor-parallel module kinds with a degree of their own: the option
/// and the label's short name.
const std::pair<const char*, const char*> kModuleDegrees[] = {
    {"attention_size", "attn"}, {"ffn_size", "ffn"}, {"embedding_size", "embed"}, {"lm_head_size", "head"}};

/// The per-module degrees at stream degree `tp` with `dp` replicas: each
/// kind's degree is tp or a multiple of it that gathers from dp neighbours
/// (degree / tp dividing dp); a tied head takes the embedding's.
std::vector<std::array<int, 4>> module_degrees(int n, int tp, int dp, bool tied) {
  std::vector<int> opts;
  for (int d : divisors(n))
    if (d % tp == 0 && dp % (d / tp) == 0) opts.push_back(d);
  std::vector<std::array<int, 4>> out;
  for (int a : opts)
    for (int f : opts)
      for (int e : opts)
        for (int h : opts)
          if (!tied || e == h) out.push_back({a, f, e, h});
  return out;
}

/// The layouts of `n` ranks, each as the keys that set it (every parallel
/// feature named explicitly, so the base config's choice does not leak in).
/// Tensor parallel includes the per-module degrees (a stream of size 1 with
/// some kind above it too), interleaved_1f1b every chunk count from 2 to
/// blocks / pp, expert parallel its tensor size (1 or the stream's).
std::vector<Candidate> enumerate(int n, const ModelShape& model, const std::vector<int>& micro_batch_sizes,
                                 const std::vector<std::string>& precisions) {
  std::vector<Candidate> out;
  for (int tp : divisors(n))
    for (int pp : divisors(n / tp))
      for (int cp : divisors(n / tp / pp))
        for (int ep : model.experts ? divisors(n / tp / pp / cp) : std::vector<int>{1}) {
          const int dp = n / tp / pp / cp;
          // (schedule, chunks per rank)
          std::vector<std::pair<std::string, int>> schedules{{"", 1}};
          if (pp > 1) {
            schedules = {{"1f1b", 1}, {"gpipe", 1}};
            for (int v = 2; v == 2 || pp * v <= model.blocks; ++v) schedules.push_back({"interleaved_1f1b", v});
            schedules.push_back({"zb_h1", 1});
            schedules.push_back({"zbv", 2});
          }
          std::vector<int> etps{1};
          if (model.experts && ep > 1 && tp > 1) etps.push_back(tp);
          for (const auto& degrees : module_degrees(n, tp, dp, model.tied)) {
           const bool raised = std::any_of(degrees.begin(), degrees.end(), [tp](int d) { return d != tp; });
           const bool tp_on = tp > 1 || raised;
           for (const auto& [schedule, chunks] : schedules)
            for (int etp : etps)
            for (int sp : tp > 1 ? std::vector<int>{0, 1} : std::vector<int>{0})
              for (int zero : dp > 1 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0})
                for (int rc : {0, 1})
                  for (int mbs : micro_batch_sizes)
                   for (const auto& precision : precisions) {
                    Candidate c;
                    c.precision = precision;
                    auto set = [&c](const std::string& k, const std::string& v) { c.overrides.push_back(k + "=" + v); };
                    // The label names features here; an accepted layout's is
                    // its mesh's shape (the mesh names its dimensions).
                    std::string l;
                    set("features.tensor_parallel.enabled", tp_on ? "true" : "false");
                    std::string extra;
                    if (tp_on) {
                      set("features.tensor_parallel.size", std::to_string(tp));
                      set("features.tensor_parallel.sequence_parallel", sp ? "true" : "false");
                      for (std::size_t m = 0; m < degrees.size(); ++m) {
                        const bool own = degrees[m] != tp;
                        set(std::string("features.tensor_parallel.") + kModuleDegrees[m].first,
                            own ? std::to_string(degrees[m]) : "0");
                        if (own) extra += std::string(" ") + kModuleDegrees[m].second + std::to_string(degrees[m]);
                      }
                      l += " tensor_parallel=" + std::to_string(tp);
                    }
                    set("features.pipeline_parallel.enabled", pp > 1 ? "true" : "false");
                    if (pp > 1) {
                      set("features.pipeline_parallel.size", std::to_string(pp));
                      set("features.pipeline_parallel.schedule", schedule);
                      set("features.pipeline_parallel.virtual_stages",
                          std::to_string(schedule == "interleaved_1f1b" ? chunks : 1));
                      l += " pipeline_parallel=" + std::to_string(pp);
                    }
                    set("features.context_parallel.enabled", cp > 1 ? "true" : "false");
                    if (cp > 1) {
                      set("features.context_parallel.size", std::to_string(cp));
                      l += " context_parallel=" + std::to_string(cp);
                    }
                    if (model.experts) {
                      set("features.expert_parallel.enabled", ep > 1 ? "true" : "false");
                      if (ep > 1) {
                        set("features.expert_parallel.size", std::to_string(ep));
                        set("features.expert_parallel.tensor_size", std::to_string(etp));
                        l += " expert_parallel=" + std::to_string(ep);
                        if (etp > 1) extra += " etp" + std::to_string(etp);
                      }
                    }
                    if (sp) extra += " sp";
                    if (pp > 1) {
                      extra += " " + schedule;
                      if (schedule == "interleaved_1f1b" && chunks != 2) extra += " v" + std::to_string(chunks);
                    }
                    set("features.zero.enabled", zero > 0 ? "true" : "false");
                    if (zero > 0) {
                      set("features.zero.stage", std::to_string(zero));
                      extra += " zero" + std::to_string(zero);
                    }
                    set("features.recompute.enabled", rc ? "true" : "false");
                    if (rc) extra += " recompute";
                    set("training.micro_batch_size", std::to_string(mbs));
                    extra += " mbs" + std::to_string(mbs);
                    for (const auto& k : precision_keys(precision)) c.overrides.push_back(k);
                    if (precision == "bf16") extra += " bf16";
                    c.label = (l.empty() ? std::string("data_parallel") : l.substr(1)) + extra;
                    c.extra = extra;
                    out.push_back(std::move(c));
                  }
          }
        }
  return out;
}

/// The mesh's shape without its dimensions of size 1 ("pp=2 dp=2"), nor
/// those of the views that gather samples (the label's module degrees,
/// "attn4", say what they split).
std::string mesh_label(const hp::dist::ProcessMesh& mesh) {
  std::istringstream in(mesh.shape());
  std::set<std::string> skip;
  for (const auto& v : mesh.views())
    if (hp::plan::gathers_samples(v, mesh))
      for (const auto& d : v.dims) skip.insert(d.name);
  std::string out;
  for (std::string item; in >> item;) {
    if (skip.count(item.substr(0, item.find('=')))) continue;
    if (item.size() < 2 || item.compare(item.size() - 2, 2, "=1") != 0) out += (out.empty() ? "" : " ") + item;
  }
  return out.empty() ? "one rank" : out;
}

std::string fixed(double v, int digits) {
  if (std::isnan(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}


int run(int argc, char** argv) {
  CLI::App app{
      "hp-plan: the layouts of N processes that the config check accepts, each with its predicted memory per "
      "rank and step time, fastest first; --measure K runs the first K (hp-sweep) and prints predicted "
      "against measured. Exit codes: 0 done, 1 a measured run failed, 2 usage or config error."};
  std::string config, out, mbs_list, precision_list;
  std::vector<std::string> sets;
  int nproc = 0, top = 10, measure = 0, rounds = 1;
  double memory_gb = 0;
  bool all = false, recalibrate = false;
  app.add_option("config", config, "The config (YAML): the model, data and training to plan for")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--nproc", nproc, "Processes of the layouts")->required()->check(CLI::PositiveNumber);
  app.add_option("--memory-per-rank", memory_gb, "Drop layouts whose predicted peak per rank exceeds this (GiB)")
      ->check(CLI::PositiveNumber);
  app.add_option("--set", sets, "KEY=V applied before each layout's keys");
  app.add_option("--micro-batch-sizes", mbs_list,
                 "Micro-batch sizes to try, e.g. 1,2,4 (default: the config's training.micro_batch_size)");
  app.add_option("--precisions", precision_list,
                 "Precisions to try: fp32 and bf16 (bf16: the mixed_precision feature on; each calibrated "
                 "apart) (default: the config's own)");
  app.add_option("--top", top, "Layouts printed")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--all", all, "Print every layout, the refused ones with their reason");
  std::string only;
  app.add_option("--only", only,
                 "Keep the layouts whose label matches this regular expression (ECMAScript), e.g. 'etp|attn[0-9]' "
                 "or 'pp=2 .*interleaved': what is ranked, printed and measured");
  bool layouts_only = false;
  app.add_flag("--layouts", layouts_only,
               "Only list the layouts, one a line: accepted or refused, a tab, the keys that set it as --set "
               "arguments (and, refused, a tab and the reason); nothing is calibrated or predicted");
  app.add_flag("--recalibrate", recalibrate, "Measure the calibration again (it is cached per machine and model)");
  app.add_option("--measure", measure, "Run the first K layouts through hp-sweep and compare")
      ->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds,
                 "With --measure: run the K layouts this many times over, one round after another; each "
                 "layout's measured step is its fastest round (a slow spell of the host only adds time, and "
                 "rounds spread it over every layout), its memory its largest")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--out", out, "With --measure: the sweep's directory");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : hp::kConfigErrorExitCode;
  }
  std::regex only_re;
  try {
    if (!only.empty()) only_re = std::regex(only);
  } catch (const std::regex_error& e) {
    std::fprintf(stderr, "hp-plan: --only %s: not a regular expression (%s)\n", only.c_str(), e.what());
    return hp::kConfigErrorExitCode;
  }
  if (rounds > 1 && measure <= 0) {
    std::fprintf(stderr, "hp-plan: --rounds %d needs --measure K (the layouts it runs again)\n", rounds);
    return hp::kConfigErrorExitCode;
  }
  if (measure > 0 && out.empty()) {
    std::fprintf(stderr, "hp-plan: --measure needs --out DIR (the sweep's directory)\n");
    return hp::kConfigErrorExitCode;
  }

  // The base config, checked at one process with every layout key off: the
  // model and data every layout shares.
  hp::RawConfig base;
  std::vector<int> micro_batch_sizes;
  std::vector<std::string> precisions{""};
  ModelShape shape;
  try {
    base = hp::RawConfig::parse_file(config);
    for (const auto& s : sets) base.apply_override(s);
    hp::RawConfig probe = base;
    for (const char* f : {"tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel", "zero"})
      probe.apply_override(std::string("features.") + f + ".enabled=false");
    const hp::Setup one = hp::prepare(probe, 1);
    const hp::ModelInfo info = hp::model_info(one.config);
    shape.experts = info.size("experts") != nullptr;
    shape.tied = !info.shared_parameter_key.empty();
    shape.blocks = static_cast<int>(info.block_flops.size());
    micro_batch_sizes = mbs_list.empty() ? std::vector<int>{static_cast<int>(one.config.get_int("training.micro_batch_size"))}
                                         : parse_ints(mbs_list, "--micro-batch-sizes");
    if (!precision_list.empty()) precisions = parse_precisions(precision_list);
  } catch (const hp::ConfigException& e) {
    std::fprintf(stderr, "hp-plan: %s: the config is refused at one process:\n", config.c_str());
    for (const auto& i : e.issues()) std::fprintf(stderr, "  %s\n", i.format().c_str());
    return hp::kConfigErrorExitCode;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-plan: %s\n", e.what());
    return hp::kConfigErrorExitCode;
  }

  // The features' own start-up lines (a pipeline's partition) would repeat
  // for every layout and rank planned: warnings and errors only.
  hp::log::logger()->set_level(spdlog::level::warn);
  // Calibrate first (one process, real tensors), per micro-batch size and
  // precision: every feature that splits or replays off, the rest as
  // configured (mixed precision's policy applies to the blocks timed).
  std::map<std::pair<int, std::string>, hp::plan::Calibration> cals;
  for (int mbs : layouts_only ? std::vector<int>{} : micro_batch_sizes)
   for (const auto& precision : precisions) {
    hp::RawConfig r = base;
    for (const char* f :
         {"tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel", "zero", "recompute"})
      r.apply_override(std::string("features.") + f + ".enabled=false");
    r.apply_override("training.micro_batch_size=" + std::to_string(mbs));
    for (const auto& k : precision_keys(precision)) r.apply_override(k);
    const std::string what = "micro-batch " + std::to_string(mbs) + (precision.empty() ? "" : " " + precision);
    try {
      const hp::Setup s = hp::prepare(r, 1);
      hp::plan::Calibration cal;
      if (!recalibrate && hp::plan::load_calibration(s, cal)) {
        std::fprintf(stderr, "hp-plan: calibration for %s from %s (measured in %.1f s)\n", what.c_str(),
                     hp::plan::calibration_path(s).c_str(), cal.seconds);
      } else {
        cal = hp::plan::calibrate(s);
        std::fprintf(stderr, "hp-plan: calibrated %s in %.1f s (cached in %s)\n", what.c_str(), cal.seconds,
                     hp::plan::calibration_path(s).c_str());
      }
      cals[{mbs, precision}] = cal;
    } catch (const hp::ConfigException& e) {
      std::fprintf(stderr, "hp-plan: %s is refused at one process: %s\n", what.c_str(),
                   e.issues().empty() ? "" : e.issues().front().format().c_str());
      return hp::kConfigErrorExitCode;
    }
  }

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Candidate> cands = enumerate(nproc, shape, micro_batch_sizes, precisions);
  // Each layout checked and estimated on its own (a planning build per
  // rank, no tensors shared): the cores take layouts in turn.
  auto plan_one = [&](Candidate& c) {
    hp::RawConfig r = base;
    try {
      for (const auto& o : c.overrides) r.apply_override(o);
      const hp::Setup s = hp::prepare(r, nproc);
      c.label = mesh_label(s.mesh) + c.extra;
      const int mbs = static_cast<int>(s.config.get_int("training.micro_batch_size"));
      if (!layouts_only) c.estimate = hp::plan::estimate(s, cals.at({mbs, c.precision}));
    } catch (const hp::ConfigException& e) {
      c.refused = e.issues().empty() ? "refused" : e.issues().front().format();
    } catch (const std::exception& e) {
      c.refused = e.what();
    }
  };
  {
    std::atomic<std::size_t> next{0};
    auto work = [&] {
      for (std::size_t i = next++; i < cands.size(); i = next++) plan_one(cands[i]);
    };
    const unsigned workers = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (unsigned w = 1; w < workers; ++w) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
  }
  std::vector<Candidate*> accepted;
  for (auto& c : cands)
    if (c.refused.empty()) accepted.push_back(&c);
  const double planning = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (layouts_only) {
    for (const auto& c : cands) {
      std::string sets_text;
      for (const auto& o : c.overrides) sets_text += (sets_text.empty() ? "" : " ") + std::string("--set ") + o;
      std::printf("%s\t%s%s%s\n", c.refused.empty() ? "accepted" : "refused", sets_text.c_str(),
                  c.refused.empty() ? "" : "\t", c.refused.c_str());
    }
    return 0;
  }
  std::vector<Candidate*> fit;
  for (auto* c : accepted)
    if ((memory_gb <= 0 || c->estimate.peak_bytes() <= memory_gb * 1024 * kMiB) &&
        (only.empty() || std::regex_search(c->label, only_re)))
      fit.push_back(c);
  std::stable_sort(fit.begin(), fit.end(), [](const Candidate* a, const Candidate* b) {
    return a->estimate.step_seconds < b->estimate.step_seconds;
  });
  std::printf("hp-plan: %zu layouts of %d processes: %zu accepted by the config check, %zu within the memory "
              "limit%s; planned in %.2f s\n",
              cands.size(), nproc, accepted.size(), fit.size(),
              only.empty() ? "" : (" and matching --only " + only).c_str(), planning);
  std::printf("%4s  %-52s %10s %12s %10s %9s %9s\n", "#", "layout", "step s", "tokens/s", "peak MiB", "compute",
              "idle+comm");
  const std::size_t shown = all ? fit.size() : std::min<std::size_t>(fit.size(), static_cast<std::size_t>(top));
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& e = fit[i]->estimate;
    double compute = 0, other = 0;
    for (const auto& r : e.ranks) {
      compute = std::max(compute, r.compute + r.update);
      other = std::max(other, r.idle + r.comm);
    }
    std::printf("%4zu  %-52s %10.3f %12.0f %10.0f %9.3f %9.3f\n", i + 1, fit[i]->label.c_str(), e.step_seconds,
                e.tokens_per_step / e.step_seconds, e.peak_bytes() / kMiB, compute, other);
  }
  if (all) {
    for (const auto& c : cands)
      if (!c.refused.empty()) std::printf("      %-52s refused: %s\n", c.label.c_str(), c.refused.c_str());
  }
  if (!fit.empty()) {
    const auto& best = fit.front()->estimate;
    std::printf("\nbest: %s (%d intra-op threads per rank)\n", fit.front()->label.c_str(), best.threads_per_rank);
    std::printf("%s", hp::plan::describe_memory(best, true).c_str());
    std::printf("step time per rank (s): ");
    for (const auto& r : best.ranks)
      std::printf("%s rank %d compute %.3f idle %.3f comm %.3f update %.3f (%.1f MiB sent)", r.rank ? "," : "",
                  r.rank, r.compute, r.idle, r.comm, r.update, r.comm_bytes / kMiB);
    std::printf("\n");
  }
  if (measure <= 0) return 0;

  // --measure: the first K through hp-sweep, one variant each.
  const std::size_t k = std::min<std::size_t>(fit.size(), static_cast<std::size_t>(measure));
  const std::string sweep = (fs::path(hp::tools::self_exe("hp-plan")).parent_path() / "hp-sweep").string();
  std::vector<std::string> args{sweep, fs::absolute(config).string(), "--nproc", std::to_string(nproc), "--out", out};
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  nlohmann::json predicted = nlohmann::json::array();
  // The variants in rounds: run r * K + i is layout i's round r.
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < k; ++i) {
      std::string v;
      for (const auto& o : fit[i]->overrides) v += (v.empty() ? "" : " ") + o;
      args.push_back("--variant");
      args.push_back(v);
    }
  }
  for (std::size_t i = 0; i < k; ++i) {
    const auto& e = fit[i]->estimate;
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& r : e.ranks)
      ranks.push_back({{"rank", r.rank}, {"peak_bytes", r.peak()}, {"baseline_bytes", r.baseline},
                       {"model_state_bytes", r.model_state()}, {"activations_bytes", r.activations}});
    predicted.push_back({{"label", fit[i]->label}, {"step_seconds", e.step_seconds}, {"ranks", ranks}});
  }
  fs::create_directories(out);
  std::ofstream(fs::path(out) / "plan.json") << nlohmann::json{{"nproc", nproc}, {"layouts", predicted}}.dump(1)
                                              << "\n";
  std::string cmd;
  for (const auto& a : args) cmd += "'" + a + "' ";
  std::fflush(stdout);
  const int rc = std::system(cmd.c_str());
  // Predicted against measured, run by run (the sweep's runs in the same
  // order): each run gets its prediction (predicted.json), the comparison
  // page is written again with it.
  std::printf("\npredicted against measured (memory: the largest rank's peak after its last step minus its "
              "resident memory at start; step: the median after the first two%s):\n",
              rounds > 1 ? ("; each layout's fastest step and largest memory of " + std::to_string(rounds) +
                            " rounds").c_str()
                         : "");
  std::printf("%-52s %10s %10s %7s %9s %9s %7s\n", "layout", "pred MiB", "meas MiB", "err %", "pred s", "meas s",
              "err %");
  std::vector<double> mem_err, time_err;
  for (std::size_t i = 0; i < k; ++i) {
    const auto& e = fit[i]->estimate;
    double pred_mem = 0;
    for (const auto& r : e.ranks) pred_mem = std::max(pred_mem, (r.peak() - r.baseline) / kMiB);
    hp::report::PlanCheck c;
    c.predicted_step = e.step_seconds;
    c.predicted_mib = pred_mem;
    for (int round = 0; round < rounds; ++round) {
      char name[32];
      std::snprintf(name, sizeof name, "run-%03zu", static_cast<std::size_t>(round) * k + i);
      const fs::path dir = fs::path(out) / "runs" / name;
      if (fs::exists(dir)) {
        std::ofstream(dir / "predicted.json")
            << nlohmann::json{{"layout", fit[i]->label}, {"step_seconds", e.step_seconds}, {"memory_mib", pred_mem}}
                   .dump()
            << "\n";
      }
      try {
        const hp::report::PlanCheck m = hp::report::plan_check(hp::report::load_run(dir.string(), name));
        if (!std::isnan(m.measured_step) && !(m.measured_step >= c.measured_step)) c.measured_step = m.measured_step;
        if (!std::isnan(m.measured_mib) && !(m.measured_mib <= c.measured_mib)) c.measured_mib = m.measured_mib;
      } catch (const std::exception&) {
        // A run that failed or wrote no metrics: the other rounds' figures.
      }
    }
    const double me = c.memory_error_percent(), te = c.step_error_percent();
    if (!std::isnan(me)) mem_err.push_back(std::abs(me));
    if (!std::isnan(te)) time_err.push_back(std::abs(te));
    std::printf("%-52s %10s %10s %7s %9s %9s %7s\n", fit[i]->label.c_str(), fixed(c.predicted_mib, 0).c_str(),
                fixed(c.measured_mib, 0).c_str(), fixed(me, 1).c_str(), fixed(c.predicted_step, 3).c_str(),
                fixed(c.measured_step, 3).c_str(), fixed(te, 1).c_str());
  }
  // The page again, now with the predictions.
  const std::string report = (fs::path(hp::tools::self_exe("hp-plan")).parent_path() / "hp-report").string();
  const std::string page_cmd = "'" + report + "' '" + out + "' > /dev/null";
  if (std::system(page_cmd.c_str()) == 0)
    std::printf("comparison page with the predictions: %s\n", (fs::path(out) / "report.html").string().c_str());
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? NAN : s / static_cast<double>(v.size());
  };
  auto worst = [](const std::vector<double>& v) { return v.empty() ? NAN : *std::max_element(v.begin(), v.end()); };
  std::printf("memory error: mean %s %%, max %s %%; step time error: mean %s %%, max %s %% (%zu layouts)\n",
              fixed(mean(mem_err), 1).c_str(), fixed(worst(mem_err), 1).c_str(), fixed(mean(time_err), 1).c_str(),
              fixed(worst(time_err), 1).c_str(), k);
  return rc == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int code = run(argc, argv);
  hp::tools::exit_now(code);
}
