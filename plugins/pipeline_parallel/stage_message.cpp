// Fixed-size int64 encoding of a stage message's tensor list (see stage_message.h).
#include "plugins/pipeline_parallel/stage_message.h"

#include <stdexcept>

namespace hp::pipeline {
namespace {

// "HPPIPEHD" in ASCII: easy to spot in a hex dump, unlikely as tensor data.
constexpr std::int64_t kMagic = 0x4850504950454844LL;
constexpr std::int64_t kVersion = 1;
constexpr std::size_t kFixedWords = 4;  // magic, version, generation, count

std::size_t words_needed(const std::vector<TensorMeta>& metas) {
  std::size_t n = kFixedWords;
  for (const TensorMeta& m : metas) n += 2 + m.shape.size() + 1 + m.name.size();
  return n;
}

// Sequential reader that names what was being read when the words run out.
class Reader {
 public:
  explicit Reader(const std::vector<std::int64_t>& w) : w_(w) {}
  std::int64_t next(const std::string& what) {
    if (pos_ >= w_.size()) {
      throw std::runtime_error("stage message header is truncated: it ends at word " +
                               std::to_string(pos_) + " while reading " + what);
    }
    return w_[pos_++];
  }

 private:
  const std::vector<std::int64_t>& w_;
  std::size_t pos_ = 0;
};

}  // namespace

std::vector<std::int64_t> encode_header(const std::vector<TensorMeta>& metas,
                                        std::int64_t generation) {
  for (std::size_t i = 0; i < metas.size(); ++i) {
    const TensorMeta& m = metas[i];
    if (m.name.empty()) {
      throw std::invalid_argument("stage message tensor " + std::to_string(i) +
                                  " has an empty name");
    }
    for (std::size_t d = 0; d < m.shape.size(); ++d) {
      if (m.shape[d] < 0) {
        throw std::invalid_argument("stage message tensor '" + m.name + "' has dimension " +
                                    std::to_string(d) + " = " + std::to_string(m.shape[d]) +
                                    "; sizes must be >= 0");
      }
    }
  }
  const std::size_t needed = words_needed(metas);
  if (needed > kHeaderWords) {
    throw std::invalid_argument("stage message header needs " + std::to_string(needed) +
                                " int64 words for " + std::to_string(metas.size()) +
                                " tensors; the fixed capacity is " + std::to_string(kHeaderWords) +
                                " (fewer tensors, shorter names or lower ranks fit)");
  }
  std::vector<std::int64_t> w;
  w.reserve(kHeaderWords);
  w.push_back(kMagic);
  w.push_back(kVersion);
  w.push_back(generation);
  w.push_back(static_cast<std::int64_t>(metas.size()));
  for (const TensorMeta& m : metas) {
    w.push_back(m.dtype);
    w.push_back(static_cast<std::int64_t>(m.shape.size()));
    w.insert(w.end(), m.shape.begin(), m.shape.end());
    w.push_back(static_cast<std::int64_t>(m.name.size()));
    for (char c : m.name) w.push_back(static_cast<unsigned char>(c));  // one byte per word
  }
  w.resize(kHeaderWords, 0);
  return w;
}

std::vector<TensorMeta> decode_header(const std::vector<std::int64_t>& words,
                                      std::int64_t* generation) {
  Reader in(words);
  const std::int64_t magic = in.next("the magic number");
  if (magic != kMagic) {
    throw std::runtime_error("stage message header has bad magic " + std::to_string(magic) +
                             " (expected " + std::to_string(kMagic) +
                             "): the sender and receiver disagree about the message layout");
  }
  const std::int64_t version = in.next("the format version");
  if (version != kVersion) {
    throw std::runtime_error("stage message header has unknown format version " +
                             std::to_string(version) + " (this build reads version " +
                             std::to_string(kVersion) + ")");
  }
  const std::int64_t gen = in.next("the generation");
  const std::int64_t count = in.next("the tensor count");
  // Counts and lengths that could never fit in kHeaderWords are corrupt;
  // plausible ones that overrun `words` are reported as truncation by Reader.
  // A tensor takes at least 4 words (dtype, ndim, name length, a name byte).
  constexpr std::size_t kMaxCount = (kHeaderWords - kFixedWords) / 4;
  if (count < 0 || static_cast<std::uint64_t>(count) > kMaxCount) {
    throw std::runtime_error("stage message header has an invalid tensor count " +
                             std::to_string(count) + " (at most " + std::to_string(kMaxCount) +
                             " fit in " + std::to_string(kHeaderWords) + " words)");
  }
  std::vector<TensorMeta> metas;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::string which = "tensor " + std::to_string(i);
    TensorMeta m;
    const std::int64_t dtype = in.next("the dtype of " + which);
    m.dtype = static_cast<int>(dtype);
    if (m.dtype != dtype) {
      throw std::runtime_error("stage message header: " + which + " has dtype " +
                               std::to_string(dtype) + ", outside the int range");
    }
    const std::int64_t ndim = in.next("the rank of " + which);
    if (ndim < 0 || static_cast<std::uint64_t>(ndim) > kHeaderWords) {
      throw std::runtime_error("stage message header: " + which + " has invalid rank " +
                               std::to_string(ndim));
    }
    for (std::int64_t d = 0; d < ndim; ++d) {
      const std::int64_t size = in.next("the shape of " + which);
      if (size < 0) {
        throw std::runtime_error("stage message header: " + which + " has negative size " +
                                 std::to_string(size) + " in dimension " + std::to_string(d));
      }
      m.shape.push_back(size);
    }
    const std::int64_t len = in.next("the name length of " + which);
    if (len < 1 || static_cast<std::uint64_t>(len) > kHeaderWords) {
      throw std::runtime_error("stage message header: " + which + " has invalid name length " +
                               std::to_string(len));
    }
    for (std::int64_t b = 0; b < len; ++b) {
      const std::int64_t byte = in.next("the name of " + which);
      if (byte < 0 || byte > 255) {
        throw std::runtime_error("stage message header: " + which + " has a name byte " +
                                 std::to_string(byte) + " outside 0..255");
      }
      m.name.push_back(static_cast<char>(byte));
    }
    metas.push_back(std::move(m));
  }
  if (generation != nullptr) *generation = gen;
  return metas;
}

std::int64_t numel(const TensorMeta& m) {
  std::int64_t n = 1;  // a 0-d tensor holds one element
  for (std::int64_t d : m.shape) n *= d;
  return n;
}

}  // namespace hp::pipeline
