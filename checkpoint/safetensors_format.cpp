#include "checkpoint/safetensors_format.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <utility>

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

struct DtypeSize {
  const char* name;
  std::size_t bytes;
};
constexpr DtypeSize kDtypes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                 {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};

}  // namespace

std::size_t safetensors_element_size(const std::string& dtype) {
  for (const auto& d : kDtypes) {
    if (dtype == d.name) return d.bytes;
  }
  return 0;
}

std::string supported_safetensors_dtypes() {
  std::string out;
  for (const auto& d : kDtypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
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
    Entry e;
    e.name = key;
    e.dtype = value["dtype"].get<std::string>();
    const std::size_t element = safetensors_element_size(e.dtype);
    if (element == 0) {
      throw CheckpointError("unknown dtype '" + e.dtype + "' for " + where +
                            " (hyperparallel reads " + supported_safetensors_dtypes() + ")");
    }
    for (const auto& d : value["shape"]) {
      if (!d.is_number_unsigned()) {
        throw CheckpointError("bad shape for " + where + ": " + value["shape"].dump());
      }
      e.shape.push_back(d.get<std::int64_t>());
    }
    const auto b = value["data_offsets"][0].get<std::uint64_t>();
    const auto end = value["data_offsets"][1].get<std::uint64_t>();
    std::uint64_t need = element;
    bool overflow = false;
    for (const auto d : e.shape) {
      overflow = overflow || d < 0 || __builtin_mul_overflow(need, static_cast<std::uint64_t>(d), &need);
    }
    if (end < b || overflow || end - b != need) {
      throw CheckpointError("bad data_offsets for " + where + ": [" + std::to_string(b) + ", " +
                            std::to_string(end) + "] does not hold shape " +
                            detail::format_shape(e.shape) + " of " + e.dtype);
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

SafetensorsFile::~SafetensorsFile() { detail::Fd closer(fd_); }

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      file_size_(other.file_size_),
      data_begin_(other.data_begin_),
      metadata_(std::move(other.metadata_)),
      entries_(std::move(other.entries_)),
      names_(std::move(other.names_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
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

int SafetensorsFile::release_fd() { return std::exchange(fd_, -1); }

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) {
    throw CheckpointError("no tensor '" + name + "' in safetensors file " + path_);
  }
  return it->second;
}

void SafetensorsFile::read(std::uint64_t begin, std::uint64_t end, void* out) const {
  const std::size_t n = end - begin;
  if (n > 0 && (end < begin || end > file_size_ || detail::pread_all(fd_, out, n, begin, path_) != n)) {
    throw CheckpointError("safetensors file " + path_ + " is truncated: byte range [" +
                          std::to_string(begin) + ", " + std::to_string(end) + ") is past its end");
  }
}

std::string SafetensorsFile::bytes(const std::string& name) const {
  const Entry& e = entry(name);
  std::string out(e.end - e.begin, '\0');
  read(e.begin, e.end, out.data());
  return out;
}

}  // namespace hp::ckpt
