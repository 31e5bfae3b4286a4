#pragma once
// Cutting a global tensor into the slices the ranks hold: along one
// dimension into `parts` nearly equal ranges (even, or the first
// `size % parts` one longer). The one rule for it: parameter
// initialisation, zero's cut and hp-ckpt's re-shard all use it.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace hp::dist {

/// [offset, length) of part `index` when `total` is split into `parts`
/// nearly equal pieces (the first `total % parts` pieces one longer).
std::pair<std::int64_t, std::int64_t> split_range(std::int64_t total, std::int64_t parts,
                                                  std::int64_t index);

/// A box of a global tensor: its offsets and lengths, one per dimension.
struct Box {
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> lengths;
};

/// `box` of `full` (a view of it).
at::Tensor slice_of(const at::Tensor& full, const Box& box);

}  // namespace hp::dist
