#include "framework/metrics/metric_types.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace hp::metrics {
namespace {

// std::atomic<double>::fetch_add only exists from C++20.
void atomic_add(std::atomic<double>& target, double amount) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + amount, std::memory_order_relaxed)) {
  }
}

void check_bucket_args(const char* what, double start, double step, int count) {
  if (count < 1) {
    throw std::invalid_argument(std::string(what) + ": count is " + std::to_string(count) +
                                ", it must be at least 1");
  }
  if (!std::isfinite(start) || !std::isfinite(step)) {
    throw std::invalid_argument(std::string(what) + ": start and step must be finite numbers");
  }
}

}  // namespace

const char* to_string(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "unknown";
}

void Counter::inc(double amount) {
  if (!(amount >= 0)) {
    std::ostringstream message;
    message << "counter '" << name_ << "' can only go up, but inc(" << amount
            << ") was called; use a gauge for a value that can go down";
    throw std::invalid_argument(message.str());
  }
  atomic_add(value_, amount);
}

void Gauge::inc(double amount) { atomic_add(value_, amount); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), bucket_counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  // The first bound >= value. NaN is below no bound, so it goes to +Inf
  // (lower_bound alone would put it in the first bucket).
  const auto bucket =
      std::isnan(value)
          ? bounds_.size()
          : static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                     bounds_.begin());
  std::lock_guard<std::mutex> lock(mutex_);
  ++bucket_counts_[bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot snap;
  snap.cumulative_counts.reserve(bucket_counts_.size());
  std::lock_guard<std::mutex> lock(mutex_);
  std::uint64_t running = 0;
  for (std::uint64_t c : bucket_counts_) {
    running += c;
    snap.cumulative_counts.push_back(running);
  }
  snap.sum = sum_;
  snap.count = count_;
  return snap;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  check_bucket_args("exponential_buckets", start, factor, count);
  if (start <= 0 || factor <= 1) {
    std::ostringstream message;
    message << "exponential_buckets(start=" << start << ", factor=" << factor
            << "): start must be > 0 and factor > 1";
    throw std::invalid_argument(message.str());
  }
  std::vector<double> bounds;
  bounds.reserve(static_cast<std::size_t>(count));
  // One rounding per bound rather than an error that grows with each product.
  for (int i = 0; i < count; ++i) bounds.push_back(start * std::pow(factor, i));
  return bounds;
}

std::vector<double> linear_buckets(double start, double width, int count) {
  check_bucket_args("linear_buckets", start, width, count);
  if (width <= 0) {
    std::ostringstream message;
    message << "linear_buckets(width=" << width << "): width must be > 0";
    throw std::invalid_argument(message.str());
  }
  std::vector<double> bounds;
  bounds.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) bounds.push_back(start + width * i);
  return bounds;
}

}  // namespace hp::metrics
