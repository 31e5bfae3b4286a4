#pragma once
// Who writes which slice of a checkpoint: the one writer-balancing rule,
// used by the sharded checkpoint IO (plugins/sharded_checkpoint) and by
// hp-ckpt convert. Every rank lists the slices it holds (a key naming the
// tensor and the box, and its bytes); a slice held by several ranks (its
// data-parallel or expert-data-parallel replicas) is written by exactly one
// of them. The plan is a pure function of every rank's list, so each rank
// computes the same plan from the same exchanged lists without a second
// round of messages.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hp::ckpt {

struct SliceDesc {
  /// "model:blocks.0.attn.qkv.weight@0,64/64,32": kind, global name,
  /// offsets and lengths; equal keys mean equal boxes of the same tensor.
  std::string key;
  std::uint64_t bytes = 0;
};

/// For every rank, the indices into its own list of the slices it writes.
/// Slices are taken largest first (then by key) and each goes to the
/// holder with the fewest bytes assigned so far (then the lowest rank), so
/// replicas share the writing and no rank writes much more than another
/// could. Throws std::invalid_argument when two ranks give one key
/// different sizes.
std::vector<std::vector<std::size_t>> plan_writers(const std::vector<std::vector<SliceDesc>>& by_rank);

/// "blocks.0.attn.qkv.weight@0,64/64,32": a key for the box of tensor `name`
/// at `offsets` with `lengths`.
std::string slice_key(const std::string& name, const std::vector<std::int64_t>& offsets,
                      const std::vector<std::int64_t>& lengths);

/// Bytes each rank writes under `plan`.
std::vector<std::uint64_t> bytes_per_rank(const std::vector<std::vector<SliceDesc>>& by_rank,
                                          const std::vector<std::vector<std::size_t>>& plan);

/// One rank's list as text (one "bytes<TAB>key" line per slice) and back,
/// for the exchange between ranks.
std::string encode_slices(const std::vector<SliceDesc>& slices);
std::vector<SliceDesc> decode_slices(const std::string& text);

}  // namespace hp::ckpt
