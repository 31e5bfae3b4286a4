#pragma once
// The three metric kinds the trainer reports, as thin handles on
// prometheus-cpp's Counter, Gauge and Histogram (the library owns the values
// and makes every update thread-safe). Handles are created only by a
// Registry, which owns them; callers keep the returned reference.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace hp::metrics {

/// One series' labels: name -> value, kept in name order.
using Labels = std::map<std::string, std::string>;

enum class MetricType { kCounter, kGauge, kHistogram };

/// "counter", "gauge" or "histogram", as the exposition's TYPE line spells it.
const char* to_string(MetricType type);

/// A value that only goes up (tokens seen, steps done). Its name ends in `_total`.
class Counter {
 public:
  /// Adds `amount`; throws std::invalid_argument naming the counter when
  /// `amount` is negative or NaN (prometheus-cpp would drop it silently; a
  /// value that goes down is a Gauge).
  void inc(double amount = 1);
  double value() const;

 private:
  friend class Registry;
  Counter(const std::string& name, prometheus::Counter& counter) : name_(name), counter_(counter) {}
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  const std::string& name_;  // the family's name, which outlives every child
  prometheus::Counter& counter_;
};

/// A value that goes up and down (loss, learning rate, memory in use).
class Gauge {
 public:
  void set(double value);
  void inc(double amount = 1);
  void dec(double amount = 1) { inc(-amount); }
  double value() const;

 private:
  friend class Registry;
  explicit Gauge(prometheus::Gauge& gauge) : gauge_(gauge) {}
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  prometheus::Gauge& gauge_;
};

/// Counts observations into buckets fixed at creation (upper bounds, each
/// bucket counting values <= its bound) plus the implicit `+Inf` bucket.
class Histogram {
 public:
  /// A consistent copy: `cumulative_counts` has one entry per bound and a
  /// last one for `+Inf`, which always equals `count`.
  struct Snapshot {
    std::vector<std::uint64_t> cumulative_counts;
    double sum = 0;
    std::uint64_t count = 0;
  };

  /// NaN is counted in the `+Inf` bucket only and makes the sum NaN.
  void observe(double value);
  Snapshot snapshot() const;
  /// The finite upper bounds, strictly increasing, without `+Inf`.
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  friend class Registry;
  Histogram(const std::vector<double>& bounds, prometheus::Histogram& histogram)
      : bounds_(bounds), histogram_(histogram) {}
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  const std::vector<double>& bounds_;  // the family's, which outlive every child
  prometheus::Histogram& histogram_;
};

/// `count` bounds `start, start*factor, ...`; start > 0, factor > 1, count >= 1.
std::vector<double> exponential_buckets(double start, double factor, int count);
/// `count` bounds `start, start+width, ...`; width > 0, count >= 1.
std::vector<double> linear_buckets(double start, double width, int count);

}  // namespace hp::metrics
