#include "hp/trainer/training_metrics.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "hp/comm/context.h"
#include "hp/config/config.h"
#include "framework/metrics/metrics.h"

namespace hp {

namespace {
// The peak before the last reset_peak_resident_memory(), so the process's
// overall peak survives the resets.
double g_peak_before_reset = 0;
}  // namespace

std::pair<double, double> resident_memory_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  double rss = 0, hwm = 0;
  while (std::getline(in, line)) {
    std::istringstream is(line);
    std::string key;
    double kb = 0;
    is >> key >> kb;
    if (key == "VmRSS:") rss = kb * 1024;
    if (key == "VmHWM:") hwm = kb * 1024;
  }
  return {rss, std::max(hwm, g_peak_before_reset)};
}

std::pair<double, double> resident_anon_and_file_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  double anon = 0, file = 0;
  while (std::getline(in, line)) {
    std::istringstream is(line);
    std::string key;
    double kb = 0;
    is >> key >> kb;
    if (key == "RssAnon:") anon = kb * 1024;
    if (key == "RssFile:") file = kb * 1024;
  }
  return {anon, file};
}

double reset_peak_resident_memory() {
  const auto [rss, peak] = resident_memory_bytes();
  g_peak_before_reset = std::max(g_peak_before_reset, peak);
  std::ofstream("/proc/self/clear_refs") << "5";  // Linux: VmHWM restarts from VmRSS
  return rss;
}

double peak_resident_memory_since_reset() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024;
  }
  return 0;
}

TrainingMetrics::TrainingMetrics(const Config& c, int rank, int local_rank, bool writes_jsonl)
    : registry_(std::make_unique<metrics::Registry>()) {
  auto& r = *registry_;
  r.set_common_labels({{"rank", std::to_string(rank)}});
  step_ = &r.gauge("hp_step", "Optimizer steps completed.");
  loss_ = &r.gauge("hp_loss", "Training loss of the last step (mean per token).");
  lr_ = &r.gauge("hp_learning_rate", "Learning rate of the last step.");
  grad_norm_ = &r.gauge("hp_grad_norm", "Global gradient L2 norm before clipping.");
  tps_ = &r.gauge("hp_tokens_per_second", "Training throughput of the last step, all ranks.");
  rss_ = &r.gauge("hp_resident_memory_bytes", "Resident memory of this process.");
  peak_rss_ = &r.gauge("hp_peak_resident_memory_bytes", "Peak resident memory of this process.");
  eval_loss_ = &r.gauge("hp_eval_loss", "Loss on the validation split at the last evaluation.");
  tokens_ = &r.counter("hp_tokens_total", "Tokens trained on, all ranks.");
  samples_ = &r.counter("hp_samples_total", "Samples trained on, all ranks.");
  step_time_ = &r.histogram("hp_step_duration_seconds", "Wall time of one optimizer step.",
                            metrics::exponential_buckets(0.01, 2.0, 14));
  r.gauge("hp_checkpoint_save_seconds", "Seconds the last checkpoint save took.");
  r.gauge("hp_checkpoint_load_seconds", "Seconds the last checkpoint load took.");
  if (c.get_bool("metrics.prometheus.enabled")) {
    exposer_ = std::make_unique<metrics::HttpExposer>(
        r, c.get_string("metrics.prometheus.bind"),
        static_cast<int>(c.get_int("metrics.prometheus.port")) + local_rank);
  }
  if (writes_jsonl && c.get_bool("metrics.jsonl")) {
    jsonl_ = std::make_unique<metrics::JsonlWriter>(c.get_string("run.output_dir") + "/metrics.jsonl");
  }
}

TrainingMetrics::~TrainingMetrics() = default;

std::string TrainingMetrics::url() const { return exposer_ ? exposer_->url() : ""; }

void TrainingMetrics::update_comm(dist::DistributedContext* d) {
  step_comm_bytes_ = 0;
  step_comm_seconds_ = 0;
  step_comm_by_op_.clear();
  if (!d) return;
  for (const auto& [name, group] : d->groups()) {
    for (const auto& [op, s] : group->stats()) {
      auto& seen = comm_seen_[name + "/" + op];
      const metrics::Labels labels{{"group", name}, {"op", op}};
      registry_->counter("hp_comm_bytes_total", "Bytes sent by collectives and P2P.", labels)
          .inc(static_cast<double>(s.bytes) - seen.first);
      step_comm_bytes_ += static_cast<double>(s.bytes) - seen.first;
      step_comm_seconds_ += s.seconds - seen.second;
      step_comm_by_op_[name + "_" + op] = {static_cast<double>(s.bytes) - seen.first, s.seconds - seen.second};
      registry_->counter("hp_comm_seconds_total", "Seconds spent waiting on communication.", labels)
          .inc(s.seconds - seen.second);
      seen = {static_cast<double>(s.bytes), s.seconds};
    }
  }
}

void TrainingMetrics::on_step(const StepFigures& f, dist::DistributedContext* d) {
  step_->set(static_cast<double>(f.step));
  loss_->set(f.loss);
  lr_->set(f.lr);
  grad_norm_->set(f.grad_norm);
  tps_->set(f.tokens_per_second);
  tokens_->inc(f.tokens);
  samples_->inc(f.samples);
  step_time_->observe(f.step_seconds);
  auto [rss, hwm] = resident_memory_bytes();
  rss_->set(rss);
  peak_rss_->set(hwm);
  update_comm(d);
}

void TrainingMetrics::log_step(const StepFigures& f, const std::map<std::string, double>& extra) {
  if (!jsonl_) return;
  std::map<std::string, double> fields{{"loss", f.loss},
                                       {"lr", f.lr},
                                       {"grad_norm", f.grad_norm},
                                       {"tokens_per_second", f.tokens_per_second},
                                       {"step_seconds", f.step_seconds},
                                       {"comm_bytes", step_comm_bytes_},
                                       {"comm_seconds", step_comm_seconds_},
                                       {"peak_resident_memory_bytes", resident_memory_bytes().second}};
  // Per group and operation (e.g. comm_bytes_ep_all_to_all), for plots.
  for (const auto& [key, v] : step_comm_by_op_) {
    fields["comm_bytes_" + key] = v.first;
    fields["comm_seconds_" + key] = v.second;
  }
  for (const auto& kv : extra) fields[kv.first] = kv.second;
  jsonl_->write(fields, f.step);
}

void TrainingMetrics::log_text(std::int64_t step, const std::string& key, const std::string& text) {
  if (jsonl_) jsonl_->write({}, step, {{key, text}});
}

void TrainingMetrics::on_checkpoint(const char* what, double seconds) {
  registry_->gauge(std::string("hp_checkpoint_") + what + "_seconds",
                   std::string("Seconds the last checkpoint ") + what + " took.")
      .set(seconds);
}

namespace {

// "pipeline_idle_fraction_stage1" -> {"pipeline_idle_fraction", "1"}; a name
// without a stage suffix -> {name, ""}.
std::pair<std::string, std::string> split_stage(const std::string& name) {
  const std::string tag = "_stage";
  const auto at = name.rfind(tag);
  if (at == std::string::npos || at == 0 || at + tag.size() == name.size()) return {name, ""};
  const std::string index = name.substr(at + tag.size());
  if (index.find_first_not_of("0123456789") != std::string::npos) return {name, ""};
  return {name.substr(0, at), index};
}

}  // namespace

void TrainingMetrics::on_figures(const std::map<std::string, double>& figures) {
  // A figure reported for every stage (`<name>_stage<k>` in the figures and
  // metrics.jsonl) is one series per stage, `hp_<name>{stage="k"}`. The
  // rank's own copy under the bare name is then left out: its value is one
  // of those series, and a metric takes one set of label names.
  for (const auto& [name, value] : figures) {
    const auto [base, stage] = split_stage(name);
    if (stage.empty()) continue;
    staged_figures_.insert(base);
    registry_->gauge("hp_" + base, "Step figure '" + base + "' reported by the step executor, per pipeline stage.",
                     {{"stage", stage}})
        .set(value);
  }
  for (const auto& [name, value] : figures) {
    if (!split_stage(name).second.empty() || staged_figures_.count(name) != 0) continue;
    registry_->gauge("hp_" + name, "Step figure '" + name + "' reported by the step executor.").set(value);
  }
}

void TrainingMetrics::on_eval(std::int64_t, double loss) { eval_loss_->set(loss); }

}  // namespace hp
