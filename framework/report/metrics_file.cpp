// Reading metrics.jsonl and deciding which charts the page shows.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <istream>
#include <set>
#include <stdexcept>

#include "framework/report/report.h"

namespace hp::report {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "pipeline_idle_fraction_stage1" with tag "stage" -> {"pipeline_idle_fraction", 1}.
std::optional<std::pair<std::string, int>> split_index(const std::string& key, const std::string& tag) {
  const std::string marker = "_" + tag;
  const auto at = key.rfind(marker);
  if (at == std::string::npos || at == 0) return std::nullopt;
  const std::string digits = key.substr(at + marker.size());
  if (digits.empty() || digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::make_pair(key.substr(0, at), std::stoi(digits));
}

std::string unit_of(const std::string& key) {
  if (ends_with(key, "_bytes") || starts_with(key, "comm_bytes")) return "bytes";
  if (ends_with(key, "_seconds") || starts_with(key, "comm_seconds")) return "seconds";
  return "";
}

// "pipeline_idle_fraction" -> "Pipeline idle fraction".
std::string pretty(const std::string& key) {
  std::string out = key;
  std::replace(out.begin(), out.end(), '_', ' ');
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 'a' + 'A');
  return out;
}

// Builds charts from the keys of every row, each key plotted once.
class Planner {
 public:
  explicit Planner(const std::vector<Row>& rows) : rows_(rows) {
    for (const Row& row : rows) {
      for (const auto& [key, value] : row.values) {
        if (value) keys_.insert(key);
      }
    }
  }

  bool has(const std::string& key) const { return keys_.count(key) != 0 && used_.count(key) == 0; }

  // Keys not plotted yet that `pick` accepts, in name order.
  std::vector<std::string> take_if(const std::function<bool(const std::string&)>& pick) const {
    std::vector<std::string> out;
    for (const auto& key : keys_) {
      if (used_.count(key) == 0 && pick(key)) out.push_back(key);
    }
    return out;
  }

  // A chart of (key, label) pairs; keys without values are skipped and the
  // chart is dropped when none is left.
  void add(const std::string& id, const std::string& title, const std::string& unit,
           const std::vector<std::pair<std::string, std::string>>& keys) {
    Chart chart{id, title, unit, {}};
    for (const auto& [key, label] : keys) {
      if (!has(key)) continue;
      used_.insert(key);
      Series series{key, label, {}};
      for (const Row& row : rows_) {
        auto it = row.values.find(key);
        if (it != row.values.end() && it->second) series.points.emplace_back(row.step, *it->second);
      }
      chart.series.push_back(std::move(series));
    }
    if (!chart.series.empty()) charts_.push_back(std::move(chart));
  }

  void skip(const std::string& key) { used_.insert(key); }

  // Every `<base>_<tag><k>` key as one chart per base, series in index order.
  void add_indexed(const std::string& tag, const std::string& id_prefix,
                   const std::function<bool(const std::string&)>& base_filter) {
    std::map<std::string, std::map<int, std::string>> by_base;
    for (const auto& key : take_if([&](const std::string& k) {
           auto split = split_index(k, tag);
           return split && base_filter(split->first);
         })) {
      auto split = split_index(key, tag);
      by_base[split->first][split->second] = key;
    }
    for (const auto& [base, keys] : by_base) {
      std::vector<std::pair<std::string, std::string>> series;
      for (const auto& [index, key] : keys) series.emplace_back(key, tag + " " + std::to_string(index));
      add(id_prefix + base, pretty(base) + " per " + tag, unit_of(base), series);
      // The bare figure is one of these (the logging rank's own).
      skip(base);
    }
  }

  std::vector<Chart> take() { return std::move(charts_); }

 private:
  const std::vector<Row>& rows_;
  std::set<std::string> keys_;
  std::set<std::string> used_;
  std::vector<Chart> charts_;
};

// comm_<what>_<group>_<op> keys (and the comm_<what> total) as one chart.
void add_comm(Planner& plan, const std::string& what, const std::string& title) {
  const std::string prefix = "comm_" + what + "_";
  std::vector<std::pair<std::string, std::string>> series;
  for (const auto& key : plan.take_if([&](const std::string& k) { return starts_with(k, prefix); })) {
    std::string rest = key.substr(prefix.size());
    const auto cut = rest.find('_');
    series.emplace_back(key, cut == std::string::npos ? rest : rest.substr(0, cut) + " " + rest.substr(cut + 1));
  }
  series.emplace_back("comm_" + what, "all groups");
  plan.add("chart-comm-" + what, title, what, series);
}

}  // namespace

std::vector<Row> parse_metrics(std::istream& in, const std::string& origin) {
  std::vector<Row> rows;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const bool unfinished = in.eof();  // the last line had no newline
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool has_step = j.is_object() && j.contains("step") && j["step"].is_number_integer();
    if (!has_step) {
      if (unfinished && j.is_discarded()) break;
      throw std::runtime_error(origin + ":" + std::to_string(number) +
                               ": not a JSON object with an integer \"step\" (is this a metrics.jsonl "
                               "written by hp-train?)");
    }
    Row row;
    row.step = j["step"].get<std::int64_t>();
    if (j.contains("time") && j["time"].is_number()) row.time = j["time"].get<double>();
    for (const auto& [key, value] : j.items()) {
      if (key == "step" || key == "time") continue;
      if (value.is_number()) {
        row.values[key] = value.get<double>();
      } else if (value.is_null()) {
        row.values[key] = std::nullopt;
      } else if (value.is_string()) {
        row.texts[key] = value.get<std::string>();
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<Chart> plan_charts(const std::vector<Row>& rows) {
  Planner plan(rows);
  plan.add("chart-loss", "Loss", "", {{"loss", "train"}, {"eval_loss", "eval"}});
  plan.add("chart-throughput", "Throughput", "tokens/s", {{"tokens_per_second", "tokens/s"}});
  std::vector<std::pair<std::string, std::string>> mfu;
  for (const auto& key : plan.take_if([](const std::string& k) { return k.find("mfu") != std::string::npos; })) {
    mfu.emplace_back(key, key);
  }
  plan.add("chart-mfu", "Model FLOPs utilisation", "", mfu);
  std::vector<std::pair<std::string, std::string>> flops;
  for (const auto& key : plan.take_if([](const std::string& k) { return k.find("flop") != std::string::npos; })) {
    flops.emplace_back(key, key);
  }
  plan.add("chart-flops", "Model FLOP/s", "FLOP/s", flops);
  plan.add("chart-lr", "Learning rate", "", {{"lr", "learning rate"}});
  plan.add("chart-grad-norm", "Gradient norm (before clipping)", "", {{"grad_norm", "global L2 norm"}});
  plan.add("chart-step-time", "Step time", "seconds", {{"step_seconds", "step"}});
  add_comm(plan, "seconds", "Communication seconds per group and operation");
  add_comm(plan, "bytes", "Communication bytes per group and operation");
  plan.add_indexed("stage", "chart-stage-", [](const std::string&) { return true; });
  plan.add("chart-pipeline-time", "Pipeline wait and compute (logging rank)", "seconds",
           {{"pipeline_wait_seconds", "wait"}, {"pipeline_compute_seconds", "compute"}});
  plan.add_indexed("rank", "chart-rank-", [](const std::string&) { return true; });
  std::vector<std::pair<std::string, std::string>> memory;
  for (const auto& key : plan.take_if([](const std::string& k) {
         return k.find("memory") != std::string::npos || k == "optimizer_state_bytes";
       })) {
    memory.emplace_back(key, key);
  }
  plan.add("chart-memory", "Memory (logging rank)", "bytes", memory);
  plan.add_indexed("expert", "chart-expert-", [](const std::string&) { return true; });
  std::vector<std::pair<std::string, std::string>> moe;
  for (const auto& key : plan.take_if([](const std::string& k) { return starts_with(k, "moe_"); })) {
    moe.emplace_back(key, key);
  }
  plan.add("chart-moe", "Mixture of experts: load imbalance (max over mean) and dropped share", "", moe);
  std::vector<std::pair<std::string, std::string>> aux;
  for (const auto& key : plan.take_if([](const std::string& k) { return starts_with(k, "aux_loss_"); })) {
    aux.emplace_back(key, key.substr(9));
  }
  plan.add("chart-aux-loss", "Auxiliary losses", "", aux);
  for (const auto& key : plan.take_if([](const std::string&) { return true; })) {
    plan.add("chart-key-" + key, pretty(key), unit_of(key), {{key, key}});
  }
  return plan.take();
}

}  // namespace hp::report
