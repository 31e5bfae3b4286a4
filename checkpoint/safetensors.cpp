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

namespace hp::ckpt {
namespace {

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

SafetensorsReader::SafetensorsReader(std::string path) : file_(std::move(path)) {
  for (const auto& [name, e] : file_.entries()) {
    SafetensorsEntry x;
    x.name = name;
    // The format's dtype names and this table list the same ten.
    x.dtype = safetensors_dtype_from_name(e.dtype).value();
    x.shape = e.shape;
    x.begin = e.begin;
    x.end = e.end;
    entries_.emplace(name, std::move(x));
  }
}

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) {
    throw CheckpointError("no tensor '" + name + "' in safetensors file " + path());
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
                          ") of " + path() + " does not hold shape " + format_shape(shape.vec()) +
                          " of " + std::string(c10::toString(dtype)));
  }
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
  file_.read(begin, end, out.data_ptr());
  return out;
}

}  // namespace hp::ckpt
