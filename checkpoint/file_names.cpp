#include "hp/checkpoint/file_names.h"

#include <cstdio>
#include <filesystem>

#include "backends/comm/rank_files.h"

namespace hp::ckpt {
namespace {

constexpr const char* kPartStem = "shards-";
constexpr const char* kPartSuffix = ".json";

/// "<kind>-rank00003<suffix>"
std::string rank_file(const char* kind, int rank, const char* suffix) {
  return dist::rank_file_name(std::string(kind) + "-", rank, suffix);
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

int part_file_rank(const std::string& name) { return dist::rank_of_file_name(name, kPartStem, kPartSuffix); }

}  // namespace hp::ckpt
