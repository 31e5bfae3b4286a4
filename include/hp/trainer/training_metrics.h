#pragma once
// The trainer's figures: Prometheus series (registry owned here, served at
// /metrics when enabled) and one JSON line per logged step.
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

namespace hp {

class Config;
namespace metrics {
class Registry;
class HttpExposer;
class JsonlWriter;
class Gauge;
class Counter;
class Histogram;
}  // namespace metrics
namespace dist {
class DistributedContext;
}

struct StepFigures {
  std::int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_second = 0, step_seconds = 0;
  double tokens = 0, samples = 0;
};

class TrainingMetrics {
 public:
  /// `rank`/`local_rank` label the series and pick the port.
  TrainingMetrics(const Config& config, int rank, int local_rank, bool writes_jsonl);
  ~TrainingMetrics();

  metrics::Registry& registry() { return *registry_; }
  /// "" when the HTTP endpoint is off.
  std::string url() const;

  void on_step(const StepFigures& f, dist::DistributedContext* dist);
  /// Executor figures of the step as gauges hp_<name>; per-stage figures
  /// (`<name>_stage<k>`) as hp_<name>{stage="k"}.
  void on_figures(const std::map<std::string, double>& figures);
  /// Appends the JSON line for a logged step (only on the writing rank).
  void log_step(const StepFigures& f, const std::map<std::string, double>& extra = {});
  void on_checkpoint(const char* what, double seconds);
  void on_eval(std::int64_t step, double loss);
  /// A line of metrics.jsonl with one text field (a generated sample).
  void log_text(std::int64_t step, const std::string& key, const std::string& text);

 private:
  void update_comm(dist::DistributedContext* dist);
  std::unique_ptr<metrics::Registry> registry_;
  std::unique_ptr<metrics::HttpExposer> exposer_;
  std::unique_ptr<metrics::JsonlWriter> jsonl_;
  metrics::Gauge *step_, *loss_, *lr_, *grad_norm_, *tps_, *rss_, *peak_rss_, *eval_loss_;
  metrics::Counter *tokens_, *samples_;
  metrics::Histogram* step_time_;
  std::set<std::string> staged_figures_;  // figure names exported with a stage label
  std::map<std::string, std::pair<double, double>> comm_seen_;  // group/op -> bytes, seconds
  double step_comm_bytes_ = 0;
  double step_comm_seconds_ = 0;  // seconds waited on communication in the last step, all groups
  std::map<std::string, std::pair<double, double>> step_comm_by_op_;  // "<group>_<op>" -> bytes, seconds
};

/// Resident and peak resident memory of this process in bytes (from /proc).
/// This process's resident memory split as the kernel counts it: anonymous
/// (heap, tensors) and file-backed (mapped files: libraries, token shards),
/// in bytes (RssAnon, RssFile of /proc/self/status).
std::pair<double, double> resident_anon_and_file_bytes();
std::pair<double, double> resident_memory_bytes();
/// Restarts the kernel's peak (VmHWM) from the current resident memory, and
/// returns that; resident_memory_bytes() still reports the overall peak.
double reset_peak_resident_memory();
/// The kernel's peak since the last reset.
double peak_resident_memory_since_reset();

}  // namespace hp
