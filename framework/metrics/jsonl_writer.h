#pragma once
// Appends metrics as JSON lines (one object per step) for plotting: easy to
// read from pandas or jq, safe to tail while training runs.
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

namespace hp::metrics {

/// Each write() appends one line `{"step":12,"loss":2.31,...,"time":1718000000.123}`
/// and flushes it, so a crash loses at most the line being written. The
/// file is opened for appending: a resumed run continues the same file.
class JsonlWriter {
 public:
  /// Creates the parent directories of `path` and opens it; throws
  /// std::runtime_error naming the path and the cause when either fails.
  explicit JsonlWriter(const std::string& path);
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;

  /// Writes `step` (an integer), then `fields` in key order, then `time`
  /// (seconds since the Unix epoch). NaN and infinities, which JSON cannot
  /// express, are written as null. `step` and `time` are not legal field
  /// names (std::invalid_argument). Throws std::runtime_error when the
  /// line cannot be written (disk full). Thread-safe.
  void write(const std::map<std::string, double>& fields, std::int64_t step,
             const std::map<std::string, std::string>& texts = {});

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::mutex mutex_;
  std::FILE* file_ = nullptr;
};

}  // namespace hp::metrics
