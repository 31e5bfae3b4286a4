#include "hp/checkpoint/writer.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hp/fault/fault.h"
#include "checkpoint/detail/fs.h"
#include "checkpoint/error.h"
#include "hp/checkpoint/file_names.h"
#include "checkpoint/safetensors.h"

namespace hp::ckpt {
namespace {

namespace fs = std::filesystem;
using detail::format_shape;

/// The step of a committed "step_<digits>" directory name, or -1.
std::int64_t committed_step(const std::string& name) {
  const std::string prefix = "step_";
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 18 ||
      name.rfind(prefix, 0) != 0 ||
      name.find_first_not_of("0123456789", prefix.size()) != std::string::npos) {
    return -1;
  }
  return std::stoll(name.substr(prefix.size()));
}

std::string fs_reason(const std::error_code& ec) { return ec.message(); }

/// "placed tp:S(0) dp:S(0)", "placed whole (no split)".
std::string describe_split(const dist::Placements& placements) {
  return placements.empty() ? "whole (no split)" : "placed " + dist::describe(placements);
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    throw CheckpointError("cannot rename " + from.string() + " to " + to.string() + ": " +
                          detail::errno_text(errno));
  }
}

/// Puts the staging directory in place of `final_dir`. An existing step
/// directory is exchanged atomically (renameat2 RENAME_EXCHANGE) so that the
/// name never disappears; file systems without it fall back to two renames.
void install_step_dir(const fs::path& root, const fs::path& staging, const fs::path& final_dir) {
  std::error_code ec;
  if (!fs::exists(final_dir, ec)) {
    rename_or_throw(staging, final_dir);
    detail::fsync_dir(root.string());
    return;
  }
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    detail::fsync_dir(root.string());
    // The old contents now sit in the staging name; a leftover is removed by
    // the next prepare() of this step.
    fs::remove_all(staging, ec);
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
    throw CheckpointError("cannot exchange " + staging.string() + " with " + final_dir.string() +
                          ": " + detail::errno_text(errno));
  }
  const fs::path old = final_dir.string() + ".old";
  fs::remove_all(old, ec);
  rename_or_throw(final_dir, old);
  rename_or_throw(staging, final_dir);
  detail::fsync_dir(root.string());
  fs::remove_all(old, ec);
}

void prune(const fs::path& root, std::int64_t committed, int keep) {
  std::vector<std::pair<std::int64_t, fs::path>> steps;
  std::error_code list_ec;
  for (const auto& entry : fs::directory_iterator(root, list_ec)) {
    const auto step = committed_step(entry.path().filename().string());
    if (step >= 0 && entry.is_directory()) {
      steps.emplace_back(step, entry.path());
    }
  }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a > b; });
  std::string failures;
  if (list_ec) {
    failures += " (cannot list " + root.string() + ": " + fs_reason(list_ec) + ")";
  }
  for (std::size_t i = static_cast<std::size_t>(keep); i < steps.size(); ++i) {
    if (steps[i].first == committed) {
      continue;
    }
    std::error_code ec;
    fs::remove_all(steps[i].second, ec);
    if (ec) {
      failures += " " + steps[i].second.string() + " (" + fs_reason(ec) + ")";
    }
  }
  if (!failures.empty()) {
    throw CheckpointError("step " + std::to_string(committed) + " was committed in " +
                          root.string() + ", but old checkpoints could not be deleted:" + failures);
  }
}

}  // namespace

std::string CheckpointWriter::step_dir_name(std::int64_t step) { return ckpt::step_dir_name(step); }

CheckpointWriter::CheckpointWriter(std::string root_dir, std::int64_t step, int rank)
    : root_(std::move(root_dir)), step_(step), rank_(rank) {
  if (step < 0 || rank < 0) {
    throw CheckpointError("cannot write a checkpoint in " + root_ + ": step (" +
                          std::to_string(step) + ") and rank (" + std::to_string(rank) +
                          ") must be non-negative");
  }
  staging_ = ckpt::staging_dir(root_, step);
  std::error_code ec;
  fs::create_directories(staging_, ec);
  if (ec && !fs::is_directory(staging_)) {
    throw CheckpointError("cannot create checkpoint staging directory " + staging_ + ": " +
                          fs_reason(ec));
  }
}

void CheckpointWriter::prepare(const std::string& root, std::int64_t step) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec && !fs::is_directory(root)) {
    throw CheckpointError("cannot create checkpoint directory " + root + ": " + fs_reason(ec));
  }
  const fs::path final_dir = fs::path(root) / step_dir_name(step);
  for (const auto& stale :
       {fs::path(ckpt::staging_dir(root, step)), fs::path(final_dir.string() + ".old")}) {
    fs::remove_all(stale, ec);
    if (ec) {
      throw CheckpointError("cannot remove the stale checkpoint directory " + stale.string() +
                            " (left by an interrupted save): " + fs_reason(ec));
    }
  }
}

void CheckpointWriter::write_file(const std::string& file_name,
                                  const std::vector<ShardedTensor>& tensors) {
  const std::string path = (fs::path(staging_) / file_name).string();
  if (finished_) {
    throw CheckpointError("cannot write " + path + ": rank " + std::to_string(rank_) +
                          " already called finish_rank()");
  }
  if (file_name.empty() || file_name.find('/') != std::string::npos || file_name[0] == '.' ||
      file_name == kManifestFileName || file_name == kManifestChecksumFile ||
      file_name == kStateFileName || file_name == kConfigFileName ||
      part_file_rank(file_name) >= 0) {
    throw CheckpointError("cannot write checkpoint file '" + file_name + "' in " + staging_ +
                          ": the name must be a plain file name, not starting with '.', and not "
                          "manifest.json, manifest.json.xxh64, state.json, config.yaml or "
                          "shards-rank*.json");
  }
  if (std::find(files_.begin(), files_.end(), file_name) != files_.end()) {
    throw CheckpointError("cannot write " + path + ": rank " + std::to_string(rank_) +
                          " already wrote a file of that name");
  }
  std::vector<std::pair<std::string, at::Tensor>> named;
  named.reserve(tensors.size());
  for (const auto& t : tensors) {
    const std::string what = "cannot write tensor '" + t.name + "' to " + path + ": ";
    if (!t.local.defined()) {
      throw CheckpointError(what + "the local tensor is undefined");
    }
    const auto local = t.local.sizes().vec();
    const auto ndim = local.size();
    bool fits = t.global_shape.size() == ndim && t.offsets.size() == ndim;
    for (std::size_t d = 0; fits && d < ndim; ++d) {
      fits = t.offsets[d] >= 0 && t.offsets[d] + local[d] <= t.global_shape[d];
    }
    if (!fits) {
      throw CheckpointError(what + "local shape " + format_shape(local) + " at offsets " +
                            format_shape(t.offsets) + " does not fit inside global shape " +
                            format_shape(t.global_shape));
    }
    const auto split = placement_problem(t.placements, ndim);
    if (!split.empty()) {
      throw CheckpointError(what + split);
    }
    const auto it = shards_.find(t.name);
    if (it != shards_.end() &&
        it->second.placements != t.placements) {
      throw CheckpointError(what + "rank " + std::to_string(rank_) + " already wrote it " +
                            describe_split(it->second.placements) + ", now " + describe_split(t.placements));
    }
    if (it != shards_.end() &&
        (it->second.global_shape != t.global_shape || it->second.dtype != t.local.scalar_type())) {
      throw CheckpointError(
          what + "rank " + std::to_string(rank_) + " already wrote it with global shape " +
          format_shape(it->second.global_shape) + " and dtype " + c10::toString(it->second.dtype) +
          ", now " + format_shape(t.global_shape) + " and " + c10::toString(t.local.scalar_type()));
    }
    named.emplace_back(t.name, t.local);
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"hp_step", std::to_string(step_)}, {"hp_rank", std::to_string(rank_)}};
  const auto written = write_safetensors(path, named, metadata);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    auto& record = shards_[t.name];
    record.global_shape = t.global_shape;
    record.dtype = t.local.scalar_type();
    record.placements = t.placements;
    record.shards.push_back(ShardRecord{file_name, t.offsets, t.local.sizes().vec(),
                                        written[i].begin, written[i].end,
                                        format_xxh64(written[i].xxh64)});
  }
  files_.push_back(file_name);
  fault::hit("checkpoint.after_files");
}

void CheckpointWriter::write_rank(const std::vector<ShardedTensor>& model,
                                  const std::vector<ShardedTensor>& optim) {
  if (!model.empty()) {
    current_file_ = model_file_name(rank_);
    write_file(current_file_, model);
  }
  if (!optim.empty()) {
    current_file_ = optim_file_name(rank_);
    write_file(current_file_, optim);
  }
  current_file_ = part_file_name(rank_);
  finish_rank();
}

void CheckpointWriter::finish_rank() {
  if (finished_) {
    throw CheckpointError("rank " + std::to_string(rank_) + " called finish_rank() twice for " +
                          staging_);
  }
  Manifest part;
  part.step = step_;
  part.tensors = shards_;
  // Renamed into place: a committer that waits for the parts to appear
  // (background saves) never reads a half-written one.
  detail::replace_file_atomically((fs::path(staging_) / part_file_name(rank_)).string(),
                                  manifest_to_json(part).dump(2));
  finished_ = true;
}

void CheckpointWriter::commit_with_mesh(const std::string& root, std::int64_t step, const nlohmann::json& state,
                                        const dist::ProcessMesh& mesh, const std::string& config_text, int keep,
                                        const std::vector<int>& writers) {
  commit_impl(root, step, state, mesh.sizes(), &mesh, config_text, keep, writers);
}

void CheckpointWriter::commit(const std::string& root, std::int64_t step,
                              const nlohmann::json& state, const Layout& layout,
                              const std::string& config_text, int keep,
                              const std::vector<int>& writers) {
  commit_impl(root, step, state, layout, nullptr, config_text, keep, writers);
}

void CheckpointWriter::commit_impl(const std::string& root, std::int64_t step, const nlohmann::json& state,
                                   const Layout& layout, const dist::ProcessMesh* mesh,
                                   const std::string& config_text, int keep, const std::vector<int>& writers) {
  const fs::path root_dir(root);
  const std::string name = step_dir_name(step);
  const fs::path staging = ckpt::staging_dir(root, step);
  const fs::path final_dir = root_dir / name;
  const std::string what =
      "cannot commit checkpoint step " + std::to_string(step) + " in " + root + ": ";
  if (!fs::is_directory(staging)) {
    throw CheckpointError(what + "the staging directory " + staging.string() +
                          " does not exist; every rank must construct a CheckpointWriter and "
                          "call finish_rank() before commit");
  }

  std::map<int, fs::path> parts;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(staging, ec)) {
    const int r = part_file_rank(entry.path().filename().string());
    if (r >= 0) {
      parts.emplace(r, entry.path());
    }
  }
  if (ec) {
    throw CheckpointError(what + "cannot list " + staging.string() + ": " + fs_reason(ec));
  }
  std::vector<int> expected = writers;
  if (expected.empty()) {
    for (int r = 0; r <= (parts.empty() ? 0 : parts.rbegin()->first); ++r) expected.push_back(r);
  }
  for (const auto& [r, path] : parts) {
    if (std::find(expected.begin(), expected.end(), r) == expected.end()) {
      throw CheckpointError(what + path.string() + " comes from rank " + std::to_string(r) +
                            ", which is not one of the writers of this checkpoint");
    }
  }
  for (int r : expected) {
    if (parts.count(r) == 0) {
      throw CheckpointError(what + (staging / part_file_name(r)).string() +
                            " is missing; every rank must call finish_rank() before the barrier "
                            "that precedes commit");
    }
  }

  Manifest manifest;
  manifest.step = step;
  manifest.layout = layout;
  if (mesh != nullptr) manifest.mesh = std::make_shared<const dist::ProcessMesh>(*mesh);
  if (!config_text.empty()) {
    manifest.config_file = kConfigFileName;
    manifest.config_hash = xxh64_hex(config_text);
  }
  std::map<std::string, int> file_owner;
  std::map<std::string, int> tensor_rank;
  for (const auto& [rank, path] : parts) {
    const Manifest part = load_manifest(path.string());
    for (const auto& [tensor, record] : part.tensors) {
      auto [it, inserted] = manifest.tensors.emplace(tensor, TensorRecord{});
      auto& merged = it->second;
      if (inserted) {
        merged.global_shape = record.global_shape;
        merged.dtype = record.dtype;
        merged.placements = record.placements;
        tensor_rank[tensor] = rank;
      } else if (merged.placements != record.placements) {
        throw CheckpointInternalError(what + "tensor '" + tensor + "' is " + describe_split(merged.placements) +
                                      " on rank " + std::to_string(tensor_rank[tensor]) + " but " +
                                      describe_split(record.placements) +
                                      " on rank " + std::to_string(rank) +
                                      "; every writer must record the same split");
      } else if (merged.global_shape != record.global_shape || merged.dtype != record.dtype) {
        throw CheckpointInternalError(
            what + "tensor '" + tensor + "' has global shape " + format_shape(merged.global_shape) +
            " and dtype " + c10::toString(merged.dtype) + " on rank " +
            std::to_string(tensor_rank[tensor]) + " but " + format_shape(record.global_shape) +
            " and " + c10::toString(record.dtype) + " on rank " + std::to_string(rank));
      }
      for (const auto& shard : record.shards) {
        const auto [owner, fresh] = file_owner.emplace(shard.file, rank);
        if (!fresh && owner->second != rank) {
          throw CheckpointInternalError(what + "file " + shard.file + " was written by rank " +
                                        std::to_string(owner->second) + " and by rank " +
                                        std::to_string(rank) +
                                        "; each rank must use its own file names");
        }
        merged.shards.push_back(shard);
      }
    }
  }
  for (const auto& [file, rank] : file_owner) {
    if (!fs::is_regular_file(staging / file)) {
      throw CheckpointError(what + (staging / file).string() + ", written by rank " +
                            std::to_string(rank) + ", is missing");
    }
  }
  for (auto& [tensor, record] : manifest.tensors) {
    std::sort(record.shards.begin(), record.shards.end(),
              [](const ShardRecord& a, const ShardRecord& b) { return a.offsets < b.offsets; });
    const auto problem = tiling_problem(record);
    if (!problem.empty()) {
      throw CheckpointInternalError(what + "the shards of tensor '" + tensor +
                                    "' do not tile its global shape " +
                                    format_shape(record.global_shape) + ": " + problem);
    }
  }

  std::string state_text;
  try {
    state_text = state.dump(2);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(what + "the state is not valid UTF-8 JSON (" + e.what() + ")");
  }
  manifest.state_xxh64 = format_xxh64(XXH64(state_text.data(), state_text.size(), 0));
  manifest.checksum_file = kManifestChecksumFile;
  // The manifest's own checksum lives beside it (a file cannot hold the hash
  // of its own bytes); both are in place before the rename commits the step.
  const std::string manifest_text = manifest_to_json(manifest).dump(2);
  detail::write_file_durable((staging / kManifestFileName).string(), manifest_text);
  detail::write_file_durable((staging / kManifestChecksumFile).string(),
                             manifest_checksum_text(manifest_text));
  detail::write_file_durable((staging / kStateFileName).string(), state_text);
  if (!config_text.empty()) {
    detail::write_file_durable((staging / kConfigFileName).string(), config_text);
  }
  for (const auto& [rank, path] : parts) {
    fs::remove(path, ec);
  }
  detail::fsync_dir(staging.string());

  fault::hit("checkpoint.before_rename");
  install_step_dir(root_dir, staging, final_dir);

  fault::hit("checkpoint.before_latest");
  detail::replace_file_atomically((root_dir / kLatestFileName).string(), name + "\n");

  if (keep > 0) {
    prune(root_dir, step, keep);
  }
}

}  // namespace hp::ckpt
