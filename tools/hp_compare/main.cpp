// hp-compare: checks a run against a reference run by docs/PARITY.md's rules and
// prints the table: step, reference loss, run loss, relative error. Names the
// first step and the first parameter that break the bar, and the phase that
// diverged. Exit 0 when every bar holds, 1 when one breaks, 2 on bad input.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"

namespace fs = std::filesystem;

namespace {

std::map<std::int64_t, double> losses(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  if (!in) throw std::runtime_error("no metrics.jsonl in " + run_dir);
  std::map<std::int64_t, double> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out[j.at("step").get<std::int64_t>()] = j.at("loss").get<double>();
  }
  return out;
}

std::map<std::string, torch::Tensor> grads(const std::string& dir) {
  std::map<std::string, torch::Tensor> out;
  if (!fs::exists(dir)) throw std::runtime_error("no gradient dump at " + dir);
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    hp::ckpt::SafetensorsReader r(e.path().string());
    for (const auto& n : r.names()) out[n] = r.read(n);
  }
  return out;
}

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-12); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hp-compare: parity of a run against a reference run (docs/PARITY.md)"};
  std::string ref, run;
  double first_rtol = 1e-5, loss_rtol = 1e-4, grad_rtol = 1e-5;
  std::int64_t grads_step = 0, from_step = 0;
  bool exact = false;
  std::string phase = "optimizer";
  app.add_option("reference", ref, "Reference run directory (one process)")->required();
  app.add_option("run", run, "Run directory to check")->required();
  app.add_option("--first-loss-rtol", first_rtol, "Bar for the first step's loss");
  app.add_option("--loss-rtol", loss_rtol, "Bar for every later step's loss");
  app.add_option("--grad-rtol", grad_rtol, "Bar for every gradient");
  app.add_option("--grads-step", grads_step, "Compare gradient dumps of this step");
  app.add_option("--from-step", from_step, "Compare losses from this step on");
  app.add_flag("--exact", exact, "Require bitwise-equal losses");
  app.add_option("--phase", phase, "Name of the phase a later-step divergence points at");
  CLI11_PARSE(app, argc, argv);

  try {
    auto a = losses(ref), b = losses(run);
    std::printf("%6s  %22s  %22s  %10s\n", "step", "reference loss", "run loss", "rel. error");
    std::int64_t first_bad = -1, compared = 0;
    double worst = 0;
    std::string why;
    for (const auto& [step, la] : a) {
      if (step < from_step || !b.count(step)) continue;
      const double lb = b.at(step), e = rel(lb, la);
      std::printf("%6lld  %22.17g  %22.17g  %10.3e\n", static_cast<long long>(step), la, lb, e);
      ++compared;
      worst = std::max(worst, e);
      const bool first = compared == 1 && from_step <= 1;
      const double bar = exact ? 0.0 : (first ? first_rtol : loss_rtol);
      if (first_bad < 0 && (e > bar || (exact && la != lb))) {
        first_bad = step;
        why = first ? "forward (the first step's loss already differs)" : phase;
      }
    }
    if (compared == 0) {
      std::fprintf(stderr, "hp-compare: no common steps to compare\n");
      return 2;
    }
    std::printf("compared %lld steps, max relative loss error %.3e (bar: %s)\n",
                static_cast<long long>(compared), worst,
                exact ? "bitwise equal" : ("first " + std::to_string(first_rtol) + ", then " +
                                           std::to_string(loss_rtol)).c_str());
    bool grads_ok = true;
    if (grads_step > 0) {
      const std::string sub = "/grads_step" + std::to_string(grads_step);
      auto ga = grads(ref + sub), gb = grads(run + sub);
      double gworst = 0;
      std::string gworst_name;
      for (const auto& [name, ta] : ga) {
        if (!gb.count(name)) {
          std::printf("gradient %s missing from the run\n", name.c_str());
          grads_ok = false;
          continue;
        }
        const auto& tb = gb.at(name);
        if (ta.sizes() != tb.sizes()) {
          std::printf("gradient %s: shape differs\n", name.c_str());
          grads_ok = false;
          continue;
        }
        const double e = (tb - ta).abs().max().item<double>() / (ta.abs().max().item<double>() + 1e-12);
        if (e > gworst) {
          gworst = e;
          gworst_name = name;
        }
        if (e > grad_rtol && grads_ok) {
          std::printf("FAIL: first gradient over the bar: %s (rel. error %.3e > %.1e) -> phase: "
                      "backward or gradient sync\n", name.c_str(), e, grad_rtol);
          grads_ok = false;
        }
      }
      for (const auto& [name, tb] : gb) {
        if (!ga.count(name)) {
          std::printf("gradient %s missing from the reference\n", name.c_str());
          grads_ok = false;
        }
      }
      if (ga.empty()) {
        std::printf("FAIL: no gradients to compare in %s\n", (ref + sub).c_str());
        grads_ok = false;
      }
      std::printf("compared %zu gradients of step %lld, max relative error %.3e (%s)\n", ga.size(),
                  static_cast<long long>(grads_step), gworst, gworst_name.c_str());
    }
    if (first_bad >= 0) {
      std::printf("FAIL: first step over the bar: %lld -> phase: %s\n",
                  static_cast<long long>(first_bad), why.c_str());
    }
    if (first_bad >= 0 || !grads_ok) return 1;
    std::printf("PASS\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-compare: %s\n", e.what());
    return 2;
  }
}
