// The exact text of the Prometheus exposition format for every metric type,
// as prometheus-cpp's TextSerializer writes our registry.
#include "framework/metrics/exposition.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "hp/metrics/registry.h"

namespace hp::metrics {
namespace {

TEST(Exposition, EmptyRegistryRendersNothing) {
  Registry registry;
  EXPECT_EQ(to_prometheus_text(registry), "");
}

TEST(Exposition, Counter) {
  Registry registry;
  Counter& steps = registry.counter("steps_total", "Optimizer steps done.");
  steps.inc();
  steps.inc(2);
  EXPECT_EQ(to_prometheus_text(registry),
            "# HELP steps_total Optimizer steps done.\n"
            "# TYPE steps_total counter\n"
            "steps_total 3\n");
}

TEST(Exposition, GaugeEscapesLabelValuesAndHelp) {
  Registry registry;
  const std::string help = std::string(R"(Loss, "mean" over C:\ranks)") + "\nof the step.";
  registry.gauge("loss", help, {{"split", "say \"hi\"\\now\nbye"}}).set(2.5);
  registry.gauge("loss", help, {{"split", "eval"}}).set(-0.125);
  // Help escapes backslash and newline only; label values also escape '"'.
  EXPECT_EQ(to_prometheus_text(registry),
            R"(# HELP loss Loss, "mean" over C:\\ranks\nof the step.
# TYPE loss gauge
loss{split="eval"} -0.125
loss{split="say \"hi\"\\now\nbye"} 2.5
)");
}

TEST(Exposition, HistogramSeriesInOrder) {
  Registry registry;
  const std::vector<double> buckets = {0.5, 1, 10};
  Histogram& train = registry.histogram("step_time_seconds", "Wall time of one step.", buckets,
                                        {{"phase", "train"}});
  for (double v : {0.25, 0.5, 3.0, 100.0}) train.observe(v);
  registry.histogram("step_time_seconds", "Wall time of one step.", buckets, {{"phase", "eval"}})
      .observe(2);
  EXPECT_EQ(to_prometheus_text(registry),
            R"(# HELP step_time_seconds Wall time of one step.
# TYPE step_time_seconds histogram
step_time_seconds_count{phase="eval"} 1
step_time_seconds_sum{phase="eval"} 2
step_time_seconds_bucket{phase="eval",le="0.5"} 0
step_time_seconds_bucket{phase="eval",le="1"} 0
step_time_seconds_bucket{phase="eval",le="10"} 1
step_time_seconds_bucket{phase="eval",le="+Inf"} 1
step_time_seconds_count{phase="train"} 4
step_time_seconds_sum{phase="train"} 103.75
step_time_seconds_bucket{phase="train",le="0.5"} 2
step_time_seconds_bucket{phase="train",le="1"} 2
step_time_seconds_bucket{phase="train",le="10"} 3
step_time_seconds_bucket{phase="train",le="+Inf"} 4
)");
}

TEST(Exposition, FamiliesInNameOrderOneBlockEach) {
  Registry registry;
  registry.gauge("zeta", "Last.").set(1);
  registry.counter("alpha_total", "First.", {{"k", "b"}}).inc();
  registry.gauge("middle_bytes", "Between.").set(4096);
  registry.counter("alpha_total", "First.", {{"k", "a"}}).inc(2);
  EXPECT_EQ(to_prometheus_text(registry),
            "# HELP alpha_total First.\n"
            "# TYPE alpha_total counter\n"
            "alpha_total{k=\"a\"} 2\n"
            "alpha_total{k=\"b\"} 1\n"
            "# HELP middle_bytes Between.\n"
            "# TYPE middle_bytes gauge\n"
            "middle_bytes 4096\n"
            "# HELP zeta Last.\n"
            "# TYPE zeta gauge\n"
            "zeta 1\n");
}

TEST(Exposition, CommonLabelsOnEverySeries) {
  Registry registry;
  registry.set_common_labels({{"rank", "3"}, {"node", "n1"}});
  registry.counter("steps_total", "Steps.");
  registry.gauge("loss", "Loss.", {{"split", "train"}}).set(1);
  registry.histogram("step_time_seconds", "Step time.", {1}).observe(0.5);
  const std::string text = to_prometheus_text(registry);
  EXPECT_EQ(text,
            R"(# HELP loss Loss.
# TYPE loss gauge
loss{node="n1",rank="3",split="train"} 1
# HELP step_time_seconds Step time.
# TYPE step_time_seconds histogram
step_time_seconds_count{node="n1",rank="3"} 1
step_time_seconds_sum{node="n1",rank="3"} 0.5
step_time_seconds_bucket{node="n1",rank="3",le="1"} 1
step_time_seconds_bucket{node="n1",rank="3",le="+Inf"} 1
# HELP steps_total Steps.
# TYPE steps_total counter
steps_total{node="n1",rank="3"} 0
)");
  std::istringstream lines(text);
  int samples = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind('#', 0) == 0) continue;
    ++samples;
    EXPECT_NE(line.find("{node=\"n1\",rank=\"3\""), std::string::npos) << line;
  }
  EXPECT_EQ(samples, 6);
}

TEST(Exposition, SpecialValues) {
  Registry registry;
  registry.gauge("grad_norm", "Gradient norm.", {{"kind", "nan"}})
      .set(std::numeric_limits<double>::quiet_NaN());
  registry.gauge("grad_norm", "Gradient norm.", {{"kind", "pos"}})
      .set(std::numeric_limits<double>::infinity());
  registry.gauge("grad_norm", "Gradient norm.", {{"kind", "neg"}})
      .set(-std::numeric_limits<double>::infinity());
  // prometheus-cpp spells NaN "Nan"; Prometheus reads it case-insensitively
  // (promtool_test checks a NaN series).
  EXPECT_EQ(to_prometheus_text(registry),
            "# HELP grad_norm Gradient norm.\n"
            "# TYPE grad_norm gauge\n"
            "grad_norm{kind=\"nan\"} Nan\n"
            "grad_norm{kind=\"neg\"} -Inf\n"
            "grad_norm{kind=\"pos\"} +Inf\n");
}

// Sample values as the library writes them (classic locale, 16 significant
// digits): integers in plain digits, the rest in the shortest %g form.
TEST(Exposition, NumberFormat) {
  const std::vector<std::pair<double, std::string>> cases = {
      {0, "0"},           {3, "3"},           {-7, "-7"},
      {1e6, "1000000"},   {123456789012.0, "123456789012"},
      {0.1, "0.1"},       {1.5, "1.5"},       {123456789.5, "123456789.5"},
      {1e20, "1e+20"},    {1e-7, "1e-07"},    {1.0 / 3.0, "0.3333333333333333"}};
  Registry registry;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    registry.gauge("value", "A value.", {{"i", std::to_string(100 + i)}}).set(cases[i].first);
  }
  const std::string text = to_prometheus_text(registry);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string line =
        "value{i=\"" + std::to_string(100 + i) + "\"} " + cases[i].second + "\n";
    EXPECT_NE(text.find(line), std::string::npos) << line << "not in\n" << text;
  }
  EXPECT_EQ(std::stod(cases.back().second), 1.0 / 3.0);
}

TEST(Exposition, ContentType) {
  EXPECT_STREQ(kPrometheusTextContentType, "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace
}  // namespace hp::metrics
