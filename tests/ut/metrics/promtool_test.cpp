// Prometheus' own checker reads our exposition: it must parse it and find
// nothing to lint. promtool comes with the Debian package `prometheus`.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "framework/metrics/exposition.h"
#include "hp/metrics/registry.h"
#include "tests/ut/metrics/test_helpers.h"

namespace hp::metrics {
namespace {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

CommandResult run(const std::string& command) {
  CommandResult result;
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

bool promtool_on_path() { return run("command -v promtool").exit_code == 0; }

constexpr const char* kInstallHint =
    "promtool is not on PATH: install the Debian package 'prometheus' "
    "(sudo apt-get install -y prometheus), which ships it";

CommandResult check_metrics(const test::TempDir& dir, const std::string& text) {
  const std::string file = (dir.path() / "metrics.txt").string();
  std::ofstream(file) << text;
  return run("promtool check metrics < '" + file + "'");
}

TEST(Promtool, AcceptsEveryMetricTypeWithoutLintProblems) {
  ASSERT_TRUE(promtool_on_path()) << kInstallHint;
  Registry registry;
  registry.set_common_labels({{"rank", "3"}, {"local_rank", "1"}});
  registry.counter("train_steps_total", "Optimizer steps done.").inc(12);
  registry.counter("train_tokens_total", "Tokens consumed.", {{"split", "train"}}).inc(4096);
  registry.counter("train_tokens_total", "Tokens consumed.", {{"split", "eval"}}).inc(512);
  registry.gauge("train_loss", "Mean loss of the last step.", {{"split", "we \"quote\"\\ \nit"}})
      .set(2.75);
  registry.gauge("train_grad_norm", "Gradient norm; NaN when it overflowed.").set(std::nan(""));
  registry.gauge("memory_allocated_bytes", "Memory in use.\nSecond \\ line.").set(1.5e9);
  Histogram& step = registry.histogram("train_step_seconds", "Wall time of one step.",
                                       exponential_buckets(0.001, 10, 5), {{"phase", "fwd"}});
  for (double v : {0.0005, 0.02, 0.3, 4.0, 50.0}) step.observe(v);
  registry.histogram("train_step_seconds", "Wall time of one step.",
                     exponential_buckets(0.001, 10, 5), {{"phase", "bwd"}});

  test::TempDir dir;
  const CommandResult result = check_metrics(dir, to_prometheus_text(registry));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, "") << "promtool found problems:\n" << result.output;
}

// The check above is only worth something if promtool does complain about
// what it lints; this pins that down with a hand-written bad exposition.
TEST(Promtool, ReportsLintProblems) {
  ASSERT_TRUE(promtool_on_path()) << kInstallHint;
  test::TempDir dir;
  const CommandResult result = check_metrics(dir,
                                             "# HELP steps Steps.\n"
                                             "# TYPE steps counter\n"
                                             "steps 1\n");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("_total"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace hp::metrics
