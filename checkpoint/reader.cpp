#include "checkpoint/reader.h"

#include <ATen/ATen.h>
#include <xxhash.h>

#include <cctype>
#include <filesystem>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>

#include "checkpoint/detail/fs.h"
#include "checkpoint/error.h"
#include "hp/checkpoint/file_names.h"
#include "checkpoint/safetensors.h"

namespace hp::ckpt {
namespace {

namespace fs = std::filesystem;
using detail::format_shape;

std::string dtype_text(at::ScalarType t) {
  const auto name = safetensors_dtype_name(t);
  return name ? *name : std::string(c10::toString(t));
}

bool is_step_dir_name(const std::string& name) {
  const std::string prefix = "step_";
  return name.size() > prefix.size() && name.rfind(prefix, 0) == 0 &&
         name.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
}

}  // namespace

struct CheckpointReader::Impl {
  std::string dir;
  std::string manifest_path;
  Manifest manifest;
  nlohmann::json state;
  std::string config_text;
  mutable std::mutex mutex;
  mutable std::map<std::string, std::shared_ptr<const SafetensorsReader>> files;

  const TensorRecord& tensor(const std::string& name) const {
    const auto it = manifest.tensors.find(name);
    if (it == manifest.tensors.end()) {
      throw CheckpointError("tensor '" + name + "' is not in checkpoint " + manifest_path +
                            " (it holds " + std::to_string(manifest.tensors.size()) + " tensors)");
    }
    return it->second;
  }

  std::shared_ptr<const SafetensorsReader> file(const std::string& file_name) const {
    std::lock_guard<std::mutex> lock(mutex);
    auto& slot = files[file_name];
    if (!slot) {
      slot = std::make_shared<const SafetensorsReader>((fs::path(dir) / file_name).string());
    }
    return slot;
  }
};

std::string CheckpointReader::latest(const std::string& root) {
  const fs::path pointer = fs::path(root) / kLatestFileName;
  std::error_code ec;
  if (!fs::exists(pointer, ec)) {
    return "";
  }
  std::string name = detail::read_text_file(pointer.string());
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) {
    name.pop_back();
  }
  if (!is_step_dir_name(name)) {
    throw CheckpointError(pointer.string() +
                          " is malformed: it must hold a step directory name such as "
                          "step_00000100, but holds '" +
                          name + "'");
  }
  const fs::path dir = fs::path(root) / name;
  if (!fs::is_directory(dir, ec)) {
    throw CheckpointError(pointer.string() + " names " + name + ", but " + dir.string() +
                          " does not exist: the checkpoint directory was damaged or edited by "
                          "hand; point latest at an existing step_* directory or remove it");
  }
  return dir.string();
}

CheckpointReader::CheckpointReader(std::string step_dir) : impl_(std::make_unique<Impl>()) {
  impl_->dir = std::move(step_dir);
  std::error_code ec;
  if (!fs::is_directory(impl_->dir, ec)) {
    throw CheckpointError("checkpoint directory " + impl_->dir + " does not exist");
  }
  impl_->manifest_path = (fs::path(impl_->dir) / kManifestFileName).string();
  impl_->manifest = load_manifest(impl_->manifest_path);
  for (const auto& [name, record] : impl_->manifest.tensors) {
    const auto problem = tiling_problem(record);
    if (!problem.empty()) {
      throw CheckpointError("bad manifest " + impl_->manifest_path + ": the shards of tensor '" +
                            name + "' do not tile its global shape: " + problem);
    }
  }
  // Every file the manifest lists must be there before anything is read:
  // a missing one is an incomplete checkpoint, said as such (not as the
  // open error of whichever rank reads it first).
  std::set<std::string> listed{kStateFileName};
  if (!impl_->manifest.config_file.empty()) listed.insert(impl_->manifest.config_file);
  for (const auto& [name, record] : impl_->manifest.tensors)
    for (const auto& shard : record.shards) listed.insert(shard.file);
  for (const auto& file : listed) {
    if (!fs::exists(fs::path(impl_->dir) / file, ec)) {
      throw CheckpointError("checkpoint " + impl_->dir + " is incomplete: " + file +
                            ", listed in its manifest, is missing; resume from another step");
    }
  }
  const std::string state_path = (fs::path(impl_->dir) / kStateFileName).string();
  const std::string text = detail::read_text_file(state_path);
  // The run state is protected like the tensors: its checksum is in the
  // manifest, and its step must be the manifest's.
  if (!impl_->manifest.state_xxh64.empty()) {
    const std::string got = format_xxh64(XXH64(text.data(), text.size(), 0));
    if (got != impl_->manifest.state_xxh64) {
      throw CheckpointError("bad state file " + state_path + ": its checksum is " + got +
                            " but the manifest says " + impl_->manifest.state_xxh64 +
                            ": the run state was changed or damaged; resume from another step");
    }
  }
  try {
    impl_->state = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // The parser quotes what it read last, which can be kilobytes of RNG
    // state: keep the message to one short line.
    std::string why = e.what();
    if (why.size() > 160) why = why.substr(0, 160) + "...";
    throw CheckpointError("bad state file " + state_path + ": not valid JSON (" + why + ")");
  }
  const auto step_it = impl_->state.is_object() ? impl_->state.find("step") : impl_->state.end();
  if (step_it != impl_->state.end() &&
      (!step_it->is_number_integer() || step_it->get<std::int64_t>() != impl_->manifest.step)) {
    throw CheckpointError("bad state file " + state_path + ": it says step " +
                          step_it->dump().substr(0, 40) + " but the manifest says step " +
                          std::to_string(impl_->manifest.step) + "; resume from another step");
  }
  if (!impl_->manifest.config_file.empty()) {
    const std::string config_path = (fs::path(impl_->dir) / impl_->manifest.config_file).string();
    impl_->config_text = detail::read_text_file(config_path);
    const std::string got = xxh64_hex(impl_->config_text);
    if (got != impl_->manifest.config_hash) {
      throw CheckpointError("bad config file " + config_path + ": its checksum is " + got +
                            " but the manifest's config_hash is " + impl_->manifest.config_hash +
                            ": the stored config was changed or damaged; resume from another step");
    }
  }
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

const std::string& CheckpointReader::dir() const { return impl_->dir; }
std::int64_t CheckpointReader::step() const { return impl_->manifest.step; }
const nlohmann::json& CheckpointReader::state() const { return impl_->state; }
const Layout& CheckpointReader::layout() const { return impl_->manifest.layout; }
const std::string& CheckpointReader::config_hash() const { return impl_->manifest.config_hash; }
const std::string& CheckpointReader::config_text() const { return impl_->config_text; }
const Manifest& CheckpointReader::manifest() const { return impl_->manifest; }

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(impl_->manifest.tensors.size());
  for (const auto& entry : impl_->manifest.tensors) {
    names.push_back(entry.first);
  }
  return names;
}

bool CheckpointReader::has(const std::string& name) const {
  return impl_->manifest.tensors.count(name) != 0;
}

std::vector<std::int64_t> CheckpointReader::global_shape(const std::string& name) const {
  return impl_->tensor(name).global_shape;
}

at::ScalarType CheckpointReader::dtype(const std::string& name) const {
  return impl_->tensor(name).dtype;
}

at::Tensor CheckpointReader::read(const std::string& name, at::IntArrayRef offsets,
                                  at::IntArrayRef lengths) const {
  const auto& t = impl_->tensor(name);
  const auto ndim = t.global_shape.size();
  bool inside = offsets.size() == ndim && lengths.size() == ndim;
  for (std::size_t d = 0; inside && d < ndim; ++d) {
    inside = offsets[d] >= 0 && lengths[d] >= 0 && offsets[d] + lengths[d] <= t.global_shape[d];
  }
  if (!inside) {
    throw CheckpointError("cannot read region offsets " + format_shape(offsets.vec()) +
                          " lengths " + format_shape(lengths.vec()) + " of tensor '" + name +
                          "' from " + impl_->manifest_path +
                          ": it is not inside its global shape " + format_shape(t.global_shape));
  }
  at::Tensor out = at::empty(lengths, at::TensorOptions().dtype(t.dtype));
  if (out.numel() == 0) {
    return out;
  }
  for (const auto& shard : t.shards) {
    std::vector<std::int64_t> lo(ndim);
    std::vector<std::int64_t> hi(ndim);
    bool overlaps = true;
    for (std::size_t d = 0; overlaps && d < ndim; ++d) {
      lo[d] = std::max(offsets[d], shard.offsets[d]);
      hi[d] = std::min(offsets[d] + lengths[d], shard.offsets[d] + shard.lengths[d]);
      overlaps = lo[d] < hi[d];
    }
    if (!overlaps) {
      continue;
    }
    const std::string path = (fs::path(impl_->dir) / shard.file).string();
    at::Tensor data;
    try {
      data = impl_->file(shard.file)
                 ->read_range(shard.byte_begin, shard.byte_end, t.dtype, shard.lengths);
    } catch (const CheckpointError& e) {
      throw CheckpointError("cannot read tensor '" + name + "' from " + path + ": " + e.what());
    }
    const auto nbytes = static_cast<std::size_t>(shard.byte_end - shard.byte_begin);
    const auto got = format_xxh64(XXH64(nbytes ? data.data_ptr() : nullptr, nbytes, 0));
    if (got != shard.xxh64) {
      throw CheckpointError("checksum mismatch in " + path + " for tensor " + name + " (expected " +
                            shard.xxh64 + ", got " + got + "): the checkpoint is corrupt");
    }
    at::Tensor src = data;
    at::Tensor dst = out;
    for (std::size_t d = 0; d < ndim; ++d) {
      const auto d64 = static_cast<std::int64_t>(d);
      src = src.narrow(d64, lo[d] - shard.offsets[d], hi[d] - lo[d]);
      dst = dst.narrow(d64, lo[d] - offsets[d], hi[d] - lo[d]);
    }
    dst.copy_(src);
  }
  return out;
}

at::Tensor CheckpointReader::read_full(const std::string& name) const {
  const auto& shape = impl_->tensor(name).global_shape;
  return read(name, std::vector<std::int64_t>(shape.size(), 0), shape);
}

void CheckpointReader::check(const std::string& name, at::IntArrayRef expected_global_shape,
                             at::ScalarType expected_dtype) const {
  const auto& t = impl_->tensor(name);
  if (t.global_shape == expected_global_shape.vec() && t.dtype == expected_dtype) {
    return;
  }
  std::string files;
  for (const auto& shard : t.shards) {
    if (files.find(shard.file) == std::string::npos) {
      files += (files.empty() ? "" : ", ") + shard.file;
    }
  }
  throw CheckpointError("tensor '" + name + "' in checkpoint " + impl_->manifest_path +
                        " (stored in " + files + ") has shape " + format_shape(t.global_shape) +
                        " and dtype " + dtype_text(t.dtype) + ", but the model expects shape " +
                        format_shape(expected_global_shape.vec()) + " and dtype " +
                        dtype_text(expected_dtype));
}

}  // namespace hp::ckpt
