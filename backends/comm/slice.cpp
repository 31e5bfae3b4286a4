#include "hp/comm/slice.h"

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
