#pragma once
// The metrics registry: one per process, owned by the host and lent to
// plugins by reference. The values, families and label sets live in a
// prometheus-cpp registry; this class adds the project's rules on top (names
// and labels checked by naming.h, one type, help, bucket list and label
// set per name, labels every series carries) and hands out handles that stay
// valid as long as the registry. Every member is thread-safe: the trainer
// updates children while the HTTP thread renders them.
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hp/metrics/metric_types.h"

namespace prometheus {
class Registry;
struct MetricFamily;
}  // namespace prometheus

namespace hp::metrics {

/// Owns every metric. `counter()`, `gauge()` and `histogram()` create the
/// family and the child for `labels` on first use and return the same
/// child afterwards; the reference stays valid as long as the registry, so
/// keep it rather than looking it up every step.
///
/// Refused with std::invalid_argument naming the metric: a name or label
/// that breaks the naming rules (naming.h); the same name again with another
/// type, help text, bucket list or set of label names.
class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// `name` ends in `_total`.
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  /// `buckets` are the upper bounds, strictly increasing and finite; a last
  /// `+Inf` may be given and is implied anyway. `le` is not a legal label.
  Histogram& histogram(const std::string& name, const std::string& help,
                       const std::vector<double>& buckets, const Labels& labels = {});

  /// Labels every series carries (e.g. `rank="3"`), set once; a second call
  /// throws std::logic_error. A common label may not share a name with a
  /// label of any metric, nor be `le`.
  void set_common_labels(const Labels& labels);
  Labels common_labels() const;

  /// Every family as prometheus-cpp collects it, in name order, each
  /// series in label order and carrying the common labels first; help
  /// texts are escaped as the text format needs them. Include
  /// <prometheus/metric_family.h> to read the result.
  std::vector<prometheus::MetricFamily> collect() const;

 private:
  struct Family;
  Family& find_or_add_family(const std::string& name, const std::string& help, MetricType type,
                             const std::vector<double>& bounds, const Labels& labels);

  std::unique_ptr<prometheus::Registry> library_;
  mutable std::mutex mutex_;
  bool common_labels_set_ = false;
  Labels common_labels_;
  std::map<std::string, std::unique_ptr<Family>> families_;
};

}  // namespace hp::metrics
