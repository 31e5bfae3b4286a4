#include "hp/metrics/metric_types.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace hp::metrics {
namespace {

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
  counter_.Increment(amount);
}

double Counter::value() const { return counter_.Value(); }

void Gauge::set(double value) { gauge_.Set(value); }
void Gauge::inc(double amount) { gauge_.Increment(amount); }
double Gauge::value() const { return gauge_.Value(); }

void Histogram::observe(double value) {
  if (std::isnan(value)) {
    // prometheus-cpp's Observe would count NaN in the first bucket, as if it
    // were below every bound; it is below none, so only +Inf counts it.
    std::vector<double> increments(bounds_.size() + 1, 0.0);
    increments.back() = 1;
    histogram_.ObserveMultiple(increments, value);
    return;
  }
  histogram_.Observe(value);
}

Histogram::Snapshot Histogram::snapshot() const {
  const prometheus::ClientMetric::Histogram collected = histogram_.Collect().histogram;
  Snapshot snap;
  snap.cumulative_counts.reserve(collected.bucket.size());
  for (const auto& bucket : collected.bucket) snap.cumulative_counts.push_back(bucket.cumulative_count);
  snap.sum = collected.sample_sum;
  snap.count = collected.sample_count;
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
