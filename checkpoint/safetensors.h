#pragma once
// The safetensors file format, so that every shard file of a checkpoint is
// readable by Python's `safetensors` and by hand:
//
//   8 bytes   little-endian u64 N, the length of the header
//   N bytes   JSON: {"<name>": {"dtype": "F32", "shape": [2, 3],
//                              "data_offsets": [begin, end]}, ...,
//                    "__metadata__": {"<key>": "<string>", ...}}
//             (padded with spaces to a multiple of 8 bytes)
//   the data  each tensor's bytes, row-major, little-endian; data_offsets are
//             relative to the first byte after the header, the tensors are
//             packed back to back and the file ends with the last one.
#include <ATen/core/Tensor.h>

#include "checkpoint/safetensors_format.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hp::ckpt {

/// The safetensors name of a dtype ("F32"), or nullopt when the format (as
/// hyperparallel writes it) has none. Supported: F64 F32 F16 BF16 I64 I32 I16
/// I8 U8 BOOL.
std::optional<std::string> safetensors_dtype_name(at::ScalarType type);
/// The dtype a safetensors name stands for, or nullopt for an unknown name.
std::optional<at::ScalarType> safetensors_dtype_from_name(const std::string& name);

/// Where one tensor landed in a written file.
struct WrittenTensor {
  std::string name;
  /// Absolute byte range [begin, end) of the tensor's data in the file.
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  /// XXH64 (seed 0) of those bytes.
  std::uint64_t xxh64 = 0;
};

/// Writes `tensors` (in this order) to `path`, replacing any file there, and
/// fsyncs it (not its directory). Tensors may live on any device and be
/// non-contiguous; they are copied to contiguous CPU memory first. Returns one
/// entry per tensor, in the same order. Names must be unique, non-empty and
/// not "__metadata__". An empty `metadata` writes no "__metadata__" key.
std::vector<WrittenTensor> write_safetensors(
    const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata = {});

/// One tensor as the header of a safetensors file describes it.
struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<std::int64_t> shape;
  /// Absolute byte range [begin, end) in the file.
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

/// Reads a safetensors file: the header is parsed and checked against the
/// file's size on construction; tensors or byte ranges are then read with
/// pread, so one reader may serve several threads.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::string path);

  const std::string& path() const { return file_.path(); }
  std::uint64_t file_size() const { return file_.file_size(); }
  /// Absolute offset of the first data byte (8 + header length).
  std::uint64_t data_begin() const { return file_.data_begin(); }
  const std::map<std::string, std::string>& metadata() const { return file_.metadata(); }
  /// Tensor names in the order of their data in the file.
  const std::vector<std::string>& names() const { return file_.names(); }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;

  /// The whole tensor `name`, on the CPU.
  at::Tensor read(const std::string& name) const;
  /// The absolute byte range [begin, end) as a CPU tensor of `dtype` and
  /// `shape`; the range must hold exactly that many bytes.
  at::Tensor read_range(std::uint64_t begin, std::uint64_t end, at::ScalarType dtype,
                        at::IntArrayRef shape) const;

 private:
  SafetensorsFile file_;
  std::map<std::string, SafetensorsEntry> entries_;
};

}  // namespace hp::ckpt
