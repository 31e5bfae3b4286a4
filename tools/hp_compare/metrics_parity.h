#pragma once
// hp-compare's metrics part: loss, grad_norm and eval_loss of metrics.jsonl,
// step by step, against a reference run (docs/PARITY.md's bars).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hp::compare {

/// Keys compared, in the order they are reported (and ties are broken).
const std::vector<std::string>& compared_keys();

/// Every line's compared keys by step (a step logged twice, as after a
/// resume, keeps its last values). NaN and infinities, written as null (as
/// the trainer does) or as the literals NaN, Infinity, -Infinity, read as
/// NaN and +-infinity; `nulls` gets "step/key" of every null. Throws
/// std::runtime_error naming the file and line of a bad line.
struct Metrics {
  std::string path;
  std::map<std::int64_t, std::map<std::string, double>> steps;
  std::map<std::int64_t, std::map<std::string, bool>> nulls;  ///< step -> key -> written as null
};
Metrics read_metrics(const std::string& run_dir);

struct MetricsOptions {
  double first_rtol = 1e-5, loss_rtol = 1e-4;
  /// When > 0, the bar for every eval_loss value instead of the loss bars.
  double eval_rtol = 0;
  /// When > 0, the bar for every grad_norm value instead of the loss bars.
  double norm_rtol = 0;
  std::int64_t from_step = 0;
  /// When > 0, the last step compared.
  std::int64_t to_step = 0;
  bool exact = false;
  std::string phase = "optimizer";
};

/// Prints one table per key and every failure; returns 0 (every bar held),
/// 1 (one broke, a value is NaN or infinite, or a key the reference has at
/// a compared step is missing from the run) or 2 (no common step).
int compare_metrics(const Metrics& ref, const Metrics& run, const MetricsOptions& o);

}  // namespace hp::compare
