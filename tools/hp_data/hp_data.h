#pragma once
// hp-data's subcommands (tools/hp_data/*.cpp).
#include <stdexcept>
#include <string>
#include <vector>

namespace hp::data_tool {

/// A usage mistake: exit code 2, one line.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::vector<std::string> inputs;
  std::string tokenizer = "bytes";
  std::string out;
  std::string text_field = "text";
  std::string split_on;
  double shard_mb = 64;
  int threads = 1;
  int stop_after_shards = 0;
};

int prepare(const Options& o);

/// The text files of paths (directories walked, sorted by name; symlinks,
/// fortune's .dat indexes and binary files skipped). Throws UsageError
/// naming a path that does not exist.
std::vector<std::string> text_files(const std::vector<std::string>& paths);

}  // namespace hp::data_tool
