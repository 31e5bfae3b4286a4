// The series the trainer exports (TrainingMetrics), read back through
// prometheus-cpp: Registry::collect() gives the library's MetricFamily list
// and TextSerializer writes /metrics. Per-stage figures are a `stage`
// label, communication a `group` and `op` label, every series has `rank`.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "hp/comm/context.h"
#include "hp/comm/group.h"
#include "hp/config/config.h"
#include "framework/metrics/exposition.h"
#include "hp/metrics/registry.h"
#include "framework/runtime/setup.h"
#include "framework/trainer/throughput.h"
#include "hp/trainer/training_metrics.h"
#include "tests/support/multi_rank.h"
#include "tests/ut/metrics/test_helpers.h"

namespace hp {
namespace {

Config quiet_config() {
  return prepare(RawConfig::parse_string("data: {type: synthetic}\nmetrics: {jsonl: false}\n", "series"), 1)
      .config;
}

const prometheus::MetricFamily* find(const std::vector<prometheus::MetricFamily>& families,
                                     const std::string& name) {
  for (const auto& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// "{rank=0,stage=1}" for a series, in the order the serializer writes them.
std::string labels_of(const prometheus::ClientMetric& m) {
  std::string out = "{";
  for (std::size_t i = 0; i < m.label.size(); ++i) {
    out += (i ? "," : "") + m.label[i].name + "=" + m.label[i].value;
  }
  return out + "}";
}

// One training step's worth of figures as a 2-stage pipeline reports them.
std::map<std::string, double> pipeline_figures() {
  return {{"pipeline_idle_fraction", 0.25},          {"pipeline_idle_fraction_stage0", 0.25},
          {"pipeline_idle_fraction_stage1", 0.5},    {"pipeline_peak_in_flight", 2},
          {"pipeline_peak_in_flight_stage0", 2},     {"pipeline_peak_in_flight_stage1", 1},
          {"pipeline_wait_seconds", 0.125},          {"aux_loss_load_balance", 0.75}};
}

void train_one_step(TrainingMetrics& m, dist::DistributedContext* d) {
  StepFigures f;
  f.step = 7;
  f.loss = 2.5;
  f.lr = 0.001;
  f.grad_norm = 1.5;
  f.tokens_per_second = 1000;
  f.step_seconds = 0.3;
  f.tokens = 512;
  f.samples = 4;
  m.on_step(f, d);
  m.on_figures(pipeline_figures());
  m.on_checkpoint("save", 0.5);
  m.on_eval(7, 2.75);
}

TEST(TrainerSeries, StageFiguresAreLabels) {
  TrainingMetrics m(quiet_config(), 3, 1, false);
  train_one_step(m, nullptr);
  // A second step with the same figures: same families, no clash.
  m.on_figures(pipeline_figures());
  const auto families = m.registry().collect();

  for (const auto& f : families) {
    EXPECT_EQ(f.name.find("_stage"), std::string::npos) << "stage index in a metric name: " << f.name;
    for (const auto& series : f.metric) {
      ASSERT_FALSE(series.label.empty()) << f.name;
      EXPECT_EQ(series.label[0].name, "rank") << f.name;
      EXPECT_EQ(series.label[0].value, "3") << f.name;
    }
  }
  const auto* idle = find(families, "hp_pipeline_idle_fraction");
  ASSERT_NE(idle, nullptr);
  EXPECT_EQ(idle->type, prometheus::MetricType::Gauge);
  ASSERT_EQ(idle->metric.size(), 2u);
  EXPECT_EQ(labels_of(idle->metric[0]), "{rank=3,stage=0}");
  EXPECT_EQ(idle->metric[0].gauge.value, 0.25);
  EXPECT_EQ(labels_of(idle->metric[1]), "{rank=3,stage=1}");
  EXPECT_EQ(idle->metric[1].gauge.value, 0.5);
  const auto* peak = find(families, "hp_pipeline_peak_in_flight");
  ASSERT_NE(peak, nullptr);
  ASSERT_EQ(peak->metric.size(), 2u);
  EXPECT_EQ(peak->metric[1].gauge.value, 1);
  // A figure without per-stage copies stays one series of the rank.
  const auto* wait = find(families, "hp_pipeline_wait_seconds");
  ASSERT_NE(wait, nullptr);
  ASSERT_EQ(wait->metric.size(), 1u);
  EXPECT_EQ(labels_of(wait->metric[0]), "{rank=3}");
  EXPECT_EQ(wait->metric[0].gauge.value, 0.125);

  const auto* loss = find(families, "hp_loss");
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ(loss->metric.at(0).gauge.value, 2.5);
  const auto* tokens = find(families, "hp_tokens_total");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->type, prometheus::MetricType::Counter);
  EXPECT_EQ(tokens->metric.at(0).counter.value, 512);
  const auto* step_time = find(families, "hp_step_duration_seconds");
  ASSERT_NE(step_time, nullptr);
  EXPECT_EQ(step_time->type, prometheus::MetricType::Histogram);
  EXPECT_EQ(step_time->metric.at(0).histogram.sample_count, 1u);
  EXPECT_EQ(step_time->metric.at(0).histogram.bucket.size(), 15u);  // 14 bounds and +Inf
  EXPECT_EQ(find(families, "hp_eval_loss")->metric.at(0).gauge.value, 2.75);
  EXPECT_EQ(find(families, "hp_checkpoint_save_seconds")->metric.at(0).gauge.value, 0.5);

  // The library's serializer writes what /metrics serves.
  std::ostringstream serialized;
  prometheus::TextSerializer().Serialize(serialized, families);
  const std::string text = serialized.str();
  EXPECT_EQ(text, metrics::to_prometheus_text(m.registry()));
  for (const char* line : {"hp_pipeline_idle_fraction{rank=\"3\",stage=\"0\"} 0.25\n",
                           "hp_pipeline_idle_fraction{rank=\"3\",stage=\"1\"} 0.5\n",
                           "hp_pipeline_peak_in_flight{rank=\"3\",stage=\"1\"} 1\n",
                           "hp_pipeline_wait_seconds{rank=\"3\"} 0.125\n",
                           "hp_aux_loss_load_balance{rank=\"3\"} 0.75\n",
                           "hp_loss{rank=\"3\"} 2.5\n",
                           "hp_tokens_total{rank=\"3\"} 512\n",
                           "hp_step_duration_seconds_count{rank=\"3\"} 1\n",
                           "hp_step_duration_seconds_bucket{rank=\"3\",le=\"0.32\"} 1\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << "missing " << line << "in\n" << text;
  }
  EXPECT_EQ(text.find("hp_pipeline_idle_fraction{rank=\"3\"}"), std::string::npos) << text;
}

// Communication on two ranks: hp_comm_*_total{rank, group, op}, counted
// from the group's own statistics.
TEST(TrainerSeries, CommunicationPerGroupAndOperation) {
  std::mutex mutex;
  std::map<int, std::string> texts;
  test::run_ranks(2, [&](dist::DistributedContext& d) {
    TrainingMetrics m(quiet_config(), d.rank(), d.rank(), false);
    at::Tensor t = at::ones({256}, at::kFloat);
    d.group("dp").all_reduce(t);
    train_one_step(m, &d);
    std::lock_guard<std::mutex> lock(mutex);
    texts[d.rank()] = metrics::to_prometheus_text(m.registry());
  });
  for (int rank : {0, 1}) {
    const std::string& text = texts.at(rank);
    const std::string prefix =
        "hp_comm_bytes_total{rank=\"" + std::to_string(rank) + "\",group=\"dp\",op=\"all_reduce\"} ";
    const auto at = text.find(prefix);
    ASSERT_NE(at, std::string::npos) << text;
    EXPECT_GE(std::stod(text.substr(at + prefix.size())), 1024) << "256 floats at least once";
    EXPECT_NE(text.find("hp_comm_seconds_total{rank=\"" + std::to_string(rank) +
                        "\",group=\"dp\",op=\"all_reduce\"} "),
              std::string::npos)
        << text;
  }
}

// promtool, which a real Prometheus' rules follow, finds nothing to lint in
// the trainer's series.
// Model FLOP/s and MFU of a step: FLOPs per token x tokens / seconds, over
// the peak per rank x world size; exported with the rank label.
TEST(TrainerSeries, ModelFlopsAndMfu) {
  TrainingMetrics m(quiet_config(), 1, 0, false);
  Throughput t(1e6, 1e9, 2, &m.registry());
  EXPECT_DOUBLE_EQ(t.flops_per_second(1000, 2.0), 5e8);
  EXPECT_DOUBLE_EQ(t.mfu(5e8), 0.25);
  EXPECT_EQ(t.flops_per_second(1000, 0.0), 0.0);
  t.on_step(1000, 2.0);
  const auto families = m.registry().collect();
  const std::map<std::string, double> expected{
      {"hp_model_flops_per_second", 5e8}, {"hp_mfu", 0.25}, {"hp_peak_flops", 1e9}};
  for (const auto& [name, value] : expected) {
    const auto* f = find(families, name);
    ASSERT_NE(f, nullptr) << name;
    ASSERT_EQ(f->metric.size(), 1u) << name;
    EXPECT_EQ(f->type, prometheus::MetricType::Gauge) << name;
    EXPECT_EQ(labels_of(f->metric[0]), "{rank=1}") << name;
    EXPECT_DOUBLE_EQ(f->metric[0].gauge.value, value) << name;
  }
}

// The probe measures something plausible and stays within its budget.
TEST(TrainerSeries, MatmulProbeIsShort) {
  const auto t0 = std::chrono::steady_clock::now();
  const double flops = measure_matmul_flops(0.1);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(flops, 1e8);
  EXPECT_LT(flops, 1e13);
  EXPECT_LT(seconds, 2.0);
}

TEST(TrainerSeries, PromtoolClean) {
  if (std::system("command -v promtool > /dev/null 2>&1") != 0) {
    GTEST_FAIL() << "promtool is not on PATH: install the Debian package 'prometheus'";
  }
  TrainingMetrics m(quiet_config(), 0, 0, false);
  train_one_step(m, nullptr);
  metrics::test::TempDir dir;
  const std::string file = (dir.path() / "metrics.txt").string();
  std::ofstream(file) << metrics::to_prometheus_text(m.registry());
  std::FILE* pipe = ::popen(("promtool check metrics < '" + file + "' 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
  EXPECT_EQ(::pclose(pipe), 0) << output;
  EXPECT_EQ(output, "") << output;
}

}  // namespace
}  // namespace hp
