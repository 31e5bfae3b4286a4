#include "backends/comm/slice.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace hp::dist {

std::pair<std::int64_t, std::int64_t> split_range(std::int64_t total, std::int64_t parts,
                                                  std::int64_t index) {
  const std::int64_t base = total / parts, extra = total % parts;
  const std::int64_t length = base + (index < extra ? 1 : 0);
  const std::int64_t offset = index * base + std::min(index, extra);
  return {offset, length};
}

Box range_box(const std::vector<std::int64_t>& global_shape, int dim, std::int64_t offset,
              std::int64_t length) {
  Box b{std::vector<std::int64_t>(global_shape.size(), 0), global_shape};
  if (dim >= 0) {
    b.offsets[static_cast<std::size_t>(dim)] = offset;
    b.lengths[static_cast<std::size_t>(dim)] = length;
  }
  return b;
}

Box slice_box(const std::vector<std::int64_t>& global_shape, int dim, std::int64_t parts,
              std::int64_t index) {
  if (dim < 0) return range_box(global_shape, -1, 0, 0);
  const auto [offset, length] =
      split_range(global_shape.at(static_cast<std::size_t>(dim)), parts, index);
  return range_box(global_shape, dim, offset, length);
}

at::Tensor slice_of(const at::Tensor& full, const Box& box) {
  at::Tensor out = full;
  for (std::size_t d = 0; d < box.offsets.size(); ++d) {
    if (box.offsets[d] != 0 || box.lengths[d] != full.size(static_cast<std::int64_t>(d))) {
      out = out.narrow(static_cast<std::int64_t>(d), box.offsets[d], box.lengths[d]);
    }
  }
  return out;
}

}  // namespace hp::dist
