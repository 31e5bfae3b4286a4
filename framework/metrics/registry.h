#pragma once
// The metrics registry: one per process, owned by the host and lent to
// plugins by reference. It holds metric families (a name, its help text and
// type) and, in each, one child per label set. The trainer updates children
// while the HTTP thread renders them, so every member is thread-safe.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "framework/metrics/metric_types.h"

namespace hp::metrics {

/// One child's values at the moment of collect().
struct SeriesSnapshot {
  Labels labels;     ///< the child's own labels, without the common labels
  double value = 0;  ///< counter and gauge
  std::vector<std::uint64_t> cumulative_counts;  ///< histogram: one per bound, then +Inf
  double sum = 0;                                ///< histogram
  std::uint64_t count = 0;                       ///< histogram
};

/// One family at the moment of collect(); series are in label order.
struct FamilySnapshot {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<double> bounds;  ///< histogram: finite upper bounds, without +Inf
  std::vector<SeriesSnapshot> series;
};

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

  /// Every family in name order, each read consistently.
  std::vector<FamilySnapshot> collect() const;

 private:
  struct Family;
  Family& find_or_add_family(const std::string& name, const std::string& help, MetricType type,
                             const std::vector<double>& bounds, const Labels& labels);

  mutable std::mutex mutex_;
  bool common_labels_set_ = false;
  Labels common_labels_;
  std::map<std::string, std::unique_ptr<Family>> families_;
};

}  // namespace hp::metrics
