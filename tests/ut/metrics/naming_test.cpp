// Metric and label names: Prometheus' rules and our conventions, each
// refusal naming the bad name, the rule and a fix.
#include "framework/metrics/naming.h"

#include <gtest/gtest.h>
#include <prometheus/metric_family.h>

#include <stdexcept>
#include <string>

#include "hp/metrics/registry.h"
#include "tests/ut/metrics/test_helpers.h"

namespace hp::metrics {
namespace {

using test::error_of;

std::string metric_error(const std::string& name, MetricType type = MetricType::kGauge) {
  return error_of<std::invalid_argument>([&] { check_metric_name(name, type); });
}

std::string label_error(const std::string& label) {
  return error_of<std::invalid_argument>([&] { check_label_name(label, "metric 'loss'"); });
}

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

TEST(Naming, GoodNamesPass) {
  EXPECT_NO_THROW(check_metric_name("tokens_total", MetricType::kCounter));
  EXPECT_NO_THROW(check_metric_name("step_time_seconds", MetricType::kHistogram));
  EXPECT_NO_THROW(check_metric_name("memory_allocated_bytes", MetricType::kGauge));
  EXPECT_NO_THROW(check_metric_name("loss", MetricType::kGauge));
  EXPECT_NO_THROW(check_metric_name("_private2", MetricType::kGauge));
  EXPECT_NO_THROW(check_label_name("rank", "metric 'loss'"));
  EXPECT_NO_THROW(check_label_name("_x9", "metric 'loss'"));
}

TEST(Naming, BadCharacterNamesNameRuleAndFix) {
  EXPECT_EQ(metric_error("step-time"),
            "metric name 'step-time' is invalid: '-' at position 4 is not allowed (Prometheus "
            "metric names match [a-zA-Z_:][a-zA-Z0-9_:]*); use 'step_time'");
  EXPECT_TRUE(contains(metric_error("1st_loss"), "'1' at position 0 is not allowed"));
  EXPECT_TRUE(contains(metric_error("1st_loss"), "use '_1st_loss'"));
  EXPECT_TRUE(contains(metric_error("loss\n"), "byte 10 at position 4"));
  EXPECT_EQ(metric_error("", MetricType::kCounter), "a counter was given an empty name");
}

TEST(Naming, ColonsAreForRecordingRules) {
  EXPECT_EQ(metric_error("job:loss"),
            "metric name 'job:loss' contains ':', which Prometheus reserves for recording "
            "rules; use 'job_loss'");
}

TEST(Naming, SnakeCaseOnly) {
  EXPECT_EQ(metric_error("stepTime_seconds"),
            "metric name 'stepTime_seconds' is not snake_case (lower-case letters, digits and "
            "'_'); use 'step_time_seconds'");
}

TEST(Naming, CountersAndOnlyCountersEndInTotal) {
  EXPECT_EQ(metric_error("tokens", MetricType::kCounter),
            "counter 'tokens' must end in '_total' (the Prometheus convention for counters); "
            "use 'tokens_total'");
  EXPECT_EQ(metric_error("loss_total", MetricType::kGauge),
            "gauge 'loss_total' must not end in '_total': only counters do; drop the suffix or "
            "make it a counter");
  EXPECT_TRUE(contains(metric_error("step_time_total", MetricType::kHistogram),
                       "histogram 'step_time_total' must not end in '_total'"));
}

TEST(Naming, HistogramSuffixesAreReserved) {
  EXPECT_EQ(metric_error("gpu_count"),
            "gauge 'gpu_count' must not end in '_count': a histogram's own series end in "
            "_bucket, _count and _sum; choose another name");
  EXPECT_TRUE(contains(metric_error("latency_bucket", MetricType::kHistogram), "'_bucket'"));
  EXPECT_TRUE(contains(metric_error("loss_sum"), "'_sum'"));
}

TEST(Naming, TypeWordIsRedundant) {
  EXPECT_EQ(metric_error("loss_gauge"),
            "gauge 'loss_gauge' contains the type word 'gauge': the # TYPE line already says "
            "what it is; drop it from the name");
  EXPECT_TRUE(contains(metric_error("steps_counter_total", MetricType::kCounter), "'counter'"));
}

TEST(Naming, BaseUnitsSpelledOut) {
  EXPECT_EQ(metric_error("step_time_ms"),
            "gauge 'step_time_ms' uses the unit 'ms': Prometheus names use base units spelled "
            "out; use '_seconds' and convert the value");
  EXPECT_TRUE(contains(metric_error("step_time_milliseconds"), "unit 'milliseconds'"));
  EXPECT_TRUE(contains(metric_error("step_time_milliseconds"), "use '_seconds'"));
  EXPECT_TRUE(contains(metric_error("uptime_minutes"), "use '_seconds'"));
  EXPECT_TRUE(contains(metric_error("memory_kb"), "use '_bytes'"));
  EXPECT_TRUE(contains(metric_error("memory_gibibytes"), "use '_bytes'"));
}

TEST(Naming, LabelNames) {
  EXPECT_EQ(label_error("data-rank"),
            "label name 'data-rank' of metric 'loss' is invalid: '-' at position 4 is not "
            "allowed (Prometheus label names match [a-zA-Z_][a-zA-Z0-9_]*); use 'data_rank'");
  EXPECT_TRUE(contains(label_error("a:b"), "':' at position 1 is not allowed"));
  EXPECT_EQ(label_error("__name__"),
            "label name '__name__' of metric 'loss' starts with '__', which Prometheus reserves "
            "for its own labels; drop the leading underscores");
  EXPECT_EQ(label_error("dataRank"),
            "label name 'dataRank' of metric 'loss' is not snake_case (lower-case letters, "
            "digits and '_'); use 'data_rank'");
  EXPECT_EQ(label_error(""), "a label name of metric 'loss' is empty");
}

TEST(Naming, LabelValuesAndHelpMustBeUtf8) {
  EXPECT_NO_THROW(check_label_value("Zürich ✓ 𝄞", "site", "metric 'loss'"));
  EXPECT_EQ(error_of<std::invalid_argument>(
                [] { check_label_value("bad\xff", "site", "metric 'loss'"); }),
            "the value of label 'site' of metric 'loss' is not valid UTF-8, which the "
            "Prometheus text format requires");
  // Truncated sequence, overlong '/', UTF-16 surrogate.
  for (const char* bad : {"\xe2\x82", "\xc0\xaf", "\xed\xa0\x80"}) {
    EXPECT_THROW(check_label_value(bad, "site", "metric 'loss'"), std::invalid_argument) << bad;
  }
  EXPECT_EQ(error_of<std::invalid_argument>([] { check_help("", "loss"); }),
            "metric 'loss' has no help text; say what it measures and in which unit");
  EXPECT_TRUE(contains(error_of<std::invalid_argument>([] { check_help("\xff", "loss"); }),
                       "help text of metric 'loss' is not valid UTF-8"));
}

TEST(Naming, RegistryAppliesTheRules) {
  Registry registry;
  EXPECT_EQ(error_of<std::invalid_argument>([&] { registry.counter("tokens", "Tokens seen."); }),
            "counter 'tokens' must end in '_total' (the Prometheus convention for counters); "
            "use 'tokens_total'");
  EXPECT_TRUE(contains(error_of<std::invalid_argument>([&] {
                         registry.gauge("loss", "Loss.", {{"Split", "train"}});
                       }),
                       "label name 'Split' of metric 'loss' is not snake_case"));
  EXPECT_TRUE(contains(error_of<std::invalid_argument>([&] { registry.gauge("loss", ""); }),
                       "metric 'loss' has no help text"));
  EXPECT_TRUE(contains(error_of<std::invalid_argument>([&] {
                         registry.gauge("loss", "Loss.", {{"split", "\xff"}});
                       }),
                       "label 'split' of metric 'loss' is not valid UTF-8"));
  // Nothing refused was registered.
  EXPECT_TRUE(registry.collect().empty());
}

}  // namespace
}  // namespace hp::metrics
