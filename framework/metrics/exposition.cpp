#include "framework/metrics/exposition.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <vector>

#include "framework/metrics/registry.h"

namespace hp::metrics {
namespace {

// Beyond 2^53 not every integer is a double, so plain digits would claim a
// precision the value does not have.
constexpr double kLargestExactInteger = 9007199254740992.0;

void append_escaped(std::string& out, const std::string& text, bool escape_quote) {
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && escape_quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

void append_label(std::string& out, bool& first, const std::string& name,
                  const std::string& value) {
  out += first ? '{' : ',';
  first = false;
  out += name;
  out += "=\"";
  append_escaped(out, value, /*escape_quote=*/true);
  out += '"';
}

// "{common...,own..." without the closing brace, or "" when there are none.
std::string open_labels(const Labels& common, const Labels& own) {
  std::string out;
  bool first = true;
  for (const auto& [name, value] : common) append_label(out, first, name, value);
  for (const auto& [name, value] : own) append_label(out, first, name, value);
  return out;
}

void append_sample(std::string& out, const std::string& name, const std::string& labels,
                   const std::string& value) {
  out += name;
  if (!labels.empty()) {
    out += labels;
    out += '}';
  }
  out += ' ';
  out += value;
  out += '\n';
}

void append_family(std::string& out, const FamilySnapshot& family, const Labels& common) {
  out += "# HELP ";
  out += family.name;
  out += ' ';
  append_escaped(out, family.help, /*escape_quote=*/false);
  out += "\n# TYPE ";
  out += family.name;
  out += ' ';
  out += to_string(family.type);
  out += '\n';
  for (const SeriesSnapshot& series : family.series) {
    const std::string labels = open_labels(common, series.labels);
    if (family.type != MetricType::kHistogram) {
      append_sample(out, family.name, labels, format_number(series.value));
      continue;
    }
    const std::string bucket = family.name + "_bucket";
    for (std::size_t i = 0; i < series.cumulative_counts.size(); ++i) {
      std::string with_le = labels;
      bool first = labels.empty();
      append_label(with_le, first, "le",
                   i < family.bounds.size() ? format_number(family.bounds[i]) : "+Inf");
      append_sample(out, bucket, with_le, std::to_string(series.cumulative_counts[i]));
    }
    append_sample(out, family.name + "_sum", labels, format_number(series.sum));
    append_sample(out, family.name + "_count", labels, std::to_string(series.count));
  }
}

}  // namespace

std::string format_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  std::to_chars_result result{};
  if (value == std::trunc(value) && std::fabs(value) <= kLargestExactInteger) {
    result = std::to_chars(buffer, buffer + sizeof buffer, static_cast<std::int64_t>(value));
  } else {
    result = std::to_chars(buffer, buffer + sizeof buffer, value);
  }
  return std::string(buffer, result.ptr);
}

std::string to_prometheus_text(const Registry& registry) {
  const Labels common = registry.common_labels();
  const std::vector<FamilySnapshot> families = registry.collect();
  std::string out;
  for (const FamilySnapshot& family : families) append_family(out, family, common);
  return out;
}

}  // namespace hp::metrics
