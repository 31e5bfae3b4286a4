#pragma once
// Naming rules for metrics and labels: Prometheus' syntax plus the
// conventions `promtool check metrics` lints for (snake_case, counters end in
// `_total`, base units spelled out). A name that breaks one is a user mistake:
// each check throws std::invalid_argument naming the name, the rule and a fix.
#include <string>

#include "hp/metrics/metric_types.h"

namespace hp::metrics {

/// Metric names match `[a-z_][a-z0-9_]*` (Prometheus allows upper case and
/// ':'; we refuse both: snake_case is the convention and colons are reserved
/// for recording rules). Counters end in `_total` and nothing else does; no
/// name ends in `_bucket`, `_count` or `_sum` (a histogram's own series) or
/// contains its type as a word; units are base units spelled out
/// (`_seconds`, `_bytes`, not `_ms`, `_milliseconds`, `_kb`).
void check_metric_name(const std::string& name, MetricType type);

/// Label names match `[a-z_][a-z0-9_]*` and do not start with `__` (reserved
/// for Prometheus itself). `owner` says where the label is used, for the
/// message: "metric 'loss'" or "the common labels".
void check_label_name(const std::string& label, const std::string& owner);

/// Label values may be any text, but it must be valid UTF-8.
void check_label_value(const std::string& value, const std::string& label,
                       const std::string& owner);

/// Help text is required (promtool lints its absence) and must be UTF-8.
void check_help(const std::string& help, const std::string& metric);

}  // namespace hp::metrics
