#include "checkpoint/file_names.h"

#include <cstdio>
#include <filesystem>

namespace hp::ckpt {
namespace {

constexpr const char* kPartPrefix = "shards-rank";
constexpr const char* kPartSuffix = ".json";

/// "<kind>-rank00003<suffix>"
std::string rank_file(const char* kind, int rank, const char* suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-rank%05d%s", kind, rank, suffix);
  return buf;
}

}  // namespace

std::string step_dir_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string staging_dir(const std::string& root, std::int64_t step) {
  return (std::filesystem::path(root) / (step_dir_name(step) + ".tmp")).string();
}

std::string model_file_name(int rank) { return rank_file("model", rank, ".safetensors"); }
std::string optim_file_name(int rank) { return rank_file("optim", rank, ".safetensors"); }
bool is_optimizer_file(const std::string& file_name) { return file_name.rfind("optim", 0) == 0; }
std::string part_file_name(int rank) { return rank_file("shards", rank, kPartSuffix); }
std::string failed_file_name(int rank) { return rank_file("failed", rank, ".txt"); }

int part_file_rank(const std::string& name) {
  const std::string prefix = kPartPrefix;
  const std::string suffix = kPartSuffix;
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return -1;
  }
  const auto digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  return std::stoi(digits);
}

}  // namespace hp::ckpt
