#pragma once
// Datasets are pure functions of (split, step, sample index): any rank can
// compute any sample, every layout sees the same global batch, and a resumed
// run continues with exactly the data it would have seen.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "hp/model/activations.h"

namespace hp {

class Config;

enum class Split { kTrain, kValid };

/// Named inputs (what the first block reads) and named targets (what the
/// loss reads). Token datasets: inputs "tokens" and targets "labels" (the
/// next tokens), [batch, seq] int64. The field dataset: inputs and targets
/// "field", [batch, seq, channels] float.
struct Batch {
  Activations inputs;
  Activations targets;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::string describe() const = 0;
  /// Samples [first, first + count) of `step`, each of `seq` positions.
  virtual Batch make(Split split, std::int64_t step, std::int64_t first, std::int64_t count,
                     std::int64_t seq) const = 0;
  /// The document number of every position of those samples, [count, seq]
  /// int64, counted from 0 at each sample's first position (attention
  /// inside documents). Undefined when the dataset has no documents.
  virtual at::Tensor documents(Split split, std::int64_t step, std::int64_t first, std::int64_t count,
                               std::int64_t seq) const {
    (void)split, (void)step, (void)first, (void)count, (void)seq;
    return {};
  }
};

/// A dataset of byte or integer tokens, sample by sample.
class TokenDataset : public Dataset {
 public:
  /// Writes sample `index` of `step`: `seq` tokens and their `seq` targets.
  virtual void sample(Split split, std::int64_t step, std::int64_t index, std::int64_t* tokens,
                      std::int64_t* targets, std::int64_t seq) const = 0;
  Batch make(Split split, std::int64_t step, std::int64_t first, std::int64_t count,
             std::int64_t seq) const override;
};

/// Samples [first, first + count) of `step`.
Batch make_batch(const Dataset& ds, Split split, std::int64_t step, std::int64_t first,
                 std::int64_t count, std::int64_t seq);

/// The dataset `data.type` names (framework/data/registry.h). The text
/// corpus throws std::runtime_error naming the path when it is missing,
/// empty or too small for one sample.
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
