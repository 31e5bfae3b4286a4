#pragma once
// Dropout whose mask does not depend on the layout. A mask element is a pure
// function of (seed, step, global sample index, layer, position in the
// sequence, feature): no generator state, so data, tensor (with or without
// sequence parallel), pipeline (any schedule), expert parallel and
// recompute all draw the mask one process draws, and a resumed run draws
// the masks the uninterrupted run would have drawn.
//
// The executors say which micro-batch the thread is computing with a
// DropoutSiteGuard (the step and the global index of its first sample); a
// recomputed region replays under the site it was first run under. A
// dropout layer is keyed by its global name, so a layer applied twice in
// one forward draws the same mask twice: give each use its own layer.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hp/model/sequence_layout.h"

namespace hp {

/// Which micro-batch the current thread computes.
struct DropoutSite {
  std::int64_t step = 0;
  /// Global index (within the step's global batch) of the micro-batch's
  /// first sample; sample b of the micro-batch is first_sample + b.
  std::int64_t first_sample = 0;
  /// With `data.document_attention`: the document number of every position
  /// of every sample of the micro-batch, [samples, seq] int64 by global
  /// position (undefined otherwise). Attention reads it from here, so every
  /// executor, pipeline stage and recomputed region sees the micro-batch's
  /// documents as it sees its dropout site.
  at::Tensor documents;
};

/// The site of the current thread ({0, 0} when no executor set one).
DropoutSite current_dropout_site();

/// Sets the current thread's site for its lifetime, restores the previous.
class DropoutSiteGuard {
 public:
  explicit DropoutSiteGuard(DropoutSite site);
  ~DropoutSiteGuard();
  DropoutSiteGuard(const DropoutSiteGuard&) = delete;
  DropoutSiteGuard& operator=(const DropoutSiteGuard&) = delete;

 private:
  DropoutSite saved_;
};

/// A 64-bit FNV-1a hash of `s`, the same on every build and platform.
std::uint64_t stable_hash(const std::string& s);

/// Applies dropout with probability `p` to `x` ([samples, seq, features],
/// [samples, features], or any shape whose first dimension is the sample
/// and last the feature; the dimensions between are the sequence) at the
/// current site: kept elements are scaled by 1 / (1 - p), as at::dropout.
/// `seq_offset` is the global position of x's first sequence element (a
/// rank holding a slice of the sequence passes where its slice starts).
at::Tensor layout_free_dropout(const at::Tensor& x, double p, std::uint64_t seed,
                               std::uint64_t layer_key, std::int64_t seq_offset = 0);

/// Same for an x whose sequence positions are `pieces` of the global
/// sequence, in order (a rank holding several pieces, as context parallel's
/// balanced split): each piece draws the mask of its global positions.
at::Tensor layout_free_dropout(const at::Tensor& x, double p, std::uint64_t seed, std::uint64_t layer_key,
                               const std::vector<SeqPiece>& pieces);

/// The mask layout_free_dropout multiplies by (0 or 1 / (1 - p)), float,
/// shaped [samples, seq, features] for the given sizes; for tests.
at::Tensor layout_free_dropout_mask(std::int64_t samples, std::int64_t seq, std::int64_t features,
                                    double p, std::uint64_t seed, std::uint64_t layer_key,
                                    std::int64_t seq_offset, DropoutSite site);

}  // namespace hp
