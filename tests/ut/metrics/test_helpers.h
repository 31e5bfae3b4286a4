#pragma once
// Small helpers shared by the metrics tests.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace hp::metrics::test {

/// The message of the `Exception` `fn` throws, or a marker when it throws
/// nothing (so a missing error shows up in the failure as text).
template <typename Exception, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Exception& e) {
    return e.what();
  }
  return "<no exception>";
}

/// A fresh directory named after the running test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("hp_metrics_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace hp::metrics::test
