#pragma once
// The safetensors header and raw bytes without LibTorch: what a tool that
// only reads tensors as bytes (hp-compare) needs, so it starts without
// loading LibTorch (which costs a process about half a second of CPU
// here, docs/toolchain.md). safetensors.h builds the tensor reader and
// writer on it. The format is described there.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hp::ckpt {

/// Bytes per element of a safetensors dtype name ("F32" -> 4), 0 for a
/// name hyperparallel does not read.
std::size_t safetensors_element_size(const std::string& dtype);
/// "F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL", for messages.
std::string supported_safetensors_dtypes();

/// A safetensors file's header, parsed and checked against the file's
/// size (every tensor's bytes inside the file, sized for its shape and
/// dtype), and its bytes read on demand.
class SafetensorsFile {
 public:
  struct Entry {
    std::string name;
    std::string dtype;  ///< the safetensors name ("F32")
    std::vector<std::int64_t> shape;
    /// Absolute byte range [begin, end) in the file.
    std::uint64_t begin = 0;
    std::uint64_t end = 0;
  };

  /// Opens and parses `path`; a CheckpointError names the file and what is
  /// wrong with it.
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::uint64_t file_size() const { return file_size_; }
  /// Absolute offset of the first data byte (8 + header length).
  std::uint64_t data_begin() const { return data_begin_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Tensor names in the order of their data in the file.
  const std::vector<std::string>& names() const { return names_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const Entry& entry(const std::string& name) const;
  /// Reads [begin, end) into `out` (pread: one file may serve several threads).
  void read(std::uint64_t begin, std::uint64_t end, void* out) const;
  /// The bytes of tensor `name`.
  std::string bytes(const std::string& name) const;
  /// Gives up the open descriptor (the caller closes it).
  int release_fd();

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t file_size_ = 0;
  std::uint64_t data_begin_ = 0;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> names_;
};

}  // namespace hp::ckpt
