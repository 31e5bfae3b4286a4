#pragma once
// The Prometheus text exposition format, version 0.0.4: what `GET /metrics`
// returns and what `promtool check metrics` reads, written by
// prometheus-cpp's TextSerializer.
#include <string>

namespace hp::metrics {

class Registry;

/// The Content-Type of to_prometheus_text()'s output.
inline constexpr const char* kPrometheusTextContentType =
    "text/plain; version=0.0.4; charset=utf-8";

/// Every family of `registry` as Registry::collect() orders it: `# HELP` and
/// `# TYPE` lines, then its series in label order, each carrying the
/// registry's common labels first. A histogram's series are `_count`, `_sum`
/// and its `_bucket` lines with increasing `le`, ending with `+Inf`.
std::string to_prometheus_text(const Registry& registry);

}  // namespace hp::metrics
