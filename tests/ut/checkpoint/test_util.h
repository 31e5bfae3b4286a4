#pragma once
// Helpers for the checkpoint tests: a fresh directory per test, raw file
// surgery, bitwise tensor comparison and small save helpers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace hp::ckpt::test {

namespace fs = std::filesystem;

/// The text of the CheckpointError `fn` throws (a test failure if none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CheckpointError";
  return "";
}

/// A new directory under ::testing::TempDir(), removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "hp_ckpt_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp failed for " + pattern);
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline void flip_byte(const std::string& path, std::uint64_t offset) {
  std::string bytes = read_bytes(path);
  bytes.at(offset) = static_cast<char>(bytes.at(offset) ^ 0x5a);
  write_bytes(path, bytes);
}

/// Writes `text` as the manifest.json of `step_dir`, as a deliberate edit:
/// its checksum file is rewritten to match, so the checks behind the
/// checksum are what a test meets.
inline void write_manifest_resealed(const std::string& step_dir, const std::string& text) {
  const std::string path = step_dir + "/manifest.json";
  write_bytes(path, text);
  write_bytes(manifest_checksum_path(path), manifest_checksum_text(text));
}

/// Writes `m` (its "checksum_file" dropped) as the manifest.json of
/// `step_dir` and removes the checksum file: a manifest written before
/// manifests had checksums.
inline void write_manifest_unchecked(const std::string& step_dir, nlohmann::json m) {
  const std::string path = step_dir + "/manifest.json";
  m.erase("checksum_file");
  write_bytes(path, m.dump());
  std::filesystem::remove(manifest_checksum_path(path));
}

/// Same dtype, same shape, same bytes (NaN payloads and -0.0 included).
inline ::testing::AssertionResult bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) {
    return ::testing::AssertionFailure() << "dtype/shape differ: " << a.scalar_type() << a.sizes()
                                         << " vs " << b.scalar_type() << b.sizes();
  }
  const auto ca = a.contiguous();
  const auto cb = b.contiguous();
  const auto n = static_cast<std::size_t>(ca.numel()) * ca.element_size();
  if (n != 0 && std::memcmp(ca.data_ptr(), cb.data_ptr(), n) != 0) {
    return ::testing::AssertionFailure() << "bytes differ";
  }
  return ::testing::AssertionSuccess();
}

/// Distinct, reproducible values of any supported dtype.
inline at::Tensor sample(std::vector<std::int64_t> shape, at::ScalarType dtype,
                         std::uint64_t seed = 7) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  if (dtype == at::kBool) {
    return torch::randint(0, 2, shape, gen, torch::kLong).to(at::kBool);
  }
  if (at::isFloatingType(dtype)) {
    return (torch::randn(shape, gen) * 100).to(dtype);
  }
  const std::int64_t hi = dtype == at::kByte ? 255 : 127;
  const std::int64_t lo = dtype == at::kByte ? 0 : -128;
  return torch::randint(lo, hi, shape, gen, torch::kLong).to(dtype);
}

/// One rank, whole tensors, committed.
inline void save_whole(const std::string& root, std::int64_t step,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const nlohmann::json& state, int keep = 0) {
  CheckpointWriter::prepare(root, step);
  CheckpointWriter w(root, step, 0);
  std::vector<ShardedTensor> shards;
  for (const auto& [name, t] : tensors) {
    shards.push_back({name, t, t.sizes().vec(), std::vector<std::int64_t>(t.dim(), 0)});
  }
  w.write_file("model-rank00000.safetensors", shards);
  w.finish_rank();
  CheckpointWriter::commit(root, step, state, {{"dp", 1}}, "hash-1", keep);
}

inline std::string rank_file(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-rank%05d.safetensors", rank);
  return buf;
}

/// `global` split along `dim` at `bounds` (first 0, last size(dim)); one
/// simulated rank per piece, each a CheckpointWriter of its own. Not committed.
inline void write_split(const std::string& root, std::int64_t step, const std::string& name,
                        const at::Tensor& global, std::int64_t dim,
                        const std::vector<std::int64_t>& bounds) {
  CheckpointWriter::prepare(root, step);
  for (std::size_t r = 0; r + 1 < bounds.size(); ++r) {
    CheckpointWriter w(root, step, static_cast<int>(r));
    std::vector<std::int64_t> offsets(global.dim(), 0);
    offsets[dim] = bounds[r];
    w.write_file(rank_file(static_cast<int>(r)),
                 {{name, global.narrow(dim, bounds[r], bounds[r + 1] - bounds[r]).clone(),
                   global.sizes().vec(), offsets}});
    w.finish_rank();
  }
}

}  // namespace hp::ckpt::test
