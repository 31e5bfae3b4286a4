// The registry: children per label set, refusals, common labels, threads.
#include "hp/metrics/registry.h"

#include <gtest/gtest.h>
#include <prometheus/metric_family.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "framework/metrics/exposition.h"
#include "tests/ut/metrics/test_helpers.h"

namespace hp::metrics {
namespace {

using test::error_of;

TEST(Registry, SameLabelsSameChild) {
  Registry registry;
  Counter& a = registry.counter("tokens_total", "Tokens seen.", {{"split", "train"}});
  Counter& b = registry.counter("tokens_total", "Tokens seen.", {{"split", "train"}});
  Counter& c = registry.counter("tokens_total", "Tokens seen.", {{"split", "eval"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &c);
  a.inc(5);
  b.inc();
  EXPECT_EQ(a.value(), 6);
  EXPECT_EQ(c.value(), 0);
  const auto families = registry.collect();
  ASSERT_EQ(families.size(), 1u);
  EXPECT_EQ(families[0].type, prometheus::MetricType::Counter);
  ASSERT_EQ(families[0].metric.size(), 2u);
  ASSERT_EQ(families[0].metric[0].label.size(), 1u);
  EXPECT_EQ(families[0].metric[0].label[0].name, "split");
  EXPECT_EQ(families[0].metric[0].label[0].value, "eval");
  EXPECT_EQ(families[0].metric[1].counter.value, 6);
}

TEST(Registry, GaugeGoesBothWays) {
  Registry registry;
  Gauge& lr = registry.gauge("learning_rate", "Current learning rate.");
  lr.set(0.5);
  lr.inc();
  lr.dec(0.25);
  lr.inc(2);
  EXPECT_EQ(lr.value(), 3.25);
  lr.dec();
  EXPECT_EQ(lr.value(), 2.25);
}

TEST(Registry, CounterOnlyGoesUp) {
  Registry registry;
  Counter& steps = registry.counter("steps_total", "Steps done.");
  EXPECT_EQ(error_of<std::invalid_argument>([&] { steps.inc(-1); }),
            "counter 'steps_total' can only go up, but inc(-1) was called; use a gauge for a "
            "value that can go down");
  EXPECT_THROW(steps.inc(std::nan("")), std::invalid_argument);
  steps.inc(0);
  EXPECT_EQ(steps.value(), 0);
}

TEST(Registry, TypeClashNamesTheMetric) {
  Registry registry;
  registry.gauge("loss", "Training loss.");
  EXPECT_EQ(error_of<std::invalid_argument>([&] {
              registry.histogram("loss", "Training loss.", {1, 2});
            }),
            "metric 'loss' is already registered as a gauge; it cannot also be a histogram (one "
            "name, one type)");
}

TEST(Registry, HelpClashNamesBothTexts) {
  Registry registry;
  registry.gauge("loss", "Training loss.");
  EXPECT_EQ(error_of<std::invalid_argument>([&] { registry.gauge("loss", "Eval loss."); }),
            "metric 'loss' is already registered with help 'Training loss.'; it was given 'Eval "
            "loss.' now (one name, one help text)");
}

TEST(Registry, LabelNamesFixedByFirstUse) {
  Registry registry;
  registry.gauge("loss", "Loss.", {{"split", "train"}});
  EXPECT_EQ(error_of<std::invalid_argument>([&] {
              registry.gauge("loss", "Loss.", {{"split", "eval"}, {"stage", "0"}});
            }),
            "metric 'loss' was first used with the labels {split}; it was given {split, stage} "
            "now (every series of a metric has the same label names)");
  EXPECT_THROW(registry.gauge("loss", "Loss."), std::invalid_argument);
}

TEST(Registry, HistogramBuckets) {
  Registry registry;
  const double inf = std::numeric_limits<double>::infinity();
  Histogram& h = registry.histogram("step_time_seconds", "Step time.", {0.1, 1, inf});
  EXPECT_EQ(h.bounds(), (std::vector<double>{0.1, 1}));
  // The same buckets with or without the explicit +Inf are the same family.
  EXPECT_EQ(&registry.histogram("step_time_seconds", "Step time.", {0.1, 1}), &h);
  for (double v : {0.1, 0.2, 1.0, 5.0}) h.observe(v);
  h.observe(std::nan(""));
  const Histogram::Snapshot snap = h.snapshot();
  EXPECT_EQ(snap.cumulative_counts, (std::vector<std::uint64_t>{1, 3, 5}));
  EXPECT_EQ(snap.count, 5u);
  EXPECT_TRUE(std::isnan(snap.sum));

  EXPECT_EQ(error_of<std::invalid_argument>([&] {
              registry.histogram("step_time_seconds", "Step time.", {0.1, 2});
            }),
            "histogram 'step_time_seconds' already has the buckets [0.1, 1]; it was given [0.1, "
            "2] now");
  EXPECT_EQ(error_of<std::invalid_argument>([&] {
              registry.histogram("read_seconds", "Read time.", {1, 0.5});
            }),
            "histogram 'read_seconds': bucket bounds must be strictly increasing, but 0.5 "
            "follows 1 in [1, 0.5]");
  EXPECT_EQ(error_of<std::invalid_argument>([&] {
              registry.histogram("read_seconds", "Read time.", {1, std::nan("")});
            }),
            "histogram 'read_seconds': bucket bound 1 is nan; bounds must be finite numbers "
            "(only a last +Inf is allowed)");
  EXPECT_EQ(error_of<std::invalid_argument>(
                [&] { registry.histogram("read_seconds", "Read time.", {}); }),
            "histogram 'read_seconds' needs at least one finite bucket bound (+Inf is implied); "
            "see exponential_buckets() and linear_buckets()");
  EXPECT_EQ(error_of<std::invalid_argument>([&] {
              registry.histogram("read_seconds", "Read time.", {1}, {{"le", "x"}});
            }),
            "label name 'le' of histogram 'read_seconds' is reserved: it holds each bucket's "
            "upper bound");
}

TEST(Registry, BucketHelpers) {
  EXPECT_EQ(exponential_buckets(0.001, 10, 4), (std::vector<double>{0.001, 0.01, 0.1, 1}));
  EXPECT_EQ(linear_buckets(1, 0.5, 3), (std::vector<double>{1, 1.5, 2}));
  EXPECT_EQ(error_of<std::invalid_argument>([] { exponential_buckets(0, 2, 3); }),
            "exponential_buckets(start=0, factor=2): start must be > 0 and factor > 1");
  EXPECT_EQ(error_of<std::invalid_argument>([] { linear_buckets(0, 1, 0); }),
            "linear_buckets: count is 0, it must be at least 1");
  EXPECT_EQ(error_of<std::invalid_argument>([] { linear_buckets(0, -1, 2); }),
            "linear_buckets(width=-1): width must be > 0");
}

TEST(Registry, CommonLabelsSetOnce) {
  Registry registry;
  registry.set_common_labels({{"rank", "3"}});
  EXPECT_EQ(registry.common_labels(), (Labels{{"rank", "3"}}));
  EXPECT_EQ(error_of<std::logic_error>([&] {
              registry.set_common_labels({{"rank", "4"}});
            }),
            "the common labels of the metrics registry are already set to {rank=\"3\"}; they "
            "can be set only once");
  EXPECT_EQ(error_of<std::invalid_argument>([&] {
              registry.gauge("loss", "Loss.", {{"rank", "0"}});
            }),
            "label 'rank' of metric 'loss' is also a common label of the registry "
            "{rank=\"3\"}; drop it from the metric");
}

TEST(Registry, CommonLabelsChecked) {
  {
    Registry registry;
    registry.gauge("loss", "Loss.", {{"rank", "0"}});
    EXPECT_EQ(error_of<std::invalid_argument>([&] {
                registry.set_common_labels({{"rank", "3"}});
              }),
              "common label 'rank' is already a label of metric 'loss'; rename one of them");
    // A refused call does not count as the one allowed call.
    EXPECT_NO_THROW(registry.set_common_labels({{"node", "a"}}));
  }
  Registry registry;
  EXPECT_EQ(error_of<std::invalid_argument>([&] {
              registry.set_common_labels({{"Rank", "3"}});
            }),
            "label name 'Rank' of the common labels is not snake_case (lower-case letters, "
            "digits and '_'); use 'rank'");
  EXPECT_EQ(error_of<std::invalid_argument>([&] {
              registry.set_common_labels({{"le", "3"}});
            }),
            "label name 'le' of the common labels is reserved: histograms use it for each "
            "bucket's upper bound");
  EXPECT_TRUE(registry.common_labels().empty());
}

// Trainer threads update (and create) children while another thread scrapes:
// every render is whole, the counter never goes back, nothing is lost.
TEST(Registry, ThreadSafetySmoke) {
  Registry registry;
  registry.set_common_labels({{"rank", "0"}});
  Counter& tokens = registry.counter("tokens_total", "Tokens seen.");
  Histogram& times = registry.histogram("step_time_seconds", "Step time.", {0.5, 1});
  constexpr int kThreads = 4;
  constexpr int kSteps = 100000;
  std::atomic<int> running{kThreads};
  std::vector<std::thread> writers;
  writers.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      Gauge& mine = registry.gauge("worker_progress", "Steps done by a worker.",
                                   {{"worker", std::to_string(t)}});
      for (int i = 0; i < kSteps; ++i) {
        tokens.inc();
        times.observe((i % 4) * 0.5);
        mine.set(i + 1);
      }
      --running;
    });
  }
  double last_seen = 0;
  int renders = 0;
  const std::string prefix = "tokens_total{rank=\"0\"} ";
  do {
    const std::string text = to_prometheus_text(registry);
    ++renders;
    const auto at = text.find(prefix);
    if (at == std::string::npos || text.back() != '\n') {
      ADD_FAILURE() << "incomplete render:\n" << text;
      break;  // still join the writers below
    }
    const double seen = std::stod(text.substr(at + prefix.size()));
    EXPECT_GE(seen, last_seen);
    last_seen = seen;
  } while (running.load() > 0);
  for (auto& w : writers) w.join();
  EXPECT_GT(renders, 0);

  EXPECT_EQ(tokens.value(), kThreads * kSteps);
  const Histogram::Snapshot snap = times.snapshot();
  EXPECT_EQ(snap.count, static_cast<std::uint64_t>(kThreads * kSteps));
  EXPECT_EQ(snap.cumulative_counts.back(), snap.count);
  EXPECT_EQ(snap.sum, kThreads * kSteps * (0 + 0.5 + 1 + 1.5) / 4);
  const std::string text = to_prometheus_text(registry);
  EXPECT_NE(text.find("tokens_total{rank=\"0\"} 400000\n"), std::string::npos);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_NE(
        text.find("worker_progress{rank=\"0\",worker=\"" + std::to_string(t) + "\"} 100000\n"),
        std::string::npos)
        << text;
  }
}

}  // namespace
}  // namespace hp::metrics
