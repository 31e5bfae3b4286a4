// JSON lines for plotting: one parseable object per write, appended.
#include "framework/metrics/jsonl_writer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/ut/metrics/test_helpers.h"

namespace hp::metrics {
namespace {

using test::error_of;

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(JsonlWriter, OneObjectPerLine) {
  test::TempDir dir;
  const std::string path = (dir.path() / "runs" / "rank0" / "metrics.jsonl").string();
  {
    JsonlWriter writer(path);
    EXPECT_EQ(writer.path(), path);
    writer.write({{"loss", 2.5}, {"lr", 0.001}}, 1);
    // Flushed per line: readable before the writer goes away.
    EXPECT_EQ(read_lines(path).size(), 1u);
    writer.write({{"loss", 2.25}, {"lr", 0.002}, {"tokens_per_second", 1234}}, 2);
  }
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 2u);
  const auto first = nlohmann::json::parse(lines[0]);
  const auto second = nlohmann::json::parse(lines[1]);
  EXPECT_TRUE(first.at("step").is_number_integer());
  EXPECT_EQ(first.at("step").get<long long>(), 1);
  EXPECT_EQ(first.at("loss").get<double>(), 2.5);
  EXPECT_EQ(first.at("lr").get<double>(), 0.001);
  EXPECT_TRUE(first.at("time").is_number());
  EXPECT_EQ(first.size(), 4u);
  EXPECT_EQ(second.at("step").get<long long>(), 2);
  EXPECT_EQ(second.at("tokens_per_second").get<double>(), 1234);
  EXPECT_GE(second.at("time").get<double>(), first.at("time").get<double>());
  // step first, then the fields in key order, then time.
  EXPECT_EQ(lines[0].rfind("{\"step\":1,\"loss\":2.5,\"lr\":0.001,\"time\":", 0), 0u) << lines[0];
}

TEST(JsonlWriter, AppendsToAnExistingFile) {
  test::TempDir dir;
  const std::string path = (dir.path() / "metrics.jsonl").string();
  JsonlWriter(path).write({{"loss", 3}}, 10);
  JsonlWriter(path).write({{"loss", 2}}, 11);
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines[1]).at("step").get<long long>(), 11);
}

TEST(JsonlWriter, NonFiniteValuesAreNull) {
  test::TempDir dir;
  const std::string path = (dir.path() / "metrics.jsonl").string();
  JsonlWriter(path).write(
      {{"grad_norm", std::nan("")}, {"scale", std::numeric_limits<double>::infinity()}}, 3);
  const auto line = nlohmann::json::parse(read_lines(path).at(0));
  EXPECT_TRUE(line.at("grad_norm").is_null());
  EXPECT_TRUE(line.at("scale").is_null());
}

TEST(JsonlWriter, ReservedKeysAreRefused) {
  test::TempDir dir;
  const std::string path = (dir.path() / "metrics.jsonl").string();
  JsonlWriter writer(path);
  EXPECT_EQ(error_of<std::invalid_argument>([&] {
              writer.write({{"step", 1}}, 1);
            }),
            "metrics field 'step' for " + path +
                " is reserved: every line carries its own 'step'; rename the field");
  EXPECT_THROW(writer.write({{"time", 1}}, 1), std::invalid_argument);
  EXPECT_TRUE(read_lines(path).empty());
}

TEST(JsonlWriter, UnopenablePathNamesPathAndCause) {
  test::TempDir dir;
  const std::string blocker = (dir.path() / "a_file").string();
  std::ofstream(blocker) << "x";
  const std::string path = blocker + "/metrics.jsonl";
  const std::string error = error_of<std::runtime_error>([&] { JsonlWriter writer(path); });
  EXPECT_NE(error.find("for the metrics file " + path), std::string::npos) << error;
  EXPECT_NE(error.find(blocker), std::string::npos) << error;
  const std::string in_dir = (dir.path()).string();
  EXPECT_EQ(error_of<std::runtime_error>([&] { JsonlWriter writer(in_dir); }),
            "cannot open the metrics file " + in_dir + " for appending: Is a directory");
}

}  // namespace
}  // namespace hp::metrics
