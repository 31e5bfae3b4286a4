#include "hp/metrics/registry.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "framework/metrics/naming.h"

namespace hp::metrics {

struct Registry::Family {
  std::string name;
  std::string help;
  MetricType type;
  std::vector<double> bounds;
  std::vector<std::string> label_names;  // fixed by the first child
  // The library's family and our handles on its children; only the pair
  // matching `type` is used.
  prometheus::Family<prometheus::Counter>* library_counters = nullptr;
  prometheus::Family<prometheus::Gauge>* library_gauges = nullptr;
  prometheus::Family<prometheus::Histogram>* library_histograms = nullptr;
  std::map<Labels, std::unique_ptr<Counter>> counters;
  std::map<Labels, std::unique_ptr<Gauge>> gauges;
  std::map<Labels, std::unique_ptr<Histogram>> histograms;
};

namespace {

std::string quoted(const std::string& s) { return "'" + s + "'"; }

std::string join_names(const std::vector<std::string>& names) {
  std::string out = "{";
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
  return out + "}";
}

std::vector<std::string> names_of(const Labels& labels) {
  std::vector<std::string> names;
  names.reserve(labels.size());
  for (const auto& entry : labels) names.push_back(entry.first);
  return names;
}

std::string format_labels(const Labels& labels) {
  std::string out = "{";
  bool first = true;
  for (const auto& [name, value] : labels) {
    out += first ? "" : ", ";
    out += name;
    out += "=\"";
    out += value;
    out += '"';
    first = false;
  }
  return out + "}";
}

std::string format_bounds(const std::vector<double>& bounds) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < bounds.size(); ++i) out << (i ? ", " : "") << bounds[i];
  out << "]";
  return out.str();
}

// Drops an explicit trailing +Inf (always implied) and checks the rest.
std::vector<double> checked_bounds(const std::string& name, std::vector<double> bounds) {
  if (!bounds.empty() && bounds.back() == std::numeric_limits<double>::infinity()) {
    bounds.pop_back();
  }
  const std::string what = "histogram " + quoted(name);
  if (bounds.empty()) {
    throw std::invalid_argument(what +
                                " needs at least one finite bucket bound (+Inf is implied); "
                                "see exponential_buckets() and linear_buckets()");
  }
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      std::ostringstream message;
      message << what << ": bucket bound " << i << " is " << bounds[i]
              << "; bounds must be finite numbers (only a last +Inf is allowed)";
      throw std::invalid_argument(message.str());
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      std::ostringstream message;
      message << what << ": bucket bounds must be strictly increasing, but " << bounds[i]
              << " follows " << bounds[i - 1] << " in " << format_bounds(bounds);
      throw std::invalid_argument(message.str());
    }
  }
  return bounds;
}

// HELP lines escape backslash and newline; prometheus-cpp 1.0.1 writes the
// help as given, so a newline would end the line early.
std::string escaped_help(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

Registry::Registry() : library_(std::make_unique<prometheus::Registry>()) {}
Registry::~Registry() = default;

Registry::Family& Registry::find_or_add_family(const std::string& name, const std::string& help,
                                               MetricType type, const std::vector<double>& bounds,
                                               const Labels& labels) {
  auto it = families_.find(name);
  if (it == families_.end()) {
    check_metric_name(name, type);
    check_help(help, name);
    const std::string owner = "metric " + quoted(name);
    for (const auto& entry : labels) {
      check_label_name(entry.first, owner);
      check_label_value(entry.second, entry.first, owner);
      if (type == MetricType::kHistogram && entry.first == "le") {
        throw std::invalid_argument("label name 'le' of histogram " + quoted(name) +
                                    " is reserved: it holds each bucket's upper bound");
      }
      if (common_labels_.count(entry.first) != 0) {
        throw std::invalid_argument("label " + quoted(entry.first) + " of " + owner +
                                    " is also a common label of the registry " +
                                    format_labels(common_labels_) + "; drop it from the metric");
      }
    }
    auto family = std::make_unique<Family>();
    family->name = name;
    family->help = help;
    family->type = type;
    family->bounds = bounds;
    family->label_names = names_of(labels);
    const std::string library_help = escaped_help(help);
    switch (type) {
      case MetricType::kCounter:
        family->library_counters =
            &prometheus::BuildCounter().Name(name).Help(library_help).Register(*library_);
        break;
      case MetricType::kGauge:
        family->library_gauges =
            &prometheus::BuildGauge().Name(name).Help(library_help).Register(*library_);
        break;
      case MetricType::kHistogram:
        family->library_histograms =
            &prometheus::BuildHistogram().Name(name).Help(library_help).Register(*library_);
        break;
    }
    it = families_.emplace(name, std::move(family)).first;
  }
  Family& family = *it->second;
  if (family.type != type) {
    throw std::invalid_argument("metric " + quoted(name) + " is already registered as a " +
                                to_string(family.type) + "; it cannot also be a " +
                                to_string(type) + " (one name, one type)");
  }
  if (family.help != help) {
    throw std::invalid_argument("metric " + quoted(name) + " is already registered with help " +
                                quoted(family.help) + "; it was given " + quoted(help) +
                                " now (one name, one help text)");
  }
  if (family.bounds != bounds) {
    throw std::invalid_argument("histogram " + quoted(name) + " already has the buckets " +
                                format_bounds(family.bounds) + "; it was given " +
                                format_bounds(bounds) + " now");
  }
  const std::vector<std::string> names = names_of(labels);
  if (family.label_names != names) {
    throw std::invalid_argument("metric " + quoted(name) + " was first used with the labels " +
                                join_names(family.label_names) + "; it was given " +
                                join_names(names) +
                                " now (every series of a metric has the same label names)");
  }
  return family;
}

namespace {

// The child of `children` for `labels`, made by `make` on first use.
template <typename T, typename Make>
T& child(std::map<Labels, std::unique_ptr<T>>& children, const std::string& metric,
         const Labels& labels, Make make) {
  auto it = children.find(labels);
  if (it == children.end()) {
    for (const auto& entry : labels) {
      check_label_value(entry.second, entry.first, "metric " + quoted(metric));
    }
    it = children.emplace(labels, std::unique_ptr<T>(make())).first;
  }
  return *it->second;
}

}  // namespace

Counter& Registry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  Family& family = find_or_add_family(name, help, MetricType::kCounter, {}, labels);
  return child(family.counters, name, labels,
               [&] { return new Counter(family.name, family.library_counters->Add(labels)); });
}

Gauge& Registry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  Family& family = find_or_add_family(name, help, MetricType::kGauge, {}, labels);
  return child(family.gauges, name, labels,
               [&] { return new Gauge(family.library_gauges->Add(labels)); });
}

Histogram& Registry::histogram(const std::string& name, const std::string& help,
                               const std::vector<double>& buckets, const Labels& labels) {
  const std::vector<double> bounds = checked_bounds(name, buckets);
  std::lock_guard<std::mutex> lock(mutex_);
  Family& family = find_or_add_family(name, help, MetricType::kHistogram, bounds, labels);
  return child(family.histograms, name, labels, [&] {
    return new Histogram(family.bounds, family.library_histograms->Add(labels, family.bounds));
  });
}

void Registry::set_common_labels(const Labels& labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (common_labels_set_) {
    throw std::logic_error("the common labels of the metrics registry are already set to " +
                           format_labels(common_labels_) + "; they can be set only once");
  }
  const std::string owner = "the common labels";
  for (const auto& [label, value] : labels) {
    check_label_name(label, owner);
    if (label == "le") {
      throw std::invalid_argument(
          "label name 'le' of the common labels is reserved: histograms use it for each "
          "bucket's upper bound");
    }
    check_label_value(value, label, owner);
    for (const auto& entry : families_) {
      const auto& names = entry.second->label_names;
      for (const auto& name : names) {
        if (name == label) {
          throw std::invalid_argument("common label " + quoted(label) +
                                      " is already a label of metric " + quoted(entry.first) +
                                      "; rename one of them");
        }
      }
    }
  }
  common_labels_ = labels;
  common_labels_set_ = true;
}

Labels Registry::common_labels() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return common_labels_;
}

std::vector<prometheus::MetricFamily> Registry::collect() const {
  const Labels common = common_labels();
  std::vector<prometheus::MetricFamily> families = library_->Collect();
  // The library collects families by type and series in hash order; a
  // stable order makes the exposition diffable and testable.
  std::sort(families.begin(), families.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<prometheus::ClientMetric::Label> prefix;
  for (const auto& [name, value] : common) prefix.push_back({name, value});
  for (prometheus::MetricFamily& family : families) {
    std::sort(family.metric.begin(), family.metric.end(),
              [](const auto& a, const auto& b) { return a.label < b.label; });
    for (prometheus::ClientMetric& series : family.metric) {
      series.label.insert(series.label.begin(), prefix.begin(), prefix.end());
    }
  }
  return families;
}

}  // namespace hp::metrics
