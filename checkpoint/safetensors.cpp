#include "checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/detail/fs.h"
#include "checkpoint/error.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian and is written and read as raw memory: "
              "hyperparallel's checkpoint layer needs a little-endian host");

namespace hp::ckpt {
namespace {

// The reference implementation refuses headers above 100 MB; so do we, which
// also keeps a corrupt length from asking for an absurd allocation.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {{at::kDouble, "F64"},    {at::kFloat, "F32"}, {at::kHalf, "F16"},
                                 {at::kBFloat16, "BF16"}, {at::kLong, "I64"},  {at::kInt, "I32"},
                                 {at::kShort, "I16"},     {at::kChar, "I8"},   {at::kByte, "U8"},
                                 {at::kBool, "BOOL"}};

using detail::format_shape;

/// Bytes needed by `shape` of `dtype`, or nullopt on overflow.
std::optional<std::uint64_t> byte_size(const std::vector<std::int64_t>& shape,
                                       at::ScalarType dtype) {
  std::uint64_t n = c10::elementSize(dtype);
  for (const auto d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) {
      return std::nullopt;
    }
  }
  return n;
}

std::string describe_tensor_problem(const std::string& path, const std::string& name,
                                    const std::string& problem) {
  return "cannot write tensor '" + name + "' to " + path + ": " + problem;
}

}  // namespace

std::optional<std::string> safetensors_dtype_name(at::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (d.type == type) {
      return std::string(d.name);
    }
  }
  return std::nullopt;
}

std::optional<at::ScalarType> safetensors_dtype_from_name(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      return d.type;
    }
  }
  return std::nullopt;
}

std::string supported_safetensors_dtypes() {
  std::string out;
  for (const auto& d : kDtypes) {
    out += (out.empty() ? "" : ", ") + std::string(d.name);
  }
  return out;
}

std::vector<WrittenTensor> write_safetensors(
    const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) {
    header["__metadata__"] = metadata;
  }
  std::vector<at::Tensor> data;
  std::vector<WrittenTensor> written;
  data.reserve(tensors.size());
  written.reserve(tensors.size());
  std::set<std::string> seen;
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__") {
      throw CheckpointError(describe_tensor_problem(
          path, name, "the name must be non-empty and not \"__metadata__\""));
    }
    if (!seen.insert(name).second) {
      throw CheckpointError(
          describe_tensor_problem(path, name, "the name appears twice in the same file"));
    }
    if (!tensor.defined()) {
      throw CheckpointError(describe_tensor_problem(path, name, "the tensor is undefined"));
    }
    if (tensor.layout() != at::kStrided) {
      throw CheckpointError(describe_tensor_problem(
          path, name, "only dense tensors can be stored; convert it with to_dense()"));
    }
    const auto dtype = safetensors_dtype_name(tensor.scalar_type());
    if (!dtype) {
      throw CheckpointError(describe_tensor_problem(
          path, name,
          "dtype " + std::string(c10::toString(tensor.scalar_type())) +
              " is not supported (supported: " + supported_safetensors_dtypes() + ")"));
    }
    at::Tensor c = tensor.detach().to(at::kCPU).resolve_conj().resolve_neg().contiguous();
    const auto bytes = static_cast<std::uint64_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", *dtype},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", nlohmann::json::array({offset, offset + bytes})}};
    written.push_back(WrittenTensor{name, offset, offset + bytes, 0});
    data.push_back(std::move(c));
    offset += bytes;
  }

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("cannot write " + path + ": a tensor name or metadata entry is not " +
                          "valid UTF-8 (" + e.what() + ")");
  }
  // Padding keeps the data 8-byte aligned, as the reference writer does.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const std::uint64_t header_len = header_text.size();
  const std::uint64_t data_begin = 8 + header_len;

  detail::Fd fd = detail::open_for_write(path);
  detail::write_all(fd.get(), &header_len, sizeof header_len, path);
  detail::write_all(fd.get(), header_text.data(), header_text.size(), path);
  for (std::size_t i = 0; i < data.size(); ++i) {
    auto& w = written[i];
    const std::size_t n = w.end - w.begin;
    const void* p = n ? data[i].data_ptr() : nullptr;
    detail::write_all(fd.get(), p, n, path + " (tensor '" + w.name + "')");  // a failure names the tensor
    w.xxh64 = XXH64(p, n, 0);
    w.begin += data_begin;
    w.end += data_begin;
  }
  detail::fsync_fd(fd.get(), path);
  fd.close_or_throw(path);
  return written;
}

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  detail::Fd fd = detail::open_for_read(path_);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw CheckpointError("cannot stat " + path_ + ": " + detail::errno_text(errno));
  }
  file_size_ = static_cast<std::uint64_t>(st.st_size);
  std::uint64_t header_len = 0;
  if (file_size_ < 8 || detail::pread_all(fd.get(), &header_len, 8, 0, path_) != 8) {
    throw CheckpointError("bad header length in safetensors file " + path_ + ": the file has " +
                          std::to_string(file_size_) +
                          " bytes, fewer than the 8-byte header length");
  }
  if (header_len == 0 || header_len > kMaxHeaderBytes) {
    throw CheckpointError("bad header length in safetensors file " + path_ + ": " +
                          std::to_string(header_len) + " (must be 1 to " +
                          std::to_string(kMaxHeaderBytes) + "); this is not a safetensors file");
  }
  if (header_len > file_size_ - 8) {
    throw CheckpointError("header past end of file in safetensors file " + path_ +
                          ": the header length says " + std::to_string(header_len) +
                          " bytes but only " + std::to_string(file_size_ - 8) +
                          " follow; the file is truncated");
  }
  data_begin_ = 8 + header_len;
  std::string text(header_len, '\0');
  detail::pread_all(fd.get(), text.data(), text.size(), 8, path_);

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("bad header in safetensors file " + path_ + ": not valid JSON (" +
                          e.what() + ")");
  }
  if (!header.is_object()) {
    throw CheckpointError("bad header in safetensors file " + path_ + ": not a JSON object");
  }
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        throw CheckpointError("bad header in safetensors file " + path_ +
                              ": __metadata__ is not an object");
      }
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          throw CheckpointError("bad header in safetensors file " + path_ + ": __metadata__." + mk +
                                " is not a string");
        }
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + key + "' in safetensors file " + path_;
    if (!value.is_object() || !value.contains("dtype") || !value["dtype"].is_string() ||
        !value.contains("shape") || !value["shape"].is_array() || !value.contains("data_offsets") ||
        !value["data_offsets"].is_array() || value["data_offsets"].size() != 2 ||
        !value["data_offsets"][0].is_number_unsigned() ||
        !value["data_offsets"][1].is_number_unsigned()) {
      throw CheckpointError("bad header entry for " + where +
                            ": needs \"dtype\" (string), \"shape\" (array) and "
                            "\"data_offsets\" ([begin, end])");
    }
    SafetensorsEntry e;
    e.name = key;
    const auto dtype_name = value["dtype"].get<std::string>();
    const auto dtype = safetensors_dtype_from_name(dtype_name);
    if (!dtype) {
      throw CheckpointError("unknown dtype '" + dtype_name + "' for " + where +
                            " (hyperparallel reads " + supported_safetensors_dtypes() + ")");
    }
    e.dtype = *dtype;
    for (const auto& d : value["shape"]) {
      if (!d.is_number_unsigned()) {
        throw CheckpointError("bad shape for " + where + ": " + value["shape"].dump());
      }
      e.shape.push_back(d.get<std::int64_t>());
    }
    const auto b = value["data_offsets"][0].get<std::uint64_t>();
    const auto end = value["data_offsets"][1].get<std::uint64_t>();
    const auto need = byte_size(e.shape, e.dtype);
    if (end < b || !need || end - b != *need) {
      throw CheckpointError("bad data_offsets for " + where + ": [" + std::to_string(b) + ", " +
                            std::to_string(end) + "] does not hold shape " + format_shape(e.shape) +
                            " of " + dtype_name);
    }
    if (end > file_size_ - data_begin_) {
      throw CheckpointError("safetensors file " + path_ + " is truncated: " + where +
                            " needs data up to byte " + std::to_string(data_begin_ + end) +
                            " (data_offsets [" + std::to_string(b) + ", " + std::to_string(end) +
                            "]) but the file has " + std::to_string(file_size_) + " bytes");
    }
    e.begin = data_begin_ + b;
    e.end = data_begin_ + end;
    names_.push_back(key);
    entries_.emplace(key, std::move(e));
  }
  std::stable_sort(names_.begin(), names_.end(), [this](const auto& a, const auto& b) {
    return entries_.at(a).begin < entries_.at(b).begin;
  });
  fd_ = fd.release();
}

SafetensorsReader::~SafetensorsReader() { detail::Fd closer(fd_); }

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      file_size_(other.file_size_),
      data_begin_(other.data_begin_),
      metadata_(std::move(other.metadata_)),
      entries_(std::move(other.entries_)),
      names_(std::move(other.names_)) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    detail::Fd closer(std::exchange(fd_, std::exchange(other.fd_, -1)));
    path_ = std::move(other.path_);
    file_size_ = other.file_size_;
    data_begin_ = other.data_begin_;
    metadata_ = std::move(other.metadata_);
    entries_ = std::move(other.entries_);
    names_ = std::move(other.names_);
  }
  return *this;
}

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) {
    throw CheckpointError("no tensor '" + name + "' in safetensors file " + path_);
  }
  return it->second;
}

at::Tensor SafetensorsReader::read(const std::string& name) const {
  const auto& e = entry(name);
  return read_range(e.begin, e.end, e.dtype, e.shape);
}

at::Tensor SafetensorsReader::read_range(std::uint64_t begin, std::uint64_t end,
                                         at::ScalarType dtype, at::IntArrayRef shape) const {
  const auto need = byte_size(shape.vec(), dtype);
  if (end < begin || !need || end - begin != *need) {
    throw CheckpointError("byte range [" + std::to_string(begin) + ", " + std::to_string(end) +
                          ") of " + path_ + " does not hold shape " + format_shape(shape.vec()) +
                          " of " + std::string(c10::toString(dtype)));
  }
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
  const std::size_t n = end - begin;
  if (n > 0 && (end > file_size_ || detail::pread_all(fd_, out.data_ptr(), n, begin, path_) != n)) {
    throw CheckpointError("safetensors file " + path_ + " is truncated: byte range [" +
                          std::to_string(begin) + ", " + std::to_string(end) + ") is past its end");
  }
  return out;
}

}  // namespace hp::ckpt
