#pragma once
// Config problems are user mistakes: each one names the key path, the value
// given, the rule it broke and the legal values, and all of them are reported
// at once before any process group exists (exit code 2).
#include <stdexcept>
#include <string>
#include <vector>

namespace hp {

/// Exit code of every tool when the configuration is refused.
constexpr int kConfigErrorExitCode = 2;

struct ConfigIssue {
  std::string path;   ///< "training.micro_batch_size", or "features.foo" ...
  std::string value;  ///< the offending value as the user wrote it ("" if none)
  std::string rule;   ///< what is wrong, as a sentence fragment
  std::string legal;  ///< legal values / how to fix; may be empty

  std::string format() const;
};

/// Collects every problem found during validation.
class ConfigErrors {
 public:
  void add(std::string path, std::string value, std::string rule, std::string legal = "");
  bool empty() const { return issues_.empty(); }
  std::size_t size() const { return issues_.size(); }
  const std::vector<ConfigIssue>& issues() const { return issues_; }
  /// One line per issue.
  std::string format() const;
  /// Throws ConfigException when any issue was collected.
  void throw_if_any() const;

 private:
  std::vector<ConfigIssue> issues_;
};

/// Thrown when a configuration is refused; `what()` holds every line.
class ConfigException : public std::runtime_error {
 public:
  explicit ConfigException(const ConfigErrors& errors);
  ConfigException(std::string path, std::string value, std::string rule, std::string legal = "");
  const std::vector<ConfigIssue>& issues() const { return issues_; }

 private:
  std::vector<ConfigIssue> issues_;
};

}  // namespace hp
