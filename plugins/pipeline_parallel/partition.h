#pragma once
// Splitting a model's block list into contiguous pipeline chunks.
// No LibTorch here: pure logic, unit-tested on its own.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hp::pipeline {

/// A split of `blocks` blocks into contiguous chunks, in model order.
/// Chunk c holds blocks [first[c], first[c + 1]); first.size() == chunks + 1,
/// first.front() == 0, first.back() == blocks.
struct Partition {
  std::vector<int> first;
  std::vector<double> cost;  ///< summed cost of each chunk
  int chunks() const { return static_cast<int>(first.size()) - 1; }
  int chunk_size(int c) const { return first[c + 1] - first[c]; }
  double max_cost() const;
  /// "chunk 0: blocks 0-2 (cost 1.2e+06) | chunk 1: block 3 (cost 9.8e+05) | ..."
  /// (block ranges inclusive; costs with 3 significant digits).
  std::string describe() const;
};

/// Thrown for an impossible split; the message is a complete sentence naming
/// the numbers (used as the `rule` of a config error).
class PartitionError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Contiguous split of `costs` (one per block, each >= 0) into `chunks` non-empty
/// chunks minimising the costliest chunk (exact, by dynamic programming).
/// Ties between optimal splits: the most even one (least sum of squared chunk
/// costs), then the lexicographically smallest boundaries `first`, so earlier
/// chunks are never the heavier on a tie (e.g. 10 equal blocks into 4 chunks:
/// 2, 2, 3, 3 blocks).
/// Throws PartitionError when chunks > costs.size(), chunks < 1, or a cost is
/// negative or not finite.
Partition partition_balanced(const std::vector<double>& costs, int chunks);

/// Split by hand: counts[c] blocks in chunk c. Throws PartitionError when
/// counts.size() != chunks, when a count is < 1, when the counts don't add up
/// to costs.size() (checked in that order), or when a cost is negative or not
/// finite.
Partition partition_manual(const std::vector<double>& costs, const std::vector<int>& counts,
                           int chunks);

}  // namespace hp::pipeline
