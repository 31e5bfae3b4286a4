#pragma once
// The Prometheus text exposition format, version 0.0.4: what `GET /metrics`
// returns and what `promtool check metrics` reads.
#include <string>

namespace hp::metrics {

class Registry;

/// The Content-Type of to_prometheus_text()'s output.
inline constexpr const char* kPrometheusTextContentType =
    "text/plain; version=0.0.4; charset=utf-8";

/// Every family of `registry` in name order: `# HELP` and `# TYPE` lines,
/// then its series in label order, each carrying the registry's common
/// labels first. A histogram's series are its `_bucket` lines with
/// increasing `le` (ending with `+Inf`), then `_sum`, then `_count`.
std::string to_prometheus_text(const Registry& registry);

/// A sample value as the format writes it: integers up to 2^53 in plain
/// digits ("1000000"), other numbers in the shortest form that reads back
/// exactly ("0.1", "1e+300"), and "NaN", "+Inf", "-Inf". Independent of the
/// C locale.
std::string format_number(double value);

}  // namespace hp::metrics
