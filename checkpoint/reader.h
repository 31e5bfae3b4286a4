#pragma once
// Reading a committed checkpoint under any layout: every read names a region
// of a global tensor, and the reader assembles it from the shards that
// overlap it, reading only their byte ranges and verifying their checksums.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "hp/checkpoint/manifest.h"

namespace hp::ckpt {

/// One committed step directory (as CheckpointWriter::commit leaves it).
/// Reads are thread-safe.
class CheckpointReader {
 public:
  /// The step directory `<root>/latest` names, or "" when there is no
  /// `latest` (nothing committed yet). Throws CheckpointError when `latest`
  /// is malformed or names a directory that does not exist.
  static std::string latest(const std::string& root);

  /// Parses and validates manifest.json, state.json and config.yaml (when
  /// listed) of `step_dir`.
  explicit CheckpointReader(std::string step_dir);
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;

  const std::string& dir() const;
  std::int64_t step() const;
  const nlohmann::json& state() const;
  const Layout& layout() const;
  const std::string& config_hash() const;
  /// The resolved config the checkpoint was written with (config.yaml,
  /// checked against the manifest's config_hash), or "" for a checkpoint
  /// written before configs were stored (or by hp-ckpt import).
  const std::string& config_text() const;
  const Manifest& manifest() const;

  std::vector<std::string> tensor_names() const;
  bool has(const std::string& name) const;
  std::vector<std::int64_t> global_shape(const std::string& name) const;
  at::ScalarType dtype(const std::string& name) const;

  /// The box [offsets, offsets + lengths) of global tensor `name`, as a
  /// contiguous CPU tensor of shape `lengths`.
  at::Tensor read(const std::string& name, at::IntArrayRef offsets, at::IntArrayRef lengths) const;
  at::Tensor read_full(const std::string& name) const;

  /// Throws CheckpointError naming the tensor, both shapes and dtypes and the
  /// manifest when `name` is absent or differs from what the caller expects.
  void check(const std::string& name, at::IntArrayRef expected_global_shape,
             at::ScalarType expected_dtype) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hp::ckpt
