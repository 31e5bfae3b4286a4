// The comparison page of several runs (hp-report RUN_DIR... | SWEEP_DIR).
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "framework/report/report.h"

namespace hp::report {

namespace fs = std::filesystem;

namespace {

void flatten(const YAML::Node& n, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  if (n.IsMap()) {
    for (const auto& kv : n)
      flatten(
          kv.second,
          prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>(),
          out);
    return;
  }
  if (n.IsScalar()) {
    out[prefix] = n.as<std::string>();
    return;
  }
  YAML::Emitter e;
  e << YAML::Flow << n;
  out[prefix] = e.c_str();
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

std::string fmt(double v, int digits = 4) {
  if (std::isnan(v)) return "&mdash;";
  char b[64];
  std::snprintf(b, sizeof b, "%.*g", digits, v);
  return b;
}

using Figures = RunSummary;

struct Column {
  const char* title;
  double Figures::*field;
  bool lower_is_better;
};
const Column kColumns[] = {{"final loss", &Figures::loss, true},
                           {"eval loss", &Figures::eval_loss, true},
                           {"tokens/s", &Figures::tokens_per_second, false},
                           {"peak MiB (logging rank)", &Figures::peak_mib, true},
                           {"MFU", &Figures::mfu, false},
                           {"comm bytes/step", &Figures::comm_bytes, true}};

}  // namespace

RunSummary summarize(const RunData& r) {
  Figures f;
  std::vector<double> tps, mfu, comm;
  bool first = true;
  for (const Row& row : r.rows) {
    auto get = [&](const char* k) -> std::optional<double> {
      const auto it = row.values.find(k);
      return it == row.values.end() ? std::nullopt : it->second;
    };
    if (auto v = get("loss")) f.loss = *v;
    if (auto v = get("eval_loss")) f.eval_loss = *v;
    if (auto v = get("peak_resident_memory_bytes"))
      f.peak_mib = std::isnan(f.peak_mib) ? *v / 1048576.0 : std::max(f.peak_mib, *v / 1048576.0);
    if (!get("loss")) continue;
    // The first logged step carries start-up costs: left out of the medians
    // when there are others.
    if (first && r.rows.size() > 1) {
      first = false;
      continue;
    }
    if (auto v = get("tokens_per_second")) tps.push_back(*v);
    if (auto v = get("mfu")) mfu.push_back(*v);
    if (auto v = get("comm_bytes")) comm.push_back(*v);
  }
  f.tokens_per_second = median(tps);
  f.mfu = median(mfu);
  f.comm_bytes = median(comm);
  return f;
}

namespace {

double config_number(const RunData& r, const std::string& key, double fallback) {
  const auto it = r.config.find(key);
  if (it == r.config.end()) return fallback;
  try {
    return std::stod(it->second);
  } catch (const std::exception&) {
    return fallback;
  }
}

std::string delta(double v, double base, bool lower_is_better) {
  if (std::isnan(v) || std::isnan(base) || base == 0) return "";
  const double d = (v - base) / std::fabs(base) * 100;
  if (std::fabs(d) < 0.05) return " <span class=\"delta\">(=)</span>";
  const bool better = lower_is_better ? d < 0 : d > 0;
  char b[64];
  std::snprintf(b, sizeof b, " <span class=\"delta %s\">(%+.1f%%)</span>",
                better ? "better" : "worse", d);
  return b;
}

}  // namespace

std::map<std::string, std::string> flatten_yaml(const std::string& text) {
  std::map<std::string, std::string> out;
  flatten(YAML::Load(text), "", out);
  return out;
}

RunData load_run(const std::string& dir, const std::string& name) {
  RunData r;
  r.dir = dir;
  r.name = name;
  const fs::path metrics = fs::path(dir) / "metrics.jsonl";
  std::ifstream in(metrics);
  if (!in)
    throw std::runtime_error(
        "cannot read " + metrics.string() + ": is " + dir +
        " the run.output_dir of an hp-train run with metrics.jsonl on (the default)?");
  r.rows = parse_metrics(in, metrics.string());
  std::ifstream config(fs::path(dir) / "config.yaml");
  if (config) {
    std::ostringstream text;
    text << config.rdbuf();
    r.config = flatten_yaml(text.str());
  }
  std::ifstream predicted(fs::path(dir) / "predicted.json");
  if (predicted) {
    const auto j = nlohmann::json::parse(predicted, nullptr, false);
    if (!j.is_discarded()) {
      r.planned_layout = j.value("layout", std::string("?"));
      r.predicted_step_seconds = j.value("step_seconds", NAN);
      r.predicted_memory_mib = j.value("memory_mib", NAN);
    }
  }
  std::ifstream peaks(fs::path(dir) / "peaks.json");
  if (peaks) {
    const auto j = nlohmann::json::parse(peaks, nullptr, false);
    if (!j.is_discarded() && j.contains("start_resident_memory_bytes")) {
      const auto& p = j["peak_resident_memory_bytes"];
      const auto& s0 = j["start_resident_memory_bytes"];
      for (std::size_t k = 0; k < p.size() && k < s0.size(); ++k)
        r.rank_memory_mib.push_back((p[k].get<double>() - s0[k].get<double>()) / 1048576.0);
    }
  }
  return r;
}

PlanCheck plan_check(const RunData& r) {
  PlanCheck c;
  c.predicted_step = r.predicted_step_seconds;
  c.predicted_mib = r.predicted_memory_mib;
  std::vector<double> steps;
  int seen = 0;
  for (const Row& row : r.rows) {
    const auto it = row.values.find("step_seconds");
    if (it == row.values.end() || !it->second) continue;
    if (++seen > 2) steps.push_back(*it->second);
  }
  c.measured_step = median(steps);
  for (double m : r.rank_memory_mib) c.measured_mib = std::isnan(c.measured_mib) ? m : std::max(c.measured_mib, m);
  return c;
}

std::string render_comparison(const std::vector<RunData>& runs, const std::string& baseline,
                              const std::string& title) {
  if (runs.empty()) throw std::invalid_argument("no run to compare");
  std::size_t base = 0;
  if (!baseline.empty()) {
    const auto it = std::find_if(runs.begin(), runs.end(),
                                 [&](const RunData& r) { return r.name == baseline; });
    if (it == runs.end())
      throw std::invalid_argument("--baseline " + baseline + ": no run of that name");
    base = static_cast<std::size_t>(it - runs.begin());
  }
  // The config keys whose values differ (a run's own paths left out).
  std::set<std::string> keys;
  for (const RunData& r : runs)
    for (const auto& [k, v] : r.config) keys.insert(k);
  auto own_path = [](const RunData& r, const std::string& v) {
    const std::string abs = fs::absolute(r.dir).lexically_normal().string();
    return !v.empty() && (v.rfind(abs, 0) == 0 || v.rfind(r.dir, 0) == 0);
  };
  std::vector<std::string> differing;
  for (const auto& k : keys) {
    if (k == "run.output_dir") continue;
    std::set<std::string> values;
    bool path = false;
    for (const RunData& r : runs) {
      const auto it = r.config.find(k);
      const std::string v = it == r.config.end() ? "(absent)" : it->second;
      path = path || own_path(r, v);
      values.insert(v);
    }
    if (values.size() > 1 && !path) differing.push_back(k);
  }
  auto value_of = [](const RunData& r, const std::string& k) {
    const auto it = r.config.find(k);
    return it == r.config.end() ? std::string("(absent)") : it->second;
  };
  // Variants: runs equal in every differing key but run.seed.
  std::map<std::string, std::vector<std::size_t>> variants;
  std::vector<std::string> variant_of(runs.size());
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::string sig;
    for (const auto& k : differing)
      if (k != "run.seed") sig += k + "=" + value_of(runs[i], k) + " ";
    if (sig.empty()) sig = "(all alike)";
    variant_of[i] = sig;
    variants[sig].push_back(i);
  }
  const bool seeded = std::any_of(variants.begin(), variants.end(),
                                  [](const auto& v) { return v.second.size() > 1; });

  std::vector<Figures> figs;
  for (const RunData& r : runs) figs.push_back(summarize(r));

  // Charts: one series per run.
  struct Plot {
    const char* id;
    const char* title;
    const char* unit;
    const char* key;
    const char* x;  // "step", "tokens", "seconds"
  };
  const Plot plots[] = {
      {"cmp-loss", "Loss by step", "", "loss", "step"},
      {"cmp-eval-loss", "Eval loss by step", "", "eval_loss", "step"},
      {"cmp-loss-tokens", "Loss by tokens", "", "loss", "tokens"},
      {"cmp-loss-time", "Loss by wall time", "", "loss", "seconds"},
      {"cmp-tokens-per-second", "Tokens/s", "tokens/s", "tokens_per_second", "step"},
      {"cmp-memory", "Peak resident memory (logging rank)", "bytes", "peak_resident_memory_bytes",
       "step"},
      {"cmp-comm", "Communication bytes per step", "bytes", "comm_bytes", "step"}};
  std::vector<Chart> charts;
  for (const Plot& p : plots) {
    Chart c;
    c.id = p.id;
    c.title = p.title;
    c.unit = p.unit;
    c.x_label = p.x;
    for (const RunData& r : runs) {
      Series s;
      s.key = r.name;
      s.label = r.name;
      const double tokens_per_step =
          config_number(r, "training.global_batch_size", 0) * config_number(r, "model.seq_len", 0);
      std::optional<double> t0;
      for (const Row& row : r.rows) {
        if (!t0 && row.time) t0 = row.time;
        const auto it = row.values.find(p.key);
        if (it == row.values.end() || !it->second) continue;
        s.points.emplace_back(row.step, *it->second);
        if (std::string(p.x) == "tokens")
          s.xs.push_back(static_cast<double>(row.step) * tokens_per_step);
        if (std::string(p.x) == "seconds") s.xs.push_back(row.time && t0 ? *row.time - *t0 : 0.0);
      }
      c.series.push_back(std::move(s));
    }
    if (std::any_of(c.series.begin(), c.series.end(),
                    [](const Series& s) { return !s.points.empty(); }))
      charts.push_back(std::move(c));
  }

  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      << "<meta name=\"generator\" content=\"hp-report\"><link rel=\"icon\" href=\"data:,\">"
      << "<title>hp-report: " << html_escape(title) << "</title><style>" << page_style()
      << ".delta{color:#555}.delta.better{color:#0a7d36}.delta.worse{color:#b3261e}.noise{color:#"
         "777;font-style:italic}"
      << "tr.baseline td{background:#f2f7ff}</style></head><body>\n";
  out << "<h1>Comparison of " << runs.size() << " runs</h1><p class=\"meta\">" << html_escape(title)
      << "; baseline <code>" << html_escape(runs[base].name) << "</code>.</p>\n";
  out << "<nav><a href=\"#differing\">Differing keys</a> <a href=\"#summary\">Summary</a> ";
  if (seeded) out << "<a href=\"#seeds\">Seeds</a> ";
  for (const Chart& c : charts)
    out << "<a href=\"#" << c.id << "\">" << html_escape(c.title) << "</a> ";
  out << "</nav>\n";

  out << "<h2 id=\"differing\">Config keys that differ</h2>";
  if (differing.empty()) {
    out << "<p>None: the runs share every key (run.output_dir aside).</p>\n";
  } else {
    out << "<table class=\"differing\"><tr><th>run</th>";
    for (const auto& k : differing) out << "<th>" << html_escape(k) << "</th>";
    out << "</tr>";
    for (const RunData& r : runs) {
      out << "<tr><td>" << html_escape(r.name) << "</td>";
      for (const auto& k : differing)
        out << "<td data-key=\"" << html_escape(k) << "\">" << html_escape(value_of(r, k))
            << "</td>";
      out << "</tr>";
    }
    out << "</table>\n";
  }

  out << "<h2 id=\"summary\">Summary</h2><p class=\"meta\">Final loss and eval loss: the last "
         "logged; tokens/s, MFU "
      << "and communication bytes: medians over the logged steps after the first; peak memory: the "
         "logging rank's "
      << "maximum. In brackets: the difference from the baseline (green better, red worse).</p>";
  out << "<table class=\"summary\"><tr><th>run</th>";
  for (const Column& c : kColumns) out << "<th>" << c.title << "</th>";
  out << "</tr>";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    out << "<tr" << (i == base ? " class=\"baseline\"" : "") << " data-run=\""
        << html_escape(runs[i].name) << "\"><td>" << html_escape(runs[i].name)
        << (i == base ? " (baseline)" : "") << "</td>";
    for (const Column& c : kColumns) {
      const double v = figs[i].*(c.field);
      out << "<td class=\"num\" data-value=\""
          << (std::isnan(v) ? std::string("") : exact_number(v)) << "\">" << fmt(v)
          << (i == base ? "" : delta(v, figs[base].*(c.field), c.lower_is_better)) << "</td>";
    }
    out << "</tr>";
  }
  out << "</table>\n";

  if (seeded) {
    out << "<h2 id=\"seeds\">Variants over seeds</h2><p class=\"meta\">Runs that differ only in "
           "run.seed, as mean "
        << "&plusmn; sample standard deviation. A difference from the baseline's variant smaller "
           "than twice the "
        << "larger of the two standard deviations is marked <span class=\"noise\">within seed "
           "noise</span>.</p>";
    out << "<table class=\"seeds\"><tr><th>variant</th><th>runs</th>";
    for (const Column& c : kColumns) out << "<th>" << c.title << "</th>";
    out << "</tr>";
    auto stats = [&](const std::vector<std::size_t>& idx, double Figures::*field) {
      std::vector<double> v;
      for (const auto i : idx)
        if (!std::isnan(figs[i].*field)) v.push_back(figs[i].*field);
      if (v.empty()) return std::pair<double, double>{NAN, NAN};
      double m = 0;
      for (double x : v) m += x;
      m /= static_cast<double>(v.size());
      double s = 0;
      for (double x : v) s += (x - m) * (x - m);
      s = v.size() > 1 ? std::sqrt(s / static_cast<double>(v.size() - 1)) : 0.0;
      return std::pair<double, double>{m, s};
    };
    const auto& base_idx = variants[variant_of[base]];
    for (const auto& [sig, idx] : variants) {
      const bool is_base = sig == variant_of[base];
      out << "<tr" << (is_base ? " class=\"baseline\"" : "") << "><td>" << html_escape(sig)
          << (is_base ? " (baseline)" : "") << "</td><td class=\"num\">" << idx.size() << "</td>";
      for (const Column& c : kColumns) {
        const auto [m, s] = stats(idx, c.field);
        const auto [bm, bs] = stats(base_idx, c.field);
        out << "<td class=\"num\">" << fmt(m) << " &plusmn; " << fmt(s, 2);
        if (!is_base && !std::isnan(m) && !std::isnan(bm)) {
          if (std::fabs(m - bm) < 2 * std::max(s, bs))
            out << " <span class=\"noise\">within seed noise</span>";
          else
            out << delta(m, bm, c.lower_is_better);
        }
        out << "</td>";
      }
      out << "</tr>";
    }
    out << "</table>\n";
  }

  // hp-plan --measure: each planned run's prediction beside its measurement.
  bool planned = false;
  for (const RunData& r : runs) planned = planned || !r.planned_layout.empty();
  if (planned) {
    out << "<h2 id=\"planner\">Planner: predicted against measured</h2><p class=\"meta\">hp-plan's "
           "prediction for each run (predicted.json) beside what it measured: the median step after the "
           "first two; memory as the largest rank's peak after its last step minus its resident memory at "
           "start (peaks.json). Error: (predicted - measured) / measured.</p>";
    out << "<table class=\"planner\"><tr><th>run</th><th>layout</th><th>predicted step s</th><th>measured "
           "step s</th><th>error</th><th>predicted MiB</th><th>measured MiB</th><th>error</th></tr>";
    for (const RunData& r : runs) {
      if (r.planned_layout.empty()) continue;
      const PlanCheck c = plan_check(r);
      auto pct = [](double v) {
        if (std::isnan(v)) return std::string("&mdash;");
        char b[32];
        std::snprintf(b, sizeof b, "%+.1f%%", v);
        return std::string(b);
      };
      out << "<tr data-run=\"" << html_escape(r.name) << "\"><td>" << html_escape(r.name) << "</td><td>"
          << html_escape(r.planned_layout) << "</td><td class=\"num\">" << fmt(c.predicted_step)
          << "</td><td class=\"num\">" << fmt(c.measured_step) << "</td><td class=\"num\">"
          << pct(c.step_error_percent()) << "</td><td class=\"num\">" << fmt(c.predicted_mib)
          << "</td><td class=\"num\">" << fmt(c.measured_mib) << "</td><td class=\"num\">"
          << pct(c.memory_error_percent()) << "</td></tr>";
    }
    out << "</table>\n";
  }
  out << "<h2>Charts</h2><div class=\"charts\">\n";
  for (const Chart& c : charts) {
    out << "<figure id=\"" << html_escape(c.id) << "\"><figcaption>" << html_escape(c.title)
        << "</figcaption>" << chart_legend(c) << render_chart_svg(c) << "</figure>\n";
  }
  out << "</div>\n<h2>Runs</h2><ul>";
  for (const RunData& r : runs)
    out << "<li><code>" << html_escape(r.name) << "</code>: " << html_escape(r.dir) << "</li>";
  out << "</ul>\n</body></html>\n";
  return out.str();
}

}  // namespace hp::report
