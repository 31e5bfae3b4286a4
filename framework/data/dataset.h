#pragma once
// Datasets are pure functions of (split, step, sample index): any rank can
// compute any sample, every layout sees the same global batch, and a resumed
// run continues with exactly the data it would have seen.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

namespace hp {

class Config;

enum class Split { kTrain, kValid };

struct Batch {
  at::Tensor tokens;   ///< [batch, seq] int64 (a field dataset: [batch, seq, channels] float)
  at::Tensor targets;  ///< [batch, seq] int64, the next token (a field: [batch, seq, channels])
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Writes sample `index` of `step` into row `row` of `out` (tokens and
  /// targets of length seq).
  virtual void sample(Split split, std::int64_t step, std::int64_t index, std::int64_t* tokens,
                      std::int64_t* targets, std::int64_t seq) const = 0;
  virtual std::string describe() const = 0;
  /// Samples [first, first + count) of `step`; by default row by row
  /// through sample(). Datasets of other tensors (fields) override it.
  virtual Batch make(Split split, std::int64_t step, std::int64_t first, std::int64_t count,
                     std::int64_t seq) const;
};

/// Samples [first, first + count) of `step`.
Batch make_batch(const Dataset& ds, Split split, std::int64_t step, std::int64_t first,
                 std::int64_t count, std::int64_t seq);

/// `data.type` text or synthetic. Throws std::runtime_error naming the path
/// when the corpus is missing, empty or too small for one sample.
std::shared_ptr<Dataset> make_dataset(const Config& config);

/// Byte-level text: a file, or every text file of a directory (sorted by
/// name; binary files such as fortune's .dat indexes and symlinks skipped).
std::shared_ptr<Dataset> make_text_dataset(const std::string& path, std::int64_t seq,
                                           double valid_fraction, std::uint64_t seed);

/// A learnable generated task: each sequence follows x[i+1] = (a * x[i] + c)
/// mod vocab from a random start, with (a, c) fixed by the seed.
std::shared_ptr<Dataset> make_synthetic_dataset(std::int64_t vocab, std::uint64_t seed);

/// A field-regression task: each sample is a smooth periodic field of
/// `channels` values at `seq` grid points (a sum of sines with phases drawn
/// from the sample's hash); the target mixes each point with its
/// neighbours through tanh, so the map is local, nonlinear and learnable.
std::shared_ptr<Dataset> make_field_dataset(std::int64_t channels, std::uint64_t seed);

/// splitmix64 of several words: the deterministic hash behind sample choice.
std::uint64_t mix(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0, std::uint64_t d = 0);

}  // namespace hp
