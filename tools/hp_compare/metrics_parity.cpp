#include "tools/hp_compare/metrics_parity.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace hp::compare {

namespace {

/// `line` with the bare literals NaN, Infinity and -Infinity (which
/// Python's json writes, and JSON has not) quoted, outside strings.
std::string quote_literals(const std::string& line) {
  std::string out;
  bool in_string = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < line.size())
        out += line[++i];
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      continue;
    }
    bool done = false;
    for (const char* lit : {"-Infinity", "Infinity", "NaN"}) {
      const std::size_t n = std::strlen(lit);
      if (line.compare(i, n, lit) == 0) {
        out += '"' + std::string(lit) + '"';
        i += n - 1;
        done = true;
        break;
      }
    }
    if (!done) out += c;
  }
  return out;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::string fmt_bar(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", v);
  return buf;
}

struct Problem {
  std::int64_t step = 0;
  std::size_t key = 0;  ///< index in compared_keys()
  std::string text;     ///< the whole line, "FAIL: ..."
};

}  // namespace

const std::vector<std::string>& compared_keys() {
  static const std::vector<std::string> kKeys = {"loss", "grad_norm", "eval_loss"};
  return kKeys;
}

Metrics read_metrics(const std::string& run_dir) {
  Metrics m;
  m.path = run_dir + "/metrics.jsonl";
  std::ifstream in(m.path);
  if (!in) throw std::runtime_error("no metrics.jsonl in " + run_dir);
  std::string line;
  std::int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(quote_literals(line));
    } catch (const std::exception& e) {
      throw std::runtime_error(m.path + " line " + std::to_string(number) +
                               " is not JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("step") || !j.at("step").is_number_integer()) {
      throw std::runtime_error(m.path + " line " + std::to_string(number) +
                               " has no integer \"step\"");
    }
    const auto step = j.at("step").get<std::int64_t>();
    for (const auto& key : compared_keys()) {
      if (!j.contains(key)) continue;
      const auto& v = j.at(key);
      double x = 0;
      bool null = false;
      if (v.is_number()) {
        x = v.get<double>();
      } else if (v.is_null()) {
        x = std::numeric_limits<double>::quiet_NaN();
        null = true;
      } else if (v.is_string() && v.get<std::string>() == "NaN") {
        x = std::numeric_limits<double>::quiet_NaN();
      } else if (v.is_string() && v.get<std::string>() == "Infinity") {
        x = std::numeric_limits<double>::infinity();
      } else if (v.is_string() && v.get<std::string>() == "-Infinity") {
        x = -std::numeric_limits<double>::infinity();
      } else {
        throw std::runtime_error(m.path + " line " + std::to_string(number) + ": \"" + key +
                                 "\" is not a number: " + v.dump());
      }
      m.steps[step][key] = x;
      m.nulls[step][key] = null;
    }
    m.steps[step];  // a step with none of the keys still counts as logged
  }
  return m;
}

int compare_metrics(const Metrics& ref, const Metrics& run, const MetricsOptions& o) {
  std::vector<std::int64_t> steps;
  for (const auto& [step, values] : ref.steps) {
    if (step >= o.from_step && (o.to_step <= 0 || step <= o.to_step) && run.steps.count(step)) steps.push_back(step);
  }
  if (steps.empty()) {
    std::fprintf(stderr, "hp-compare: no common steps to compare (steps %lld to %s) in %s and %s\n",
                 static_cast<long long>(o.from_step), o.to_step > 0 ? std::to_string(o.to_step).c_str() : "the last",
                 ref.path.c_str(), run.path.c_str());
    return 2;
  }
  const std::string bars =
      o.exact ? std::string("bitwise equal")
              : "first " + fmt_bar(o.first_rtol) + ", then " + fmt_bar(o.loss_rtol);
  std::vector<Problem> nonfinite, missing, over;
  const auto& keys = compared_keys();
  for (std::size_t k = 0; k < keys.size(); ++k) {
    const std::string& key = keys[k];
    std::int64_t compared = 0, run_only = 0;
    double worst = 0;
    bool header = false;
    for (const auto step : steps) {
      const auto& a = ref.steps.at(step);
      const auto& b = run.steps.at(step);
      const bool has_a = a.count(key) != 0, has_b = b.count(key) != 0;
      if (!has_a) {
        run_only += has_b;
        continue;
      }
      if (!has_b) {
        missing.push_back({step, k,
                           "FAIL: " + key + " at step " + std::to_string(step) +
                               " is in the reference (" + ref.path + ") but not in the run (" +
                               run.path + ")"});
        continue;
      }
      if (!header) {
        std::printf("%6s  %22s  %22s  %10s\n", "step", ("reference " + key).c_str(),
                    ("run " + key).c_str(), "rel. error");
        header = true;
      }
      const double va = a.at(key), vb = b.at(key);
      const double e = std::fabs(vb - va) / std::max(std::fabs(va), 1e-12);
      std::printf("%6lld  %22.17g  %22.17g  %10.3e\n", static_cast<long long>(step), va, vb, e);
      const bool first = compared == 0 && o.from_step <= 1;
      ++compared;
      bool finite = true;
      for (const auto& [side, v, m] :
           {std::tuple{"reference", va, &ref}, std::tuple{"run", vb, &run}}) {
        if (std::isfinite(v)) continue;
        finite = false;
        const bool null = m->nulls.at(step).at(key);
        const std::string what = null            ? "null (NaN or infinity)"
                                 : std::isnan(v) ? "NaN"
                                                 : "infinite";
        nonfinite.push_back({step, k,
                             "FAIL: " + key + " at step " + std::to_string(step) + " is " + what +
                                 " in the " + side + " (" + m->path + ")"});
      }
      if (!finite) continue;
      worst = std::max(worst, e);
      // --exact with --norm-rtol: the norm's own bar (layouts whose
      // gradients are bitwise but whose norm sums ranks in other groups).
      const bool norm_bar = key == "grad_norm" && o.norm_rtol > 0;
      const bool bitwise = o.exact && !norm_bar;
      const double bar = bitwise                                  ? 0.0
                         : (key == "eval_loss" && o.eval_rtol > 0) ? o.eval_rtol
                         : norm_bar                                ? o.norm_rtol
                         : first                                   ? o.first_rtol
                                                                   : o.loss_rtol;
      if (bitwise ? !same_bits(va, vb) : e > bar) {
        std::string phase = o.phase;
        if (first && key == "loss") phase = "forward (the first step's loss already differs)";
        if (first && key == "grad_norm")
          phase = "backward or gradient sync (the first gradient norm already differs)";
        if (first && key == "eval_loss")
          phase = "evaluation, or " + o.phase + " (the first eval loss differs)";
        char buf[96];
        std::snprintf(buf, sizeof buf, " (rel. error %.3e > %s)", e,
                      bitwise ? "0, bitwise" : fmt_bar(bar).c_str());
        over.push_back(
            {step, k, key + " at step " + std::to_string(step) + buf + " -> phase: " + phase});
      }
    }
    if (compared == 0 && run_only == 0) {
      bool anywhere = false;
      for (const auto& p : missing) anywhere |= p.key == k;
      if (!anywhere)
        std::printf("%s: in neither run at the compared steps, skipped\n", key.c_str());
      continue;
    }
    if (run_only > 0) {
      std::printf("%s: %lld compared steps have it in the run only, not compared\n", key.c_str(),
                  static_cast<long long>(run_only));
    }
    if (compared > 0) {
      const std::string key_bars = (!o.exact && key == "eval_loss" && o.eval_rtol > 0)
                                       ? "every value " + fmt_bar(o.eval_rtol)
                                   : (key == "grad_norm" && o.norm_rtol > 0)
                                       ? "every value " + fmt_bar(o.norm_rtol)
                                       : bars;
      std::printf("compared %lld steps of %s, max relative error %.3e (bar: %s)\n",
                  static_cast<long long>(compared), key.c_str(), worst, key_bars.c_str());
    }
  }
  auto earliest = [](const std::vector<Problem>& ps) {
    const Problem* best = nullptr;
    for (const auto& p : ps) {
      if (!best || p.step < best->step || (p.step == best->step && p.key < best->key)) best = &p;
    }
    return best;
  };
  for (const auto& p : nonfinite) std::printf("%s\n", p.text.c_str());
  for (const auto& p : missing) std::printf("%s\n", p.text.c_str());
  if (const Problem* p = earliest(over))
    std::printf("FAIL: first value over the bar: %s\n", p->text.c_str());
  return nonfinite.empty() && missing.empty() && over.empty() ? 0 : 1;
}

}  // namespace hp::compare
