#pragma once
// The header that makes a stage message self-describing: how many tensors
// cross the stage boundary, and each one's name, dtype and shape. Sent on
// the first micro-batch and again only when something changes.
// No LibTorch here: dtypes are carried as integers (c10::ScalarType values).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hp::pipeline {

struct TensorMeta {
  std::string name;               ///< key in the Activations
  int dtype = 0;                  ///< static_cast<int>(c10::ScalarType)
  std::vector<std::int64_t> shape;
  bool operator==(const TensorMeta& o) const {
    return name == o.name && dtype == o.dtype && shape == o.shape;
  }
  bool operator!=(const TensorMeta& o) const { return !(*this == o); }
};

/// Fixed capacity of an encoded header, in int64 words: headers are sent as
/// one tensor of this many int64 so the receiver always knows the size.
constexpr std::size_t kHeaderWords = 512;

/// Encodes `metas` with a `generation` number into exactly kHeaderWords words:
///   [magic, format version, generation, count,
///    then per tensor: dtype, ndim, dims..., name length, one word per name byte],
/// zero padded. Throws std::invalid_argument when it doesn't fit (the message
/// names how many words were needed), for an empty name or a negative size.
std::vector<std::int64_t> encode_header(const std::vector<TensorMeta>& metas,
                                        std::int64_t generation);

/// Decodes a header; throws std::runtime_error naming what is wrong (bad
/// magic, unknown version, truncated, a count, rank, name length, size or
/// name byte that cannot be right) on malformed input. Words after the last
/// tensor are ignored. `*generation` is set only on success.
std::vector<TensorMeta> decode_header(const std::vector<std::int64_t>& words,
                                      std::int64_t* generation = nullptr);

/// Element count of a meta's shape; total payload bytes given an element
/// size function is the executor's business.
std::int64_t numel(const TensorMeta& m);

}  // namespace hp::pipeline
