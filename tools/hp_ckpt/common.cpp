#include <c10/core/ScalarType.h>

#include <filesystem>

#include "checkpoint/error.h"
#include "hp/checkpoint/file_names.h"
#include "checkpoint/reader.h"
#include "tools/hp_ckpt/hp_ckpt.h"

namespace hp::ckpt_tool {

namespace fs = std::filesystem;

std::string resolve_step_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::is_regular_file(fs::path(dir) / ckpt::kManifestFileName, ec)) {
    return dir;
  }
  if (!fs::is_directory(dir, ec)) {
    throw UsageError(dir +
                     " is not a directory: give a checkpoint step directory (holding "
                     "manifest.json) or a checkpoint root (holding 'latest')");
  }
  const std::string step_dir = ckpt::CheckpointReader::latest(dir);
  if (step_dir.empty()) {
    throw ckpt::CheckpointError(dir +
                                " holds neither manifest.json (a step directory) nor "
                                "'latest' (a checkpoint root): nothing to read");
  }
  if (!fs::is_regular_file(fs::path(step_dir) / ckpt::kManifestFileName, ec)) {
    throw ckpt::CheckpointError((fs::path(step_dir) / ckpt::kManifestFileName).string() +
                                " is missing: the step directory 'latest' names is damaged");
  }
  return step_dir;
}

bool is_optimizer_state(const ckpt::TensorRecord& tensor) {
  if (tensor.shards.empty()) {
    return false;
  }
  for (const auto& s : tensor.shards) {
    if (!ckpt::is_optimizer_file(s.file)) {
      return false;
    }
  }
  return true;
}

std::uint64_t tensor_bytes(const ckpt::TensorRecord& tensor) {
  std::uint64_t n = c10::elementSize(tensor.dtype);
  for (const auto d : tensor.global_shape) {
    n *= static_cast<std::uint64_t>(d);
  }
  return n;
}

std::string one_line(std::string text) {
  for (auto& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  constexpr std::size_t kMax = 600;
  if (text.size() > kMax) text = text.substr(0, kMax) + "...";
  return text;
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (const auto& p : parts) {
    out += (out.empty() ? "" : sep) + p;
  }
  return out;
}

std::string format_layout(const ckpt::Layout& layout) {
  std::string out;
  for (const auto& [axis, degree] : layout) {
    out += (out.empty() ? "" : " ") + axis + "=" + std::to_string(degree);
  }
  return out.empty() ? "(none recorded)" : out;
}

void require_fresh_output(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return;
  }
  if (!fs::is_directory(path, ec) || !fs::is_empty(path, ec)) {
    throw UsageError("--to " + path + " already exists and is not an empty directory; " + what +
                     " writes a new directory: choose another --to or remove it");
  }
}

}  // namespace hp::ckpt_tool
